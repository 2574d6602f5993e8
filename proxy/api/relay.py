"""Relay: forward one request to a llama-server and its answer back, measuring as it passes."""

from __future__ import annotations

import asyncio
import contextlib
import json
import time
from collections.abc import Awaitable, Callable, Mapping
from dataclasses import dataclass
from typing import Any, TypeVar

import aiohttp
from aiohttp import web

from proxy.api import anthropic
from proxy.api.assemble import AnswerAssembler, AnswerKind
from proxy.api.call_repair import REPAIRED_HEADER, CallRepair
from proxy.api.errors import ApiError, from_upstream
from proxy.api.openai_stream import PlainStream
from proxy.api.progress import Patience, ProgressWatch
from proxy.api.rewrite import StreamRewriter
from proxy.measurement import CLIENT_GONE, Measurement
from proxy.sse import SseSplitter, data_of
from proxy.tokens import StreamTally, counts_of

T = TypeVar("T")


@dataclass
class _ConnectionUse:
    """Whether a request went out on a connection taken from the pool."""

    reused: bool = False


async def _mark_reused(
    _session: aiohttp.ClientSession, ctx: Any, _params: aiohttp.TraceConnectionReuseconnParams
) -> None:
    if isinstance(ctx.trace_request_ctx, _ConnectionUse):
        ctx.trace_request_ctx.reused = True


def connection_reuse_trace() -> aiohttp.TraceConfig:
    """The trace a pooling session needs so the relay can tell a reused connection's failure."""
    trace = aiohttp.TraceConfig()
    trace.on_connection_reuseconn.append(_mark_reused)
    return trace


