"""The overhead benchmark's load client: bare HTTP/1.1 keep-alive connections, closed-loop
clients and many concurrent streams, each measured by when its answers end."""

from __future__ import annotations

import asyncio
import json
import socket
import time
from typing import Any


class HttpConnection(asyncio.Protocol):
    """A bare HTTP/1.1 keep-alive client connection: one request at a time, answers parsed
    just enough (Content-Length or chunked) to know when each ends. Cheaper per request than
    aiohttp's client, so the direct figure measures the stub and not the client."""

    def __init__(self) -> None:
        self.transport: asyncio.Transport | None = None
        self.buf = bytearray()
        self.closed = False
        self.must_close = False
        self._done: asyncio.Future[tuple[int, bytes]] | None = None
        self._reset()

    def _reset(self) -> None:
        self.status: int | None = None
        self.length: int | None = None
        self.chunked = False
        self.body = bytearray()

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        done = self._done
        if done is not None and not done.done():
            if self.status is not None and self.length is None and not self.chunked:
                done.set_result((self.status, bytes(self.body + self.buf)))  # read to close
            else:
                done.set_exception(ConnectionError(f"connection lost: {exc}"))

    def data_received(self, data: bytes) -> None:
        self.buf += data
        try:
            self._parse()
        except ValueError as exc:
            if self._done is not None and not self._done.done():
                self._done.set_exception(exc)
            if self.transport is not None:
                self.transport.close()

    def _parse(self) -> None:
        buf = self.buf
        if self.status is None:
            end = buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(buf[:end]).decode("latin-1").split("\r\n")
            self.status = int(lines[0].split(" ", 2)[1])
            for line in lines[1:]:
                name, _, value = line.partition(":")
                name, value = name.strip().lower(), value.strip().lower()
                if name == "content-length":
                    self.length = int(value)
                elif name == "transfer-encoding" and "chunked" in value:
                    self.chunked = True
                elif name == "connection" and value == "close":
                    self.must_close = True
            del buf[: end + 4]
        if self.length is not None:
            if len(buf) >= self.length:
                body = bytes(buf[: self.length])
                del buf[: self.length]
                self._finish(body)
            return
        if not self.chunked:
            self.body += buf
            buf.clear()
            return  # the body runs to the connection's close
        pos = 0
        while True:
            eol = buf.find(b"\r\n", pos)
            if eol < 0:
                break
            size = int(bytes(buf[pos:eol]).split(b";")[0], 16)
            if size == 0:
                if len(buf) < eol + 4:
                    break
                del buf[: eol + 4]
                self._finish(bytes(self.body))
                return
            if len(buf) < eol + 2 + size + 2:
                break
            self.body += buf[eol + 2 : eol + 2 + size]
            pos = eol + 2 + size + 2
        del buf[:pos]

    def _finish(self, body: bytes) -> None:
        status = self.status or 0
        self._reset()
        if self._done is not None and not self._done.done():
            self._done.set_result((status, body))

    async def request(self, payload: bytes) -> tuple[int, bytes]:
        """Send one request; its status and body (de-chunked)."""
        if self.closed or self.transport is None:
            raise ConnectionError("connection closed")
        self._done = asyncio.get_running_loop().create_future()
        self.transport.write(payload)
        return await self._done

    def close(self) -> None:
        if self.transport is not None:
            self.transport.close()


async def connect(host: str, port: int) -> HttpConnection:
    loop = asyncio.get_running_loop()
    _, conn = await loop.create_connection(HttpConnection, host, port)
    sock = conn.transport.get_extra_info("socket") if conn.transport else None
    if sock is not None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return conn


def request_bytes(host: str, port: int, path: str, body: dict[str, Any]) -> bytes:
    data = json.dumps(body).encode()
    head = (
        f"POST {path} HTTP/1.1\r\n"
        f"Host: {host}:{port}\r\n"
        "Content-Type: application/json\r\n"
        "Accept: */*\r\n"
        "Authorization: Bearer sk-overhead-benchmark\r\n"
        f"Content-Length: {len(data)}\r\n\r\n"
    )
    return head.encode() + data


def answered(stream: bool, status: int, body: bytes) -> bool:
    """Whether the answer is a whole, successful completion of the shape asked for."""
    if status != 200:
        return False
    if stream:
        return body.rstrip().endswith(b"data: [DONE]") and b'"choices"' in body
    return body.startswith(b"{") and b'"choices"' in body


