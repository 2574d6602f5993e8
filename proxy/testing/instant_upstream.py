"""A stub of llama-server's HTTP side that answers at once: the overhead benchmark's upstream.

    .venv/bin/python -m proxy.testing.instant_upstream --port 9001 [--slow-port 9002]

It is a stub, not llama-server: no model, no tokens computed. It answers what a proxy in front of
llama-server asks, in the shapes of proxy/testing/llama_shapes.py: GET /health, /props, /slots,
/metrics, /v1/models and POST /v1/chat/completions, streamed (SSE `chat.completion.chunk`
events, the role-only one first and `timings` in the last, then `data: [DONE]`, in chunked
transfer encoding as llama-server sends them) or whole (a `chat.completion` with `usage` and
`timings`). On --port every answer is immediate; on --slow-port a stream sends its chunks
--slow-delay-ms apart, as a model decoding would, so many streams are open at once.

It is a bare asyncio protocol rather than the aiohttp double (proxy/testing/llama_double.py) so
that it costs next to nothing per request: whatever a proxy in front of it measures is the
proxy's. Of a `Behaviour` it honours what the answers report (tokens, timings, n_ctx, the role
chunk) and token_delay_s, the pacing; the faults are the double's. Answers are rendered once per
(model, shape) and reused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
from collections.abc import Callable
from functools import partial
from typing import Any

from proxy.testing import llama_shapes as shapes
from proxy.testing.llama_double import Behaviour

_REASONS = {200: "OK", 404: "Not Found", 400: "Bad Request", 405: "Method Not Allowed"}


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class InstantUpstream:
    """One port's behaviour, its answers rendered once, and the requests it holds and served."""

    def __init__(self, behaviour: Behaviour) -> None:
        self.behaviour = behaviour
        self.processing = 0
        self.answered = 0
        self.generated = 0
        self._cache: dict[tuple[Any, ...], Any] = {}

    def whole(self, model: str, n: int) -> bytes:
        """A non-streamed chat completion, as llama-server answers one."""
        key = ("whole", model, n)
        if key not in self._cache:
            answer = shapes.chat_whole(model, n, self.behaviour.timings(n), chat=True)
            self._cache[key] = _json(answer)
        body: bytes = self._cache[key]
        return body

    def events(self, model: str, n: int, usage: bool) -> list[bytes]:
        """A streamed chat completion's SSE events (`data: ...\\n\\n`), [DONE] last."""
        key = ("events", model, n, usage)
        if key not in self._cache:
            b = self.behaviour
            events = shapes.chat_events(
                model, n, b.timings, chat=True, role=b.role_chunk, with_usage=usage
            )
            lines = [b"data: " + _json(e) + b"\n\n" for e in events]
            self._cache[key] = [*lines, b"data: [DONE]\n\n"]
        rendered: list[bytes] = self._cache[key]
        return rendered

    def gets(self) -> dict[str, Callable[[], bytes]]:
        n_ctx = self.behaviour.n_ctx
        return {
            "/health": lambda: b'{"status":"ok"}',
            "/props": lambda: _json(shapes.props(n_ctx)),
            "/slots": lambda: _json(shapes.slots(self.processing, n_ctx, False)),
            "/v1/models": lambda: _json(shapes.models(n_ctx)),
            "/models": lambda: _json(shapes.models(n_ctx)),
        }

    def metrics(self) -> bytes:
        return shapes.metrics(self.processing, self.answered, self.generated).encode()