class BoundedConnector(aiohttp.TCPConnector):
    """Opens at most `connects` connections at once; the others wait their turn.

    Thousands of requests arriving together would otherwise all race for the upstream's accept
    queue, and those it drops fail on the connect timeout (502s) though the server is fine.
    Only the opening is bounded: open connections, and requests on them, are not.
    """

    def __init__(self, connects: int, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self._connects = asyncio.Semaphore(connects)

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        async with self._connects:
            return await super()._create_connection(req, traces, timeout)


@dataclass(frozen=True)
class UpstreamSessions:
    """The sessions requests leave on: `pooled` keeps connections where the server does;
    `fresh` opens one per request (servers that close after a stream, and the retry)."""

    pooled: aiohttp.ClientSession
    fresh: aiohttp.ClientSession

    async def post(self, url: str, body: Mapping[str, Any], reuse: bool) -> aiohttp.ClientResponse:
        """POST body to url; a pooled connection the server closed while idle fails before any
        answer arrives, and only then is the request sent once more, on a new connection."""
        if not reuse:
            return await self.fresh.post(url, json=body)
        use = _ConnectionUse()
        try:
            return await self.pooled.post(url, json=body, trace_request_ctx=use)
        except (aiohttp.ServerDisconnectedError, aiohttp.ClientOSError):
            if not use.reused:
                raise
        return await self.fresh.post(url, json=body)


@dataclass(frozen=True)
class RelayTimeouts:
    """How long the relay waits on a backend before answering 504 and cancelling upstream: while
    it progresses, up to the caps (None: none); `stall_s` without progress; `idle_s` between a
    stream's tokens."""

    first_token_s: float | None
    idle_s: float
    whole_answer_s: float | None
    stall_s: float = 60.0


def _upstream_down(backend: str, exc: BaseException) -> ApiError:
    return ApiError(
        502,
        f"backend {backend!r} failed: {exc.__class__.__name__}: {exc}; "
        "retry, or pin another backend with `model`",
        code="upstream_error",
    )


def _malformed(backend: str, line: bytes) -> ApiError:
    return ApiError(
        502,
        f"backend {backend!r} sent an event that is not JSON ({line[:80]!r}); the request "
        "was ended, the backend stays in service: retry",
        code="upstream_error",
    )


def _timed_out(backend: str, what: str) -> ApiError:
    return ApiError(
        504,
        f"backend {backend!r} {what}; the request was cancelled. Retry; if it happens again, "
        "GET /health shows the backend's state, and the config's stall_timeout_s (no "
        "progress), idle_timeout_s (between tokens) and caps set how long the proxy waits",
        code="upstream_timeout",
    )


@dataclass(frozen=True)
class Wire:
    """How one surface's answers travel: its error shape and the rewriting its events need."""

    anthropic_errors: bool = False
    # Makes the rewriter of one stream, given the body sent upstream: it also ends the stream
    # the way its API ends one, an error included.
    rewriter: Callable[[Mapping[str, Any]], StreamRewriter] = lambda body: PlainStream()
    # Tokenizing and templating depend on the input alone: when llama-server throws on one
    # (a token id beyond the vocabulary is its 500), the request is what is wrong.
    input_faults_are_400: bool = False
    # OpenAI answers the proxy assembles from a stream when the client asked for a whole one,
    # so a client that leaves stops generation (see proxy.api.assemble).
    assemble: AnswerKind | None = None


OPENAI_WIRE = Wire()


@dataclass(frozen=True)
class UpstreamCall:
    """One request to one llama-server, as the relay sends it."""

    url: str
    backend: str  # by name, for the errors it answers
    body: dict[str, Any]
    headers: Mapping[str, str]  # the answer's, towards the client
    timeouts: RelayTimeouts
    wire: Wire = OPENAI_WIRE
    # The server keeps connections after its answers (specproxy's build).
    reuse: bool = False
    # Makes tool calls the model wrote as text into calls; None: the answer passes as it is.
    repair: CallRepair | None = None
    # Sees whether the server progresses, so a wait on it is cut on progress, not the clock.
    watch: ProgressWatch | None = None


async def relay(
    request: web.Request | None,
    sessions: UpstreamSessions,
    call: UpstreamCall,
    measured: Measurement,
) -> web.StreamResponse:
    """Send the call and return its answer (SSE relayed chunk by chunk), filling `measured`.

    `measured` is the caller's, so what a stream measured survives its cancellation; only the
    relay writes it. Without a client `request` (the proxy's own requests), the answer is read
    whole. Every wait on the backend goes on while it progresses (proxy.api.progress).
    """
    start = time.monotonic()
    try:
        return await _relay(request, sessions, call, measured)
    finally:
        # The request's real duration, also when it failed before any answer came.
        measured.duration_s = time.monotonic() - start
        if call.repair is not None:
            measured.repaired_calls = call.repair.repaired


async def _relay(
    request: web.Request | None,
    sessions: UpstreamSessions,
    call: UpstreamCall,
    measured: Measurement,
) -> web.StreamResponse:
    start = time.monotonic()
    backend, timeouts, wire = call.backend, call.timeouts, call.wire
    body = call.body
    stream = bool(body.get("stream"))
    if stream and request is None:
        raise ValueError("a streamed answer needs the client's request to stream to")
    assemble = None if stream else wire.assemble
    if assemble is not None:
        body = {
            **body,
            "stream": True,
            "stream_options": {"include_usage": True},
            "timings_per_token": True,
        }
    cap = timeouts.first_token_s if stream else timeouts.whole_answer_s
    patience = Patience(call.watch, timeouts.stall_s, cap)
    try:
        upstream = await measured.waiting(
            _patiently(sessions.post(call.url, body, call.reuse), patience)
        )
    except aiohttp.ConnectionTimeoutError as exc:
        # Before TimeoutError, which it is too: nothing was sent, so another backend may serve;
        # a server that accepts no connection in time is as down as one that refuses them.
        measured.connection_lost = True
        raise ApiError(
            502,
            f"backend {backend!r} did not accept a connection in time ({exc}); it may be "
            "overloaded, or raise connect_timeout_s in the config",
            code="backend_unreachable",
        ) from exc
    except _Cut as cut:
        measured.status, measured.error = 504, f"sent nothing: {cut.why}"
        raise _timed_out(backend, f"sent nothing and {cut.why}") from None
    except aiohttp.ClientConnectorError as exc:
        measured.connection_lost = True
        raise ApiError(
            502, f"backend {backend!r} is unreachable: {exc}", code="backend_unreachable"
        ) from exc
    except aiohttp.ClientError as exc:
        measured.connection_lost = True
        raise _upstream_down(backend, exc) from exc
    response: web.StreamResponse
    try:
        measured.status = upstream.status
        if assemble is not None and upstream.status == 200:
            response = await _relay_assembled(call, upstream, measured, patience, assemble)
        elif request is None or not stream or upstream.status != 200:
            response = await _relay_whole(call, upstream, measured, patience)
        else:
            response = await _relay_stream(request, call, upstream, measured, start, patience)
    except asyncio.CancelledError:
        if not measured.answered:
            measured.error = measured.error or CLIENT_GONE
        raise
    finally:
        if measured.tally is not None:
            _drain(upstream, measured.tally)
        measured.settle()
        # close(), not release(): a half-read answer must drop the connection, which is what
        # tells llama-server to stop generating and free the slot.
        upstream.close()
    return response


class _Cut(Exception):
    """A wait on the backend given up: it made no progress, or reached its cap."""

    def __init__(self, why: str) -> None:
        super().__init__(why)
        self.why = why


async def _patiently(step: Awaitable[T], patience: Patience) -> T:
    """The step's result, waited for while the backend progresses; _Cut when it stops."""
    task = asyncio.ensure_future(step)
    try:
        while True:
            done, _ = await asyncio.wait({task}, timeout=patience.window())
            if done:
                return task.result()
            why = await patience.cut()
            if why is not None:
                raise _Cut(why)
    finally:
        if not task.done():
            task.cancel()
            with contextlib.suppress(asyncio.CancelledError, Exception):
                await task


def _progresses(chunk: bytes) -> bool:
    """Whether a chunk shows the backend progressing: anything but a `:` keep-alive comment,
    which llama-server sends on a timer whether or not it gets anywhere."""
    return not chunk.startswith(b":")


async def _read(
    upstream: aiohttp.ClientResponse,
    patience: Patience,
    progresses: Callable[[bytes], bool] = lambda chunk: True,
) -> bytes:
    """The next chunk of the answer, waited for while the backend progresses."""
    while True:
        try:
            async with asyncio.timeout(patience.window()):
                chunk = await upstream.content.readany()
        except TimeoutError:
            why = await patience.cut()
            if why is not None:
                raise _Cut(why) from None
            continue
        if progresses(chunk):
            patience.heard()
        return chunk


def _keeps_alive(chunk: bytes) -> bool:
    """Whether a chunk only keeps the stream alive: llama-server's `:` ping, or the progress of
    prompt processing it sends when asked (`return_progress`)."""
    return chunk.startswith(b":") or b'"prompt_progress"' in chunk


def _drain(upstream: aiohttp.ClientResponse, tally: StreamTally) -> None:
    """Count what already arrived of a stream its client left: the backend generated it."""
    # A reader still waiting, or a connection that already failed, leaves nothing to count.
    with contextlib.suppress(RuntimeError, aiohttp.ClientError, OSError):
        tally.scan(upstream.content.read_nowait())


async def _relay_whole(
    call: UpstreamCall,
    upstream: aiohttp.ClientResponse,
    measured: Measurement,
    patience: Patience,
) -> web.Response:
    backend, wire = call.backend, call.wire
    try:
        raw = await measured.waiting(_patiently(upstream.read(), patience))
    except _Cut as cut:
        raise _timed_out(backend, cut.why) from None
    except aiohttp.ClientError as exc:
        measured.connection_lost = True
        raise _upstream_down(backend, exc) from exc
    try:
        data = json.loads(raw)
    except ValueError:
        data = None
    measured.timings = counts_of(data)
    status = upstream.status
    headers = call.headers
    if call.repair is not None and status == 200 and isinstance(data, dict):
        call.repair.whole(data)
        if call.repair.repaired:
            raw = json.dumps(data, ensure_ascii=False).encode()
            headers = {**headers, REPAIRED_HEADER: str(call.repair.repaired)}
    if status >= 400:
        measured.error = from_upstream(data, status, raw).message
        if status == 500 and wire.input_faults_are_400:
            status = measured.status = 400
            message = f"backend {backend!r} could not process this input: {measured.error}"
            raw = json.dumps(ApiError(400, message, code="invalid_input").payload()).encode()
        if wire.anthropic_errors:
            raw = anthropic.from_upstream(status, raw)
    return web.Response(
        status=status,
        body=raw,
        content_type=upstream.content_type or "application/json",
        headers=headers,
    )


async def _relay_assembled(
    call: UpstreamCall,
    upstream: aiohttp.ClientResponse,
    measured: Measurement,
    patience: Patience,
    kind: AnswerKind,
) -> web.Response:
    """Read a stream to its end and answer it whole, as llama-server would have."""
    backend, headers = call.backend, call.headers
    assembler = AnswerAssembler(kind)
    tally = measured.tally = StreamTally()
    lines = SseSplitter()
    try:
        while chunk := await measured.waiting(_read(upstream, patience)):
            tally.scan(chunk)
            for line in lines.feed(chunk):
                event = data_of(line)
                if event is None and line.startswith(b"data: {"):
                    measured.status = 502
                    raise _malformed(backend, line)
                if isinstance(event, dict) and "error" in event:
                    # An error after the stream began: the whole answer is that error.
                    measured.status = 500
                    measured.error = from_upstream(event).message
                    return web.json_response({"error": event["error"]}, status=500, headers=headers)
                if isinstance(event, dict):
                    assembler.feed(event)
    except _Cut as cut:
        raise _timed_out(backend, cut.why) from None
    except aiohttp.ClientError as exc:
        measured.connection_lost = True
        raise _upstream_down(backend, exc) from exc
    answer = assembler.answer()
    measured.tally = None
    measured.timings = counts_of(answer)
    if call.repair is not None:
        answer = call.repair.whole(answer)
        if call.repair.repaired:
            headers = {**headers, REPAIRED_HEADER: str(call.repair.repaired)}
    return web.json_response(answer, headers=headers)


async def _relay_stream(
    request: web.Request,
    call: UpstreamCall,
    upstream: aiohttp.ClientResponse,
    measured: Measurement,
    start: float,
    patience: Patience,
) -> web.StreamResponse:
    response = web.StreamResponse(
        status=200,
        headers={
            **call.headers,
            "Content-Type": "text/event-stream",
            "Cache-Control": "no-cache",
            # Tells nginx and similar not to buffer the stream.
            "X-Accel-Buffering": "no",
        },
    )
    await measured.waiting(response.prepare(request))
    measured.tally = StreamTally()
    rewriter = call.wire.rewriter(call.body)
    if call.repair is not None:
        rewriter = call.repair.stream(rewriter)
    try:
        return await _pump(call, upstream, response, measured, start, patience, rewriter)
    finally:
        measured.answered = rewriter.ended


async def _pump(
    call: UpstreamCall,
    upstream: aiohttp.ClientResponse,
    response: web.StreamResponse,
    measured: Measurement,
    start: float,
    patience: Patience,
    rewriter: StreamRewriter,
) -> web.StreamResponse:
    """Relay the stream's chunks until it ends, fails, stalls or its client leaves.

    Before the first token the wait goes on while the backend progresses (its prompt steps);
    a `:` keep-alive is no progress, since a stuck server still sends them. Between tokens,
    idle_s is the limit."""
    backend, timeouts = call.backend, call.timeouts
    tally = measured.tally
    assert tally is not None
    tokens = False  # whether a token (not a keep-alive, not prompt progress) came yet
    try:
        while True:
            try:
                if tokens:
                    async with asyncio.timeout(timeouts.idle_s):
                        chunk = await measured.waiting(upstream.content.readany())
                else:
                    chunk = await measured.waiting(_read(upstream, patience, _progresses))
            except (TimeoutError, _Cut) as exc:
                what = (
                    f"sent no token and {exc.why}"
                    if isinstance(exc, _Cut)
                    else f"stalled for {timeouts.idle_s:g} s between tokens"
                )
                measured.status, measured.error = 504, what
                await measured.waiting(response.write(rewriter.fail(_timed_out(backend, what))))
                break
            if not chunk:
                rest = rewriter.flush()
                if rest:
                    await measured.waiting(response.write(rest))
                break
            # Pings and prompt progress come while the prompt is processed: not a token.
            if not tokens and not _keeps_alive(chunk):
                tokens = True
                measured.ttft_s = time.monotonic() - start
            # Counted before it is written: a client that leaves now still leaves it generated.
            tally.scan(chunk)
            if tally.malformed is not None:
                bad = _malformed(backend, tally.malformed)
                measured.status, measured.error = 502, bad.message
                await measured.waiting(response.write(rewriter.fail(bad)))
                break
            out = rewriter.feed(chunk)
            if out:
                await measured.waiting(response.write(out))
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        # Codex closes the connection as soon as response.completed arrives.
        measured.error = None if rewriter.ended else CLIENT_GONE
        return response
    except aiohttp.ClientError as exc:
        measured.error = f"{exc.__class__.__name__}: {exc}"
        measured.status = 502
        measured.connection_lost = True
        failed = ApiError(502, f"backend {backend!r} failed mid-stream: {exc}", "upstream_error")
        try:
            await measured.waiting(response.write(rewriter.fail(failed)))
        except (ConnectionResetError, aiohttp.ClientConnectionResetError):
            return response
    try:
        await measured.waiting(response.write_eof())
    except (ConnectionResetError, aiohttp.ClientConnectionResetError):
        measured.error = measured.error or (None if rewriter.ended else CLIENT_GONE)
    return response
