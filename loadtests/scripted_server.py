"""A scripted model server for real agents: each answer, text or a tool call, in each wire format.

No model: a script decides each answer from the request (scripts/agent_prefixes.py answers every
turn with text, scripts/capture_edit_turns.py reads a file and writes it back edited). Every
request is recorded. Answers end the way each client needs a stream to end (docs/agents.md:
Codex, Qwen Code and opencode fail or retry on a stream cut before its last event).
"""

from __future__ import annotations

import asyncio
import json
import socket
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

from aiohttp import web

# The generating endpoints, by how their path ends.
GENERATING = ("chat/completions", "responses", "messages")
# Tool-call arguments stream in pieces of this many characters, as a model's tokens would.
ARGUMENT_PIECE = 48


@dataclass(frozen=True)
class ToolCall:
    """One tool call: its name and arguments (JSON; a Responses custom tool's free-form input)."""

    name: str
    arguments: str
    custom: bool = False
    call_id: str = "call_1"


Answer = str | ToolCall
# The script: (path with query, request body) -> the answer, streamed or whole as asked.
Script = Callable[[str, dict[str, Any]], Answer]


@dataclass
class Captured:
    """One request an agent sent: method, path with query, JSON body (None: none or not JSON)."""

    method: str
    path: str
    body: dict[str, Any] | None
    at: float


@dataclass
class Recorder:
    """Every request since the last `take()`."""

    requests: list[Captured] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def add(self, item: Captured) -> None:
        """Keep one request."""
        with self.lock:
            self.requests.append(item)

    def take(self) -> list[Captured]:
        """The requests kept so far, and a fresh start."""
        with self.lock:
            out, self.requests = self.requests, []
        return out


def sse(name: str | None, data: object) -> bytes:
    """One server-sent event, named or not."""
    head = f"event: {name}\n" if name else ""
    text = data if isinstance(data, str) else json.dumps(data)
    return f"{head}data: {text}\n\n".encode()


def pieces(text: str, size: int = ARGUMENT_PIECE) -> list[str]:
    """The text cut in pieces of `size` characters (one empty piece for an empty text)."""
    return [text[i : i + size] for i in range(0, len(text), size)] or [""]


# --- OpenAI chat completions ------------------------------------------------------------------


def chat_events(body: dict[str, Any], answer: Answer) -> list[bytes]:
    """A streamed chat completion: text deltas, or `delta.tool_calls` with arguments in pieces."""
    base = {"id": "chatcmpl-1", "object": "chat.completion.chunk", "created": int(time.time())}
    base["model"] = body.get("model", "auto")

    def chunk(delta: dict[str, Any], finish: str | None) -> bytes:
        choice = {"index": 0, "delta": delta, "finish_reason": finish}
        return sse(None, {**base, "choices": [choice]})

    if isinstance(answer, ToolCall):
        head = {"index": 0, "id": answer.call_id, "type": "function"}
        head["function"] = {"name": answer.name, "arguments": ""}
        events = [chunk({"role": "assistant", "content": None, "tool_calls": [head]}, None)]
        events += [
            chunk({"tool_calls": [{"index": 0, "function": {"arguments": piece}}]}, None)
            for piece in pieces(answer.arguments)
        ]
        events.append(chunk({}, "tool_calls"))
    else:
        events = [
            chunk({"role": "assistant", "content": ""}, None),
            chunk({"content": answer}, None),
        ]
        events.append(chunk({}, "stop"))
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("include_usage"):
        usage = {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2}
        events.append(sse(None, {**base, "choices": [], "usage": usage}))
    return [*events, sse(None, "[DONE]")]


def chat_whole(body: dict[str, Any], answer: Answer) -> dict[str, Any]:
    """A whole chat completion: text, or one tool call."""
    message: dict[str, Any] = {"role": "assistant", "content": answer}
    finish = "stop"
    if isinstance(answer, ToolCall):
        function = {"name": answer.name, "arguments": answer.arguments}
        message = {"role": "assistant", "content": None}
        message["tool_calls"] = [{"id": answer.call_id, "type": "function", "function": function}]
        finish = "tool_calls"
    return {
        "id": "chatcmpl-1",
        "object": "chat.completion",
        "created": int(time.time()),
        "model": body.get("model", "auto"),
        "choices": [{"index": 0, "message": message, "finish_reason": finish}],
        "usage": {"prompt_tokens": 1, "completion_tokens": 1, "total_tokens": 2},
    }


