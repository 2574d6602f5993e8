"""LlamaServerDouble: a stub of llama-server's HTTP side, for the fast in-process test tier.

A stub, not a fake: it runs no model and checks nothing of what it is sent, and answers every
surface the proxy relays with a fixed, well-formed answer in llama-server b11434's shape
(OpenAI fields plus `timings`; Anthropic Messages and Responses events; /completion's
`content`/`stop`), `w0 w1 ...` as the text. What it exists for is to provoke, on demand, what a
real llama-server rarely does — stalls, connection resets, malformed or partial SSE, a slow first
token, 5xx answers — and to answer in milliseconds, so the proxy's relay, routes, errors,
validation, auth, metrics and policy are tested in seconds without a llama.cpp build or a model.

What only the real binary can show (which inputs it refuses, its token counts, its own quirks)
is the integration tier's: it checks the same paths against llama-server itself.
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web
from aiohttp.test_utils import TestServer

Fault = str  # "stall_first", "stall_after", "reset_after", "malformed", "status", "truncate"


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


@dataclass
class LlamaServerDouble:
    """One stub server: its behaviour, what it received and how many requests it is serving."""

    behaviour: Behaviour = field(default_factory=Behaviour)
    received: list[dict[str, Any]] = field(default_factory=list)
    counted: list[dict[str, Any]] = field(default_factory=list)  # bodies whose tokens it counted
    processing: int = 0
    peak_processing: int = 0
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

    def timings(self, n: int) -> dict[str, Any]:
        b = self.behaviour
        timings: dict[str, Any] = {
            "cache_n": b.cache_n,
            "prompt_n": 5,
            "prompt_ms": 2.0,
            "prompt_per_token_ms": 0.4,
            "prompt_per_second": 2500.0,
            "predicted_n": n,
            "predicted_ms": 1000.0 * n / b.tokens_per_s,
            "predicted_per_token_ms": 1000.0 / b.tokens_per_s,
            "predicted_per_second": b.tokens_per_s,
        }
        if b.draft_n:
            timings |= {"draft_n": b.draft_n, "draft_n_accepted": b.draft_n_accepted}
        return timings

    def app(self) -> web.Application:
        app = web.Application()
        app.router.add_get("/health", self._health)
        app.router.add_get("/slots", self._slots)
        app.router.add_get("/metrics", self._metrics)
        app.router.add_get("/props", self._props)
        app.router.add_post("/v1/chat/completions/input_tokens", self._count)
        app.router.add_post("/v1/chat/completions", self._complete)
        app.router.add_post("/v1/completions", self._complete)
        # The other surfaces the proxy relays (proxy/api/surfaces.py), answered in their shape.
        for path in ("/v1/responses", "/v1/messages", "/completion", "/infill"):
            app.router.add_post(path, self._generate)
        app.router.add_post("/v1/responses/input_tokens", self._input_tokens)
        app.router.add_post("/v1/messages/count_tokens", self._input_tokens)
        app.router.add_post("/tokenize", self._tokenize)
        app.router.add_post("/detokenize", self._detokenize)
        app.router.add_post("/apply-template", self._apply_template)
        app.router.add_post("/v1/embeddings", self._embeddings)
        return app

    async def _health(self, request: web.Request) -> web.Response:
        if not self.behaviour.healthy:
            loading = {"error": {"code": 503, "message": "Loading model"}}
            return web.json_response(loading, status=503)
        return web.json_response({"status": "ok"})

    async def _slots(self, request: web.Request) -> web.Response:
        busy = self.processing + self.behaviour.others
        return web.json_response(
            [{"id": i, "is_processing": i < busy} for i in range(max(busy, 1))]
        )

    async def _props(self, request: web.Request) -> web.Response:
        return web.json_response({"default_generation_settings": {"n_ctx": self.behaviour.n_ctx}})

    async def _count(self, request: web.Request) -> web.Response:
        # One token per four characters of message text: what tests of context limits need.
        body = await request.json()
        self.counted.append(body)
        text = "".join(str(m.get("content", "")) for m in body.get("messages", []))
        return web.json_response({"input_tokens": len(text) // 4})

    async def _metrics(self, request: web.Request) -> web.Response:
        if not self.behaviour.metrics:
            return web.json_response(
                {"error": {"code": 501, "message": "This server does not support metrics"}},
                status=501,
            )
        text = (
            "# HELP llamacpp:requests_processing Number of requests processing.\n"
            "# TYPE llamacpp:requests_processing gauge\n"
            f"llamacpp:requests_processing {self.processing + self.behaviour.others}\n"
            "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
            "# TYPE llamacpp:requests_deferred gauge\n"
            "llamacpp:requests_deferred 0\n"
        )
        return web.Response(text=text, content_type="text/plain")

    async def _complete(self, request: web.Request) -> web.StreamResponse:
        body = await request.json()
        self.received.append(body)
        b = self.behaviour
        if b.status != 200:
            return web.json_response(
                {"error": {"code": b.status, "message": "double: asked to fail", "type": "x"}},
                status=b.status,
            )
        self.processing += 1
        self.peak_processing = max(self.peak_processing, self.processing)
        start = time.monotonic()
        try:
            if b.first_token_delay_s:
                await asyncio.sleep(b.first_token_delay_s)
            n = min(b.tokens, int(body.get("max_tokens") or b.tokens))
            chat = request.path.endswith("chat/completions")
            if not body.get("stream"):
                await asyncio.sleep(b.token_delay_s * n)
                return web.json_response(self._whole(body, n, chat))
            return await self._stream(request, body, n, chat)
        finally:
            self.processing -= 1
            self.busy.append((start, time.monotonic()))

    def _whole(self, body: dict[str, Any], n: int, chat: bool) -> dict[str, Any]:
        text = " ".join(f"w{i}" for i in range(n))
        choice: dict[str, Any] = (
            {"index": 0, "message": {"role": "assistant", "content": text}}
            if chat
            else {"index": 0, "text": text}
        )
        choice["finish_reason"] = "length"
        return {
            "id": "chatcmpl-double",
            "object": "chat.completion" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model", "double"),
            "choices": [choice],
            "usage": {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5},
            "timings": self.timings(n),
        }

    async def _stream(
        self, request: web.Request, body: dict[str, Any], n: int, chat: bool
    ) -> web.StreamResponse:
        b = self.behaviour
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        async for i, event in self._events(body, n, chat):
            if b.stall_after is not None and i == b.stall_after:
                await asyncio.sleep(3600)
            if b.reset_after is not None and i == b.reset_after:
                assert request.transport is not None
                request.transport.close()
                return response
            if b.malformed_after is not None and i == b.malformed_after:
                await response.write(b"data: {not json\n\n")
            await response.write(f"data: {json.dumps(event)}\n\n".encode())
            if b.token_delay_s:
                await asyncio.sleep(b.token_delay_s)
        await response.write(b"data: [DONE]\n\n")
        await response.write_eof()
        return response

    async def _events(
        self, body: dict[str, Any], n: int, chat: bool
    ) -> AsyncIterator[tuple[int, dict[str, Any]]]:
        per_token = bool(body.get("timings_per_token"))
        for i in range(n):
            piece = f"w{i} "
            choice: dict[str, Any] = (
                {"index": 0, "delta": {"content": piece}, "finish_reason": None}
                if chat
                else {"index": 0, "text": piece, "finish_reason": None}
            )
            event: dict[str, Any] = {
                "id": "chatcmpl-double",
                "object": "chat.completion.chunk" if chat else "text_completion",
                "created": int(time.time()),
                "model": body.get("model", "double"),
                "choices": [choice],
            }
            if per_token:
                event["timings"] = self.timings(i + 1)
            yield i, event
        final: dict[str, Any] = {
            "id": "chatcmpl-double",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": int(time.time()),
            "model": body.get("model", "double"),
            "choices": [{"index": 0, "delta": {}, "finish_reason": "length"}],
            "timings": self.timings(n),
        }
        yield n, final
        if (body.get("stream_options") or {}).get("include_usage"):
            usage = {"prompt_tokens": 5, "completion_tokens": n, "total_tokens": n + 5}
            yield n + 1, {**final, "choices": [], "usage": usage}

    # ------------------------------------------------------------------ the other surfaces

    async def _generate(self, request: web.Request) -> web.StreamResponse:
        """Responses, Messages, /completion and /infill: n tokens in that surface's shape."""
        body = await request.json()
        self.received.append(body)
        b = self.behaviour
        if b.status != 200:
            return web.json_response(
                {"error": {"code": b.status, "message": "double: asked to fail", "type": "x"}},
                status=b.status,
            )
        limit = next(
            (body.get(k) for k in ("max_tokens", "max_output_tokens", "n_predict") if k in body),
            None,
        )
        n = min(b.tokens, limit) if isinstance(limit, int) and limit > 0 else b.tokens
        whole, events = _SHAPES[request.path]
        self.processing += 1
        self.peak_processing = max(self.peak_processing, self.processing)
        start = time.monotonic()
        try:
            if b.first_token_delay_s:
                await asyncio.sleep(b.first_token_delay_s)
            if body.get("stream") is not True:
                await asyncio.sleep(b.token_delay_s * n)
                return web.json_response(whole(body, n, self.timings(n)))
            response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
            await response.prepare(request)
            for i, event in enumerate(events(body, n, self.timings)):
                if b.reset_after is not None and i == b.reset_after:
                    assert request.transport is not None
                    request.transport.close()
                    return response
                await response.write(event)
                if b.token_delay_s:
                    await asyncio.sleep(b.token_delay_s)
            await response.write_eof()
            return response
        finally:
            self.processing -= 1
            self.busy.append((start, time.monotonic()))

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
        return web.json_response({"content": " ".join(f"w{i}" for i in range(count))})

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
        return web.json_response(
            {"error": {"code": 501, "message": message, "type": "not_supported_error"}},
            status=501,
        )


