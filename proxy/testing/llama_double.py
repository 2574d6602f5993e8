"""LlamaServerDouble: a stub of llama-server's HTTP side, in-process, for the fast test tier.

A stub, not a fake: it runs no model and checks nothing of what it is sent, and answers every
surface the proxy relays with a fixed, well-formed answer in llama-server b11434's shape
(proxy/testing/llama_shapes.py: OpenAI fields plus `timings`; Anthropic Messages and Responses
events; /completion's `content`/`stop`), `w0 w1 ...` as the text. What it exists for is to
provoke, on demand, what a real llama-server rarely does — stalls, connection resets, malformed
or partial SSE, a slow first token, 5xx answers — and to answer in milliseconds, so the proxy's
relay, routes, errors, validation, auth, metrics and policy are tested in seconds without a
llama.cpp build or a model. Its `Behaviour` also drives proxy/testing/instant_upstream.py, the
same answers from a server that costs next to nothing, for benchmarks.

What only the real binary can show (which inputs it refuses, its token counts, its own quirks)
is the integration tier's: it checks the same paths against llama-server itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

from proxy.testing import llama_shapes as shapes


@dataclass
class Behaviour:
    """What the double does with the next requests; tests change it between calls."""

    tokens: int = 8
    token_delay_s: float = 0.0
    first_token_delay_s: float = 0.0
    stall_after: int | None = None  # stop sending (but keep the connection) after n chunks
    reset_after: int | None = None  # drop the connection after n chunks
    malformed_after: int | None = None  # send a line that is not JSON after n chunks
    status: int = 200  # answer this status with an error body instead
    draft_n: int = 0
    draft_n_accepted: int = 0
    tokens_per_s: float = 50.0
    # Requests someone else (another proxy) has on this server: reported by /slots and /metrics.
    others: int = 0
    metrics: bool = True  # False: /metrics answers 501, as llama-server without --metrics
    healthy: bool = True  # False: /health answers 503, as while a model loads
    n_ctx: int = 4096  # tokens one request may hold, as /props reports it
    cache_n: int = 0  # prompt tokens each answer says it found cached (of cache_n + 5)
    role_chunk: bool = False  # open chat streams with llama-server's role-only chunk
    # What /slots says of a request at work: its prompt advancing at each look (a slow prompt),
    # or standing still (a stuck server; /slots still answers).
    progressing: bool = False

    def timings(self, n: int) -> dict[str, Any]:
        """llama.cpp's `timings` of an answer of n tokens."""
        timings: dict[str, Any] = {
            "cache_n": self.cache_n,
            "prompt_n": shapes.PROMPT_N,
            "prompt_ms": 2.0,
            "prompt_per_token_ms": 0.4,
            "prompt_per_second": 2500.0,
            "predicted_n": n,
            "predicted_ms": 1000.0 * n / self.tokens_per_s,
            "predicted_per_token_ms": 1000.0 / self.tokens_per_s,
            "predicted_per_second": self.tokens_per_s,
        }
        if self.draft_n:
            timings |= {"draft_n": self.draft_n, "draft_n_accepted": self.draft_n_accepted}
        return timings