# --- OpenAI Responses -------------------------------------------------------------------------

_RESPONSES_USAGE = {
    "input_tokens": 1,
    "input_tokens_details": {"cached_tokens": 0},
    "output_tokens": 1,
    "output_tokens_details": {"reasoning_tokens": 0},
    "total_tokens": 2,
}


def _responses_item(answer: Answer) -> dict[str, Any]:
    """The one output item, completed: a message, a `function_call` or a `custom_tool_call`."""
    if isinstance(answer, ToolCall) and answer.custom:
        return {
            "id": "ctc_1",
            "type": "custom_tool_call",
            "status": "completed",
            "call_id": answer.call_id,
            "name": answer.name,
            "input": answer.arguments,
        }
    if isinstance(answer, ToolCall):
        return {
            "id": "fc_1",
            "type": "function_call",
            "status": "completed",
            "call_id": answer.call_id,
            "name": answer.name,
            "arguments": answer.arguments,
        }
    part = {"type": "output_text", "text": answer, "annotations": []}
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [part],
    }


def _response(body: dict[str, Any], status: str, output: list[Any]) -> dict[str, Any]:
    response: dict[str, Any] = {
        "id": "resp_1",
        "object": "response",
        "created_at": int(time.time()),
        "model": body.get("model", "auto"),
        "status": status,
        "output": output,
    }
    if status == "completed":
        response["usage"] = _RESPONSES_USAGE
    return response


