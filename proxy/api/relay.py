"""Relay: forward one request to a llama-server and its answer back, measuring as it passes."""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import aiohttp
from aiohttp import web

from proxy.api.errors import ApiError


@dataclass(frozen=True)
class RelayTimeouts:
    """How long the relay waits on a backend before answering 504 and cancelling upstream."""

    first_token_s: float
    idle_s: float
    whole_answer_s: float


CLIENT_GONE = "client disconnected"


@dataclass
class Measurement:
    """What the relay saw of one request: status, first-token time and llama.cpp's timings."""

    status: int = 0
    ttft_s: float | None = None
    duration_s: float = 0.0
    timings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    device_wait_s: float = 0.0
    # A stream's latest SSE line with timings, parsed once when the request ends: every chunk
    # carries running timings, and decoding each one would put JSON parsing in the relay loop.
    timings_event: bytes = b""

    def settle(self) -> None:
        """Parse the last timings a stream carried into `timings`."""
        line, self.timings_event = self.timings_event, b""
        try:
            event = json.loads(line[6:]) if line else None
        except ValueError:
            return
        timings = event.get("timings") if isinstance(event, dict) else None
        if isinstance(timings, dict) and timings:
            self.timings = timings


def _upstream_down(backend: str, exc: BaseException) -> ApiError:
    return ApiError(
        502,
        f"backend {backend!r} failed: {exc.__class__.__name__}: {exc}; "
        "retry, or pin another backend with `model`",
        code="upstream_error",
    )


def _timed_out(backend: str, what: str) -> ApiError:
    return ApiError(
        504,
        f"backend {backend!r} {what}; the request was cancelled. "
        "Retry with fewer max_tokens or a shorter prompt, or raise the timeout in the config",
        code="upstream_timeout",
    )


def _sse_error(message: str, code: str) -> bytes:
    payload = {"error": {"message": message, "type": "upstream_error", "code": code}}
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


async def relay(
    request: web.Request,
    session: aiohttp.ClientSession,
    backend: str,
    url: str,
    body: dict[str, Any],
    headers: Mapping[str, str],
    timeouts: RelayTimeouts,
    measured: Measurement,
) -> web.StreamResponse:
    """POST body to url and return the answer (SSE relayed chunk by chunk), filling `measured`.

    `measured` belongs to the caller, so what a stream measured survives its cancellation.
    """
    start = time.monotonic()
    stream = bool(body.get("stream"))
    wait = timeouts.first_token_s if stream else timeouts.whole_answer_s
    try:
        async with asyncio.timeout(wait):
            upstream = await session.post(url, json=body)
    except TimeoutError:
        raise _timed_out(backend, f"sent nothing within {wait:g} s") from None
    except aiohttp.ClientConnectorError as exc:
        raise ApiError(
            502, f"backend {backend!r} is unreachable: {exc}", code="backend_unreachable"
        ) from exc
    except aiohttp.ClientError as exc:
        raise _upstream_down(backend, exc) from exc
    response: web.StreamResponse
    try:
        measured.status = upstream.status
        if not stream or upstream.status != 200:
            remaining = timeouts.whole_answer_s - (time.monotonic() - start)
            response = await _relay_whole(
                upstream, headers, measured, backend, remaining, timeouts.whole_answer_s
            )
        else:
            response = await _relay_stream(
                request, upstream, headers, measured, start, backend, timeouts
            )
    finally:
        measured.duration_s = time.monotonic() - start
        measured.settle()
        # close(), not release(): a half-read answer must drop the connection, which is what
        # tells llama-server to stop generating and free the slot.
        upstream.close()
    return response


async def _relay_whole(
    upstream: aiohttp.ClientResponse,
    headers: Mapping[str, str],
    measured: Measurement,
    backend: str,
    remaining_s: float,
    limit_s: float,
) -> web.Response:
    try:
        async with asyncio.timeout(remaining_s):
            raw = await upstream.read()
    except TimeoutError:
        raise _timed_out(backend, f"did not finish within {limit_s:g} s") from None
    except aiohttp.ClientError as exc:
        raise _upstream_down(backend, exc) from exc
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    if isinstance(data, dict):
        measured.timings = data.get("timings") or {}
        if upstream.status >= 400:
            err = data.get("error")
            measured.error = err.get("message") if isinstance(err, dict) else str(err)
    return web.Response(
        status=upstream.status,
        body=raw,
        content_type=upstream.content_type or "application/json",
        headers=headers,
    )


async def _relay_stream(
    request: web.Request,
    upstream: aiohttp.ClientResponse,
    headers: Mapping[str, str],
    measured: Measurement,
    start: float,
    backend: str,
    timeouts: RelayTimeouts,
) -> web.StreamResponse:
    response = web.StreamResponse(
        status=200,
        headers={
            **headers,
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            # Tells nginx and similar not to buffer the stream.
            "X-Accel-Buffering": "no",
        },
    )
    await response.prepare(request)
    pending = b""
    try:
        while True:
            first = measured.ttft_s is None
            wait = timeouts.first_token_s if first else timeouts.idle_s
            try:
                async with asyncio.timeout(wait):
                    chunk = await upstream.content.readany()
            except TimeoutError:
                what = (
                    f"sent no token within {wait:g} s"
                    if first
                    else (f"stalled for {wait:g} s between tokens")
                )
                measured.status, measured.error = 504, what
                await response.write(
                    _sse_error(_timed_out(backend, what).message, "upstream_timeout")
                )
                break
            if not chunk:
                break
            if first:
                measured.ttft_s = time.monotonic() - start
            await response.write(chunk)
            pending = _scan_events(pending + chunk, measured)
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        measured.error = CLIENT_GONE
        return response
    except aiohttp.ClientError as exc:
        measured.error = f"{exc.__class__.__name__}: {exc}"
        measured.status = 502
        message = f"backend {backend!r} failed mid-stream: {exc}"
        try:
            await response.write(_sse_error(message, "upstream_error"))
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return response
    try:
        await response.write_eof()
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        measured.error = CLIENT_GONE
    return response


def _scan_events(buffer: bytes, measured: Measurement) -> bytes:
    """Keep the latest complete SSE line that carries timings; return the incomplete tail."""
    *lines, tail = buffer.split(b"\n")
    for line in reversed(lines):
        if line.startswith(b"data: {") and b'"timings"' in line:
            measured.timings_event = line
            break
    return tail