def _sse(data: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


# How one surface answers n tokens, whole (body, n, timings) and as a stream (body, n, the
# timings of a count of tokens), in llama-server b11434's shape.
Timings = Callable[[int], dict[str, Any]]
Whole = Callable[[dict[str, Any], int, dict[str, Any]], dict[str, Any]]
Events = Callable[[dict[str, Any], int, Timings], list[bytes]]


def _text(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def _native_whole(body: dict[str, Any], n: int, timings: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": _text(n),
        "stop": True,
        "stop_type": "limit",
        "tokens_predicted": n,
        "tokens_evaluated": 5,
        "timings": timings,
    }


def _native_events(body: dict[str, Any], n: int, timings_of: Timings) -> list[bytes]:
    # /completion and /infill stream bare `data:` lines and no [DONE].
    pieces = [_sse({"content": f"w{i} ", "stop": False}) for i in range(n)]
    return [
        *pieces,
        _sse({"content": "", "stop": True, "stop_type": "limit", "timings": timings_of(n)}),
    ]


def _messages_whole(body: dict[str, Any], n: int, timings: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_double",
        "type": "message",
        "role": "assistant",
        "model": str(body.get("model", "double")),
        "content": [{"type": "text", "text": _text(n)}],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {"input_tokens": 5, "output_tokens": n},
    }


def _messages_events(body: dict[str, Any], n: int, timings_of: Timings) -> list[bytes]:
    start = {**_messages_whole(body, 0, {}), "content": [], "stop_reason": None}
    return [
        _sse({"type": "message_start", "message": start}, "message_start"),
        _sse(
            {
                "type": "content_block_start",
                "index": 0,
                "content_block": {"type": "text", "text": ""},
            },
            "content_block_start",
        ),
        *(
            _sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": f"w{i} "},
                },
                "content_block_delta",
            )
            for i in range(n)
        ),
        _sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        _sse(
            {
                "type": "message_delta",
                "delta": {"stop_reason": "max_tokens", "stop_sequence": None},
                "usage": {"output_tokens": n},
            },
            "message_delta",
        ),
        _sse({"type": "message_stop"}, "message_stop"),
    ]