def _responses_item_steps(answer: Answer, item: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    """The events between an item's `output_item.added` and its `output_item.done`."""
    at = {"item_id": item["id"], "output_index": 0}
    if isinstance(answer, ToolCall):
        kind = "custom_tool_call_input" if answer.custom else "function_call_arguments"
        done_key = "input" if answer.custom else "arguments"
        steps = [(f"response.{kind}.delta", {**at, "delta": p}) for p in pieces(answer.arguments)]
        return [*steps, (f"response.{kind}.done", {**at, done_key: answer.arguments})]
    part = item["content"][0]
    where = {**at, "content_index": 0}
    return [
        ("response.content_part.added", {**where, "part": {**part, "text": ""}}),
        ("response.output_text.delta", {**where, "delta": answer}),
        ("response.output_text.done", {**where, "text": answer}),
        ("response.content_part.done", {**where, "part": part}),
    ]


def responses_events(body: dict[str, Any], answer: Answer) -> list[bytes]:
    """A streamed response: one output item (message, function or custom tool call), in pieces."""
    item = _responses_item(answer)
    started = _response(body, "in_progress", [])
    empty: dict[str, Any] = {"status": "in_progress"}
    if isinstance(answer, ToolCall):
        empty |= {"input": ""} if answer.custom else {"arguments": ""}
    else:
        empty |= {"content": []}
    steps: list[tuple[str, dict[str, Any]]] = [
        ("response.created", {"response": started}),
        ("response.in_progress", {"response": started}),
        ("response.output_item.added", {"output_index": 0, "item": {**item, **empty}}),
        *_responses_item_steps(answer, item),
        ("response.output_item.done", {"output_index": 0, "item": item}),
        ("response.completed", {"response": _response(body, "completed", [item])}),
    ]
    return [
        sse(name, {"type": name, "sequence_number": i, **data})
        for i, (name, data) in enumerate(steps)
    ]


def responses_whole(body: dict[str, Any], answer: Answer) -> dict[str, Any]:
    """A whole response with its one output item."""
    return _response(body, "completed", [_responses_item(answer)])


# --- Anthropic Messages -----------------------------------------------------------------------


def _block(answer: Answer) -> dict[str, Any]:
    if isinstance(answer, ToolCall):
        block = {"type": "tool_use", "id": f"toolu_{answer.call_id}", "name": answer.name}
        return {**block, "input": json.loads(answer.arguments)}
    return {"type": "text", "text": answer}


def messages_whole(body: dict[str, Any], answer: Answer) -> dict[str, Any]:
    """A whole message: a text block, or a `tool_use` block."""
    return {
        "id": "msg_1",
        "type": "message",
        "role": "assistant",
        "model": body.get("model", "auto"),
        "content": [_block(answer)],
        "stop_reason": "tool_use" if isinstance(answer, ToolCall) else "end_turn",
        "stop_sequence": None,
        "usage": {"input_tokens": 1, "output_tokens": 1},
    }


def messages_events(body: dict[str, Any], answer: Answer) -> list[bytes]:
    """A streamed message: text deltas, or a `tool_use` block with `input_json_delta` pieces."""
    whole = messages_whole(body, answer)
    start = {**whole, "content": [], "stop_reason": None}
    block = _block(answer)
    if isinstance(answer, ToolCall):
        opened = {**block, "input": {}}
        deltas = [
            {"type": "input_json_delta", "partial_json": piece}
            for piece in pieces(answer.arguments)
        ]
    else:
        opened = {"type": "text", "text": ""}
        deltas = [{"type": "text_delta", "text": answer}]
    steps: list[tuple[str, dict[str, Any]]] = [
        ("message_start", {"message": start}),
        ("content_block_start", {"index": 0, "content_block": opened}),
        ("ping", {}),
        *[("content_block_delta", {"index": 0, "delta": delta}) for delta in deltas],
        ("content_block_stop", {"index": 0}),
        (
            "message_delta",
            {
                "delta": {"stop_reason": whole["stop_reason"], "stop_sequence": None},
                "usage": {"output_tokens": 1},
            },
        ),
        ("message_stop", {}),
    ]
    return [sse(name, {"type": name, **data}) for name, data in steps]


Events = Callable[[dict[str, Any], Answer], list[bytes]]
Whole = Callable[[dict[str, Any], Answer], dict[str, Any]]
WIRES: dict[str, tuple[Events, Whole]] = {
    "chat/completions": (chat_events, chat_whole),
    "responses": (responses_events, responses_whole),
    "messages": (messages_events, messages_whole),
}


# --- the server -------------------------------------------------------------------------------


def scripted_app(recorder: Recorder, script: Script) -> web.Application:
    """An app that records every request and answers each generation with `script`'s answer."""

    async def handle(request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else None
        except ValueError:
            body = None
        body = body if isinstance(body, dict) else None
        recorder.add(Captured(request.method, request.path_qs, body, time.time()))
        path = request.path.rstrip("/")
        if request.method in ("HEAD", "GET") and path == "":
            return web.Response(text="ok")
        if request.method == "GET" and path.endswith("/models"):
            model = {"id": "auto", "object": "model", "created": 0, "owned_by": "capture"}
            model |= {"type": "model", "display_name": "auto", "created_at": "2026-01-01T00:00:00Z"}
            return web.json_response(
                {"object": "list", "data": [model], "has_more": False, "first_id": "auto"}
            )
        if request.method == "POST" and path.endswith("/messages/count_tokens"):
            return web.json_response({"input_tokens": 1})
        kind = next((k for k in WIRES if path.endswith(k)), None)
        if request.method != "POST" or kind is None or body is None:
            return web.json_response({"error": {"message": f"not captured: {path}"}}, status=404)
        events, whole = WIRES[kind]
        answer = script(request.path_qs, body)
        if not body.get("stream"):
            return web.json_response(whole(body, answer))
        response = web.StreamResponse(headers={"Content-Type": "text/event-stream"})
        await response.prepare(request)
        for event in events(body, answer):
            await response.write(event)
        await response.write_eof()
        return response

    app = web.Application(client_max_size=64 * 1024 * 1024)
    app.router.add_route("*", "/{tail:.*}", handle)
    return app


@contextmanager
def serve(app: web.Application) -> Iterator[str]:
    """The app on a free loopback port, in a thread; yields its base URL."""
    loop = asyncio.new_event_loop()
    runner = web.AppRunner(app, access_log=None)
    port = free_port()
    loop.run_until_complete(runner.setup())
    loop.run_until_complete(web.TCPSite(runner, "127.0.0.1", port).start())
    thread = threading.Thread(target=loop.run_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        asyncio.run_coroutine_threadsafe(runner.cleanup(), loop).result(10)
        loop.call_soon_threadsafe(loop.stop)
        thread.join(10)
        loop.close()


def free_port() -> int:
    """A TCP port nothing listens on now."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
