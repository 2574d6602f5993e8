"""A stub of llama-server's HTTP side that answers at once: the overhead benchmark's upstream.

    .venv/bin/python scripts/instant_upstream.py --port 9001 [--slow-port 9002]

It is a stub, not llama-server: no model, no tokens computed. It answers what a proxy in front of
llama-server asks, in llama-server's shapes (b11434, as tests/llama_double.py has them): GET
/health, /props, /slots, /metrics, /v1/models and POST /v1/chat/completions, streamed (SSE
`chat.completion.chunk` events, the last one with `timings`, then `data: [DONE]`, in chunked
transfer encoding as llama-server sends them) or whole (a `chat.completion` with `usage` and
`timings`). On --port every answer is immediate; on --slow-port a stream sends its chunks
--slow-delay-ms apart, as a model decoding would, so many streams are open at once.

It is a bare asyncio protocol rather than an aiohttp app so that it costs next to nothing per
request: whatever a proxy in front of it measures is the proxy's. Answers are rendered once per
(model, shape) and reused.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import signal
import time
from collections.abc import Callable
from typing import Any

STUB_MODEL = "stub.gguf"
N_CTX = 4096
PROMPT_N = 5

_REASONS = {200: "OK", 404: "Not Found", 400: "Bad Request", 405: "Method Not Allowed"}


class Stub:
    """What both ports share: the settings, the rendered answers, the requests in flight."""

    def __init__(self, tokens: int, slow_chunks: int, slow_delay_s: float) -> None:
        self.tokens = tokens
        self.slow_chunks = slow_chunks
        self.slow_delay_s = slow_delay_s
        self.processing = 0
        self.served = 0
        self._cache: dict[tuple[Any, ...], Any] = {}

    # --- rendered answers -----------------------------------------------------------------

    def timings(self, n: int) -> dict[str, Any]:
        return {
            "cache_n": 0,
            "prompt_n": PROMPT_N,
            "prompt_ms": 1.0,
            "prompt_per_token_ms": 0.2,
            "prompt_per_second": 5000.0,
            "predicted_n": n,
            "predicted_ms": float(n),
            "predicted_per_token_ms": 1.0,
            "predicted_per_second": 1000.0,
        }

    def whole(self, model: str, n: int) -> bytes:
        """A non-streamed chat completion, as llama-server answers one."""
        key = ("whole", model, n)
        if key not in self._cache:
            answer = {
                "choices": [
                    {
                        "finish_reason": "length",
                        "index": 0,
                        "message": {
                            "role": "assistant",
                            "content": "".join(f"w{i} " for i in range(n)),
                        },
                    }
                ],
                "created": int(time.time()),
                "model": model,
                "system_fingerprint": "b11434-stub",
                "object": "chat.completion",
                "usage": {
                    "completion_tokens": n,
                    "prompt_tokens": PROMPT_N,
                    "total_tokens": n + PROMPT_N,
                },
                "id": "chatcmpl-stub",
                "timings": self.timings(n),
            }
            self._cache[key] = json.dumps(answer, separators=(",", ":")).encode()
        body: bytes = self._cache[key]
        return body

    def events(self, model: str, n: int, usage: bool) -> list[bytes]:
        """A streamed chat completion's SSE events (`data: ...\\n\\n`), [DONE] last."""
        key = ("events", model, n, usage)
        if key not in self._cache:
            created = int(time.time())

            def chunk(delta: dict[str, Any], finish: str | None, **extra: Any) -> bytes:
                event = {
                    "choices": [{"finish_reason": finish, "index": 0, "delta": delta}],
                    "created": created,
                    "id": "chatcmpl-stub",
                    "model": model,
                    "system_fingerprint": "b11434-stub",
                    "object": "chat.completion.chunk",
                    **extra,
                }
                return b"data: " + json.dumps(event, separators=(",", ":")).encode() + b"\n\n"

            out = [chunk({"role": "assistant", "content": None}, None)]
            out += [chunk({"content": f"w{i} "}, None) for i in range(n)]
            out.append(chunk({}, "length", timings=self.timings(n)))
            if usage:
                counts = {
                    "completion_tokens": n,
                    "prompt_tokens": PROMPT_N,
                    "total_tokens": n + PROMPT_N,
                }
                usage_event = {
                    "choices": [],
                    "created": created,
                    "id": "chatcmpl-stub",
                    "model": model,
                    "system_fingerprint": "b11434-stub",
                    "object": "chat.completion.chunk",
                    "usage": counts,
                    "timings": self.timings(n),
                }
                out.append(
                    b"data: " + json.dumps(usage_event, separators=(",", ":")).encode() + b"\n\n"
                )
            out.append(b"data: [DONE]\n\n")
            self._cache[key] = out
        events: list[bytes] = self._cache[key]
        return events

    def props(self) -> bytes:
        return _json(
            {
                "default_generation_settings": {
                    "n_ctx": N_CTX,
                    "params": {"n_predict": -1, "temperature": 0.8, "top_k": 40},
                },
                "total_slots": 1,
                "model_alias": STUB_MODEL,
                "model_path": f"/stub/{STUB_MODEL}",
                "modalities": {"vision": False, "audio": False},
                "chat_template": "{{ messages }}",
                "build_info": "b11434-stub",
            }
        )

    def slots(self) -> bytes:
        busy = self.processing
        return _json(
            [
                {"id": i, "n_ctx": N_CTX, "is_processing": i < busy, "speculative": False}
                for i in range(max(busy, 1))
            ]
        )

    def metrics(self) -> bytes:
        return (
            "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
            "# TYPE llamacpp:prompt_tokens_total counter\n"
            f"llamacpp:prompt_tokens_total {self.served * PROMPT_N}\n"
            "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
            "# TYPE llamacpp:tokens_predicted_total counter\n"
            f"llamacpp:tokens_predicted_total {self.served * self.tokens}\n"
            "# HELP llamacpp:requests_processing Number of requests processing.\n"
            "# TYPE llamacpp:requests_processing gauge\n"
            f"llamacpp:requests_processing {self.processing}\n"
            "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
            "# TYPE llamacpp:requests_deferred gauge\n"
            "llamacpp:requests_deferred 0\n"
        ).encode()

    def models(self) -> bytes:
        return _json(
            {
                "models": [
                    {"name": STUB_MODEL, "model": STUB_MODEL, "type": "model", "capabilities": []}
                ],
                "object": "list",
                "data": [
                    {
                        "id": STUB_MODEL,
                        "object": "model",
                        "created": int(time.time()),
                        "owned_by": "llamacpp",
                        "meta": {"n_ctx_train": N_CTX, "n_vocab": 32000, "n_params": 0},
                    }
                ],
            }
        )