def _response(body: dict[str, Any], n: int, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": _text(n), "annotations": []}]
    return {
        "id": "resp_double",
        "object": "response",
        "created_at": int(time.time()),
        "model": str(body.get("model", "double")),
        "status": status,
        "output": [
            {
                "type": "message",
                "id": "msg_double",
                "role": "assistant",
                "status": status,
                "content": content,
            }
        ]
        if n
        else [],
        "usage": {"input_tokens": 5, "output_tokens": n, "total_tokens": n + 5},
    }


def _responses_whole(body: dict[str, Any], n: int, timings: dict[str, Any]) -> dict[str, Any]:
    return _response(body, n, "completed")


def _responses_events(body: dict[str, Any], n: int, timings_of: Timings) -> list[bytes]:
    # b11434 leaves out sequence_number, output_index and content_index: the proxy adds them.
    item = {
        "type": "message",
        "id": "msg_double",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    part = {"type": "output_text", "text": "", "annotations": []}
    done_part = {**part, "text": _text(n)}
    return [
        _sse(
            {"type": "response.created", "response": _response(body, 0, "in_progress")},
            "response.created",
        ),
        _sse({"type": "response.output_item.added", "item": item}, "response.output_item.added"),
        _sse(
            {"type": "response.content_part.added", "item_id": "msg_double", "part": part},
            "response.content_part.added",
        ),
        *(
            _sse(
                {"type": "response.output_text.delta", "item_id": "msg_double", "delta": f"w{i} "},
                "response.output_text.delta",
            )
            for i in range(n)
        ),
        _sse(
            {"type": "response.output_text.done", "item_id": "msg_double", "text": _text(n)},
            "response.output_text.done",
        ),
        _sse(
            {"type": "response.content_part.done", "item_id": "msg_double", "part": done_part},
            "response.content_part.done",
        ),
        _sse(
            {
                "type": "response.output_item.done",
                "item": {**item, "status": "completed", "content": [done_part]},
            },
            "response.output_item.done",
        ),
        _sse(
            {
                "type": "response.completed",
                "response": _response(body, n, "completed"),
                "timings": timings_of(n),
            },
            "response.completed",
        ),
    ]


_SHAPES: dict[str, tuple[Whole, Events]] = {
    "/completion": (_native_whole, _native_events),
    "/infill": (_native_whole, _native_events),
    "/v1/messages": (_messages_whole, _messages_events),
    "/v1/responses": (_responses_whole, _responses_events),
}


async def start_double(
    behaviour: Behaviour | None = None, host: str = "127.0.0.1", port: int | None = None
) -> LlamaServerDouble:
    """A stub llama-server listening on host:port (a free loopback port by default)."""
    double = LlamaServerDouble(behaviour or Behaviour())
    await double.listen(host, port)
    return double