def percentile(values: list[float], q: float) -> float:
    """The q-th percentile (0-100) by linear interpolation; nan for no values."""
    if not values:
        return float("nan")
    ordered = sorted(values)
    rank = (len(ordered) - 1) * q / 100
    low = int(rank)
    high = min(low + 1, len(ordered) - 1)
    return ordered[low] + (ordered[high] - ordered[low]) * (rank - low)


async def closed_loop(
    host: str,
    port: int,
    payload: bytes,
    stream: bool,
    clients: int,
    warmup_s: float,
    seconds: float,
    timeout_s: float,
) -> dict[str, Any]:
    """`clients` loops of request-answer on their own connections; what finished in the window."""
    start = time.perf_counter() + warmup_s
    end = start + seconds
    latencies: list[float] = []
    errors: list[str] = []

    async def loop() -> None:
        conn: HttpConnection | None = None
        try:
            while time.perf_counter() < end:
                try:
                    if conn is None or conn.closed:
                        conn = await asyncio.wait_for(connect(host, port), timeout_s)
                    sent = time.perf_counter()
                    status, body = await asyncio.wait_for(conn.request(payload), timeout_s)
                    got = time.perf_counter()
                    if conn.must_close:
                        conn.close()
                        conn = None
                    if not start <= got <= end:
                        continue
                    if answered(stream, status, body):
                        latencies.append(got - sent)
                    else:
                        errors.append(f"{status}: {body[:200]!r}")
                except (OSError, TimeoutError, ValueError) as exc:
                    if start <= time.perf_counter() <= end:
                        errors.append(f"{exc.__class__.__name__}: {exc}")
                    if conn is not None:
                        conn.close()
                    conn = None
                    await asyncio.sleep(0.01)
        finally:
            if conn is not None:
                conn.close()

    await asyncio.gather(*(loop() for _ in range(clients)))
    return {
        "completed": len(latencies),
        "errors": len(errors),
        "first_errors": errors[:3],
        "rps": len(latencies) / seconds,
        "p50_ms": 1000 * percentile(latencies, 50),
        "p99_ms": 1000 * percentile(latencies, 99),
    }


async def many_streams(
    host: str, port: int, payload: bytes, count: int, connecting: int, timeout_s: float
) -> dict[str, Any]:
    """`count` streams at once, each on its own connection: the connections are opened first
    (at most `connecting` at a time, so a listen backlog never drops one), then every request
    is sent in one go; how many streams finished, and when, from the first request sent."""
    gate = asyncio.Semaphore(connecting)
    durations: list[float] = []
    errors: list[str] = []
    open_now = 0
    peak_open = 0
    ended = 0.0

    async def opened() -> HttpConnection | None:
        try:
            async with gate:
                return await asyncio.wait_for(connect(host, port), timeout_s)
        except (OSError, TimeoutError) as exc:
            errors.append(f"connect: {exc.__class__.__name__}: {exc}")
            return None

    async def one(conn: HttpConnection) -> None:
        nonlocal open_now, peak_open, ended
        try:
            sent = time.perf_counter()
            open_now += 1
            peak_open = max(peak_open, open_now)
            try:
                status, body = await asyncio.wait_for(conn.request(payload), timeout_s)
            finally:
                open_now -= 1
            got = time.perf_counter()
            ended = max(ended, got)
            if answered(True, status, body):
                durations.append(got - sent)
            else:
                errors.append(f"{status}: {body[:200]!r}")
        except (OSError, TimeoutError, ValueError) as exc:
            errors.append(f"{exc.__class__.__name__}: {exc}")
        finally:
            conn.close()

    connecting_since = time.perf_counter()
    conns = [c for c in await asyncio.gather(*(opened() for _ in range(count))) if c]
    began = time.perf_counter()
    await asyncio.gather(*(one(c) for c in conns))
    return {
        "completed": len(durations),
        "errors": len(errors),
        "first_errors": sorted(set(errors))[:3],
        "peak_open": peak_open,
        "connect_s": began - connecting_since,
        "wall_s": (ended or time.perf_counter()) - began,
        "p50_s": percentile(durations, 50),
        "p99_s": percentile(durations, 99),
    }