@dataclass
class LlamaServerDouble:
    """One stub server: its behaviour, what it received and how many requests it is serving."""

    behaviour: Behaviour = field(default_factory=Behaviour)
    received: list[dict[str, Any]] = field(default_factory=list)
    counted: list[dict[str, Any]] = field(default_factory=list)  # bodies whose tokens it counted
    processing: int = 0
    looks: int = 0  # /slots calls while `progressing`: how far its prompts have come
    peak_processing: int = 0
    answered: int = 0  # requests it started answering, and the tokens of those answers
    generated: int = 0
    busy: list[tuple[float, float]] = field(default_factory=list)  # (start, end) per request
    server: TestServer | None = None

    @property
    def url(self) -> str:
        assert self.server is not None
        return str(self.server.make_url("")).rstrip("/")

    async def listen(self, host: str = "127.0.0.1", port: int | None = None) -> None:
        """Serve on host:port (any free port when None): to start, or come back after stop()."""
        self.server = TestServer(self.app(), host=host, port=port)
        await self.server.start_server()

    async def stop(self) -> None:
        """Stop listening: connections are refused, as from a server that died."""
        if self.server is not None:
            await self.server.close()

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/slots", self._slots)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/props", self._props)
        app.router.add_get("/v1/models", self._models)
        app.router.add_get("/models", self._models)
        app.router.add_post("/v1/chat/completions/input_tokens", self._count)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        # The other surfaces the proxy relays (proxy/api/surfaces.py), answered in their shape.
        for path in shapes.SURFACES:
            app.router.add_post(path, self._generate)
        app.router.add_post("/v1/responses/input_tokens", self._input_tokens)
        app.router.add_post("/v1/messages/count_tokens", self._input_tokens)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        app.router.add_post("/apply-template", self._apply_template)
        app.router.add_post("/v1/embeddings", self._embeddings)
        return app

    @property
    def held(self) -> int:
        return self.processing + self.behaviour.others

    async def _health(self, request: web.Request) -> web.Response:
        if not self.behaviour.healthy:
            return _failure(503, "Loading model", "unavailable_error")
        return web.json_response({"status": "ok"})

    async def _slots(self, request: web.Request) -> web.Response:
        b = self.behaviour
        if b.progressing:
            self.looks += 1
        slots = shapes.slots(self.held, b.n_ctx, bool(b.draft_n), processed=512 * self.looks)
        return web.json_response(slots)

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response(shapes.props(self.behaviour.n_ctx))

    async def _models(self, request: web.Request) -> web.Response:
        return web.json_response(shapes.models(self.behaviour.n_ctx))

    async def _count(self, request: web.Request) -> web.Response:
        # One token per four characters of message text: what tests of context limits need.
        body = await request.json()
        self.counted.append(body)
        text = "".join(str(m.get("content", "")) for m in body.get("messages", []))
        return web.json_response({"input_tokens": len(text) // 4})

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.behaviour.metrics:
            message = "This server does not support metrics"
            return _failure(501, message, "not_supported_error")
        text = shapes.metrics(self.held, self.answered, self.generated)
        return web.Response(text=text, content_type="text/plain")

    async def _begin(self, request: web.Request) -> tuple[dict[str, Any], web.Response | None]:
        """The request's body, recorded; and the error to answer instead, if told to fail."""
        body = await request.json()
        self.received.append(body)
        status = self.behaviour.status
        if status == 200:
            return body, None
        return body, _failure(status, "double: asked to fail", "x")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body, failed = await self._begin(request)
        if failed is not None:
            return failed
        b = self.behaviour
        chat = request.path.endswith("chat/completions")
        n = shapes.limited(body, b.tokens)
        model = shapes.model_of(body)
        start = self._started(n)
        try:
            if b.first_token_delay_s:
                await asyncio.sleep(b.first_token_delay_s)
            if not body.get("stream"):
                await asyncio.sleep(b.token_delay_s * n)
                return web.json_response(shapes.chat_whole(model, n, b.timings(n), chat))
            events = shapes.chat_events(
                model,
                n,
                b.timings,
                chat=chat,
                role=b.role_chunk,
                with_usage=bool((body.get("stream_options") or {}).get("include_usage")),
                per_token=bool(body.get("timings_per_token")),
            )
            lines = [f"data: {json.dumps(e)}\n\n".encode() for e in events]
            return await self._stream(request, lines, end=b"data: [DONE]\n\n")
        finally:
            self._ended(start)

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        """Responses, Messages, /completion and /infill: n tokens in that surface's shape."""
        body, failed = await self._begin(request)
        if failed is not None:
            return failed
        b = self.behaviour
        n = shapes.limited(body, b.tokens)
        whole, events = shapes.SURFACES[request.path]
        start = self._started(n)
        try:
            if b.first_token_delay_s:
                await asyncio.sleep(b.first_token_delay_s)
            if body.get("stream") is not True:
                await asyncio.sleep(b.token_delay_s * n)
                return web.json_response(whole(body, n, b.timings(n)))
            return await self._stream(request, events(body, n, b.timings), faults=False)
        finally:
            self._ended(start)

    def _started(self, n: int) -> float:
        self.processing += 1
        self.peak_processing = max(self.peak_processing, self.processing)
        self.answered += 1
        self.generated += n
        return time.monotonic()

    def _ended(self, start: float) -> None:
        self.processing -= 1
        self.busy.append((start, time.monotonic()))

    async def _stream(
        self,
        request: web.Request,
        chunks: list[bytes],
        end: bytes = b"",
        faults: bool = True,
    ) -> web.StreamResponse:
        """Send chunks token_delay_s apart, then `end`, with the behaviour's faults: a reset on
        every surface; a stall and a malformed line on the OpenAI ones."""
        b = self.behaviour
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for i, chunk in enumerate(chunks):
            if faults and b.stall_after is not None and i == b.stall_after:
                await asyncio.sleep(3600)
            if b.reset_after is not None and i == b.reset_after:
                assert request.transport is not None
                request.transport.close()
                return response
            if faults and b.malformed_after is not None and i == b.malformed_after:
                await response.write(b"data: {not json\n\n")
            await response.write(chunk)
            if b.token_delay_s:
                await asyncio.sleep(b.token_delay_s)
        if end:
            await response.write(end)
        await response.write_eof()
        return response

    async def _input_tokens(self, request: web.Request) -> web.Response:
        # The same count as _count (a token per four characters), for the other surfaces.
        return web.json_response({"input_tokens": len(json.dumps(await request.json())) // 4})

    async def _tokenize(self, request: web.Request) -> web.Response:
        content = (await request.json()).get("content")
        words = content.split() if isinstance(content, str) else []
        return web.json_response({"tokens": list(range(1, len(words) + 1))})

    async def _detokenize(self, request: web.Request) -> web.Response:
        tokens = (await request.json()).get("tokens")
        count = len(tokens) if isinstance(tokens, list) else 0
        return web.json_response({"content": shapes.text(count)})

    async def _apply_template(self, request: web.Request) -> web.Response:
        messages = (await request.json()).get("messages")
        turns = messages if isinstance(messages, list) else []
        prompt = "".join(
            f"<|{m.get('role')}|>{m.get('content')}\n" for m in turns if isinstance(m, dict)
        )
        return web.json_response({"prompt": prompt})

    async def _embeddings(self, request: web.Request) -> web.Response:
        # What llama-server started without --embeddings answers (as the test backends are).
        message = "This server does not support embeddings. Start it with `--embeddings`"
        return _failure(501, message, "not_supported_error")


def _failure(status: int, message: str, kind: str) -> web.Response:
    return web.json_response(shapes.error(status, message, kind), status=status)


async def start_double(
    behaviour: Behaviour | None = None, host: str = "127.0.0.1", port: int | None = None
) -> LlamaServerDouble:
    """A stub llama-server listening on host:port (a free loopback port by default)."""
    double = LlamaServerDouble(behaviour or Behaviour())
    await double.listen(host, port)
    return double