class _Connection(asyncio.Protocol):
    """One client connection: HTTP/1.1 with keep-alive, requests answered in order."""

    def __init__(self, upstream: InstantUpstream) -> None:
        self.upstream = upstream
        self.gets = upstream.gets()
        self.buf = bytearray()
        self.transport: asyncio.Transport | None = None
        self.streaming: asyncio.TimerHandle | None = None
        self.busy = False
        self.close_after = False

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        assert isinstance(transport, asyncio.Transport)
        self.transport = transport

    def connection_lost(self, exc: Exception | None) -> None:
        if self.streaming is not None:
            self.streaming.cancel()
            self.streaming = None
        if self.busy:
            self.busy = False
            self.upstream.processing -= 1
        self.transport = None

    def data_received(self, data: bytes) -> None:
        self.buf += data
        self._next()

    def _next(self) -> None:
        while not self.busy and self.transport is not None:
            end = self.buf.find(b"\r\n\r\n")
            if end < 0:
                return
            lines = bytes(self.buf[:end]).decode("latin-1").split("\r\n")
            try:
                method, target, version = lines[0].split(" ", 2)
            except ValueError:
                self._error(400, "bad request line", "invalid_request_error")
                self.transport.close()
                return
            headers = {}
            for line in lines[1:]:
                name, _, value = line.partition(":")
                headers[name.strip().lower()] = value.strip()
            length = int(headers.get("content-length") or 0)
            if len(self.buf) < end + 4 + length:
                return
            body = bytes(self.buf[end + 4 : end + 4 + length])
            del self.buf[: end + 4 + length]
            connection = headers.get("connection", "").lower()
            self.close_after = connection == "close" or (
                version == "HTTP/1.0" and connection != "keep-alive"
            )
            self._handle(method, target.split("?", 1)[0], body)

    def _answer(self, status: int, body: bytes, content_type: str = "application/json") -> None:
        assert self.transport is not None
        head = (
            f"HTTP/1.1 {status} {_REASONS.get(status, 'Error')}\r\n"
            f"Content-Type: {content_type}; charset=utf-8\r\n"
            f"Content-Length: {len(body)}\r\n"
            "Server: llama.cpp\r\n"
            f"Connection: {'close' if self.close_after else 'keep-alive'}\r\n\r\n"
        )
        self.transport.write(head.encode() + body)
        if self.close_after:
            self.transport.close()

    def _error(self, status: int, message: str, kind: str) -> None:
        self._answer(status, _json(shapes.error(status, message, kind)))

    def _handle(self, method: str, path: str, body: bytes) -> None:
        if method == "GET" and path in self.gets:
            self._answer(200, self.gets[path]())
        elif method == "GET" and path == "/metrics":
            self._answer(200, self.upstream.metrics(), "text/plain; version=0.0.4")
        elif method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            self._complete(body)
        elif method == "POST" and path == "/v1/chat/completions/input_tokens":
            self._answer(200, _json({"input_tokens": shapes.PROMPT_N + len(body) // 4}))
        else:
            self._error(404, "File Not Found", "not_found_error")

    def _complete(self, raw: bytes) -> None:
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            self._error(400, "invalid JSON body", "invalid_request_error")
            return
        upstream = self.upstream
        model = shapes.model_of(body)
        n = shapes.limited(body, upstream.behaviour.tokens)
        upstream.answered += 1
        upstream.generated += n
        if not body.get("stream"):
            self._answer(200, upstream.whole(model, n))
            return
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = upstream.events(model, n, usage)
        assert self.transport is not None
        head = (
            "HTTP/1.1 200 OK\r\n"
            "Content-Type: text/event-stream\r\n"
            "Transfer-Encoding: chunked\r\n"
            "Server: llama.cpp\r\n"
            "Access-Control-Allow-Origin: *\r\n"
            f"Connection: {'close' if self.close_after else 'keep-alive'}\r\n\r\n"
        ).encode()
        if not upstream.behaviour.token_delay_s:
            self.transport.write(head + b"".join(_chunked(e) for e in events) + b"0\r\n\r\n")
            if self.close_after:
                self.transport.close()
            return
        self.busy = True
        upstream.processing += 1
        self.transport.write(head + _chunked(events[0]))
        # The closing events (the one with `timings`, usage, [DONE]) start after the tokens.
        closing = n + (1 if upstream.behaviour.role_chunk else 0)
        self._send_later(events, 1, closing)

    def _send_later(self, events: list[bytes], i: int, closing: int) -> None:
        loop = asyncio.get_running_loop()
        delay = self.upstream.behaviour.token_delay_s
        self.streaming = loop.call_later(delay, self._send, events, i, closing)

    def _send(self, events: list[bytes], i: int, closing: int) -> None:
        """Chunk i, one per delay; the closing events follow the last token chunk at once."""
        self.streaming = None
        if self.transport is None:
            return
        if i + 1 < closing:
            self.transport.write(_chunked(events[i]))
            self._send_later(events, i + 1, closing)
            return
        self.transport.write(b"".join(_chunked(e) for e in events[i:]) + b"0\r\n\r\n")
        self.busy = False
        self.upstream.processing -= 1
        if self.close_after:
            self.transport.close()
            return
        self._next()


async def serve(host: str, upstreams: dict[int, InstantUpstream]) -> None:
    """Serve each upstream on its port until SIGINT or SIGTERM."""
    loop = asyncio.get_running_loop()
    servers = [
        await loop.create_server(partial(_Connection, upstream), host, port, backlog=8192)
        for port, upstream in upstreams.items()
    ]
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ports = ", ".join(str(s.sockets[0].getsockname()[1]) for s in servers)
    print(f"instant upstream (a stub, not llama-server) listening on {host}: {ports}", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="instant answers")
    parser.add_argument("--slow-port", type=int, help="streams paced --slow-delay-ms apart")
    parser.add_argument("--tokens", type=int, default=8, help="tokens of an instant answer")
    parser.add_argument("--slow-chunks", type=int, default=20, help="tokens of a slow stream")
    parser.add_argument("--slow-delay-ms", type=float, default=50.0)
    parser.add_argument("--cpus", help="CPU ids to run on, e.g. 0 or 0,1")
    args = parser.parse_args(argv)
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    # What llama-server sends (a role-only chunk first), timed as 1,000 tokens/s.
    instant = Behaviour(tokens=args.tokens, tokens_per_s=1000.0, role_chunk=True)
    upstreams = {args.port: InstantUpstream(instant)}
    if args.slow_port is not None:
        slow = Behaviour(
            tokens=args.slow_chunks,
            token_delay_s=args.slow_delay_ms / 1000,
            tokens_per_s=1000.0,
            role_chunk=True,
        )
        upstreams[args.slow_port] = InstantUpstream(slow)
    asyncio.run(serve(args.host, upstreams))


if __name__ == "__main__":
    main()