def _json(value: Any) -> bytes:
    return json.dumps(value, separators=(",", ":")).encode()


def _error(code: int, message: str, kind: str) -> bytes:
    return _json({"error": {"code": code, "message": message, "type": kind}})


def _chunked(data: bytes) -> bytes:
    return b"%x\r\n%s\r\n" % (len(data), data)


class StubProtocol(asyncio.Protocol):
    """One client connection: HTTP/1.1 with keep-alive, requests answered in order."""

    def __init__(self, stub: Stub, slow: bool) -> None:
        self.stub = stub
        self.slow = slow
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
            self.stub.processing -= 1
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
                self._answer(400, _error(400, "bad request line", "invalid_request_error"))
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

    def _handle(self, method: str, path: str, body: bytes) -> None:
        stub = self.stub
        gets: dict[str, Callable[[], bytes]] = {
            "/health": lambda: b'{"status":"ok"}',
            "/props": stub.props,
            "/slots": stub.slots,
            "/v1/models": stub.models,
            "/models": stub.models,
        }
        if method == "GET" and path in gets:
            self._answer(200, gets[path]())
        elif method == "GET" and path == "/metrics":
            self._answer(200, stub.metrics(), "text/plain; version=0.0.4")
        elif method == "POST" and path in ("/v1/chat/completions", "/chat/completions"):
            self._complete(body)
        elif method == "POST" and path == "/v1/chat/completions/input_tokens":
            self._answer(200, _json({"input_tokens": PROMPT_N + len(body) // 4}))
        else:
            self._answer(404, _error(404, "File Not Found", "not_found_error"))

    def _complete(self, raw: bytes) -> None:
        try:
            body = json.loads(raw)
            if not isinstance(body, dict):
                raise ValueError("not an object")
        except ValueError:
            self._answer(400, _error(400, "invalid JSON body", "invalid_request_error"))
            return
        model = str(body.get("model") or STUB_MODEL)
        n = self.stub.slow_chunks if self.slow else self.stub.tokens
        max_tokens = body.get("max_tokens") or body.get("max_completion_tokens")
        if isinstance(max_tokens, int) and 0 < max_tokens < n:
            n = max_tokens
        self.stub.served += 1
        if not body.get("stream"):
            self._answer(200, self.stub.whole(model, n))
            return
        usage = bool((body.get("stream_options") or {}).get("include_usage"))
        events = self.stub.events(model, n, usage)
        assert self.transport is not None
        head = (
            "HTTP/1.1 200 OK\r\n"
            "Content-Type: text/event-stream\r\n"
            "Transfer-Encoding: chunked\r\n"
            "Server: llama.cpp\r\n"
            "Access-Control-Allow-Origin: *\r\n"
            f"Connection: {'close' if self.close_after else 'keep-alive'}\r\n\r\n"
        ).encode()
        if not self.slow:
            self.transport.write(head + b"".join(_chunked(e) for e in events) + b"0\r\n\r\n")
            if self.close_after:
                self.transport.close()
            return
        self.busy = True
        self.stub.processing += 1
        self.transport.write(head + _chunked(events[0]))
        self._send_later(events, 1, 1 + n)

    def _send_later(self, events: list[bytes], i: int, closing: int) -> None:
        loop = asyncio.get_running_loop()
        self.streaming = loop.call_later(self.stub.slow_delay_s, self._send, events, i, closing)

    def _send(self, events: list[bytes], i: int, closing: int) -> None:
        """Content chunk i, one per delay; the closing events (from index `closing`: the one
        with `timings`, usage, [DONE]) follow the last content chunk at once."""
        self.streaming = None
        if self.transport is None:
            return
        if i + 1 < closing:
            self.transport.write(_chunked(events[i]))
            self._send_later(events, i + 1, closing)
            return
        self.transport.write(b"".join(_chunked(e) for e in events[i:]) + b"0\r\n\r\n")
        self.busy = False
        self.stub.processing -= 1
        if self.close_after:
            self.transport.close()
            return
        self._next()


async def serve(port: int, slow_port: int | None, stub: Stub, host: str) -> None:
    loop = asyncio.get_running_loop()
    servers = [
        await loop.create_server(lambda: StubProtocol(stub, False), host, port, backlog=8192)
    ]
    if slow_port is not None:
        servers.append(
            await loop.create_server(
                lambda: StubProtocol(stub, True), host, slow_port, backlog=8192
            )
        )
    stop = asyncio.Event()
    for sig in (signal.SIGINT, signal.SIGTERM):
        loop.add_signal_handler(sig, stop.set)
    ports = ", ".join(str(s.sockets[0].getsockname()[1]) for s in servers)
    print(f"instant upstream (a stub, not llama-server) listening on {host}: {ports}", flush=True)
    await stop.wait()
    for server in servers:
        server.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, required=True, help="instant answers")
    parser.add_argument("--slow-port", type=int, help="streams paced --slow-delay-ms apart")
    parser.add_argument("--tokens", type=int, default=8, help="tokens of an instant answer")
    parser.add_argument("--slow-chunks", type=int, default=20, help="tokens of a slow stream")
    parser.add_argument("--slow-delay-ms", type=float, default=50.0)
    parser.add_argument("--cpus", help="CPU ids to run on, e.g. 0 or 0,1")
    args = parser.parse_args()
    if args.cpus:
        os.sched_setaffinity(0, {int(c) for c in args.cpus.split(",")})
    stub = Stub(args.tokens, args.slow_chunks, args.slow_delay_ms / 1000)
    asyncio.run(serve(args.port, args.slow_port, stub, args.host))


if __name__ == "__main__":
    main()
