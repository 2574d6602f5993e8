"""One request of a captured agent's edit session over HTTP, on the agent's surface, measured."""

from __future__ import annotations

import contextlib
import json
import time
from typing import Any

import requests

from loadtests.edit_sessions import EditSession, ScriptedTurn, surface_kind
from loadtests.sessions.client import TurnResult
from proxy.llamacpp import Timings

# The cap on each answer by step: a read call and "done" are a few dozen tokens; an edit is the
# whole file again (about 500 tokens), or a patch.
MAX_TOKENS = {"open": 64, "edit": 600, "close": 64}


def request_body(surface: str, turn: ScriptedTurn, model: str, max_tokens: int) -> dict[str, Any]:
    """The turn's body as its agent sent it, for one model, whole (not streamed), temperature 0
    and capped at max_tokens."""
    body = dict(turn.body)
    body["model"] = model
    body["stream"] = False
    body["temperature"] = 0
    body.pop("stream_options", None)
    if surface_kind(surface) == "responses":
        body["max_output_tokens"] = max_tokens
    else:
        body["max_tokens"] = max_tokens
        body.pop("max_completion_tokens", None)
    return body


def parts_of(surface: str, data: dict[str, Any]) -> tuple[str, list[tuple[str, str]], int]:
    """(text, tool calls as (name, arguments JSON), tokens generated) of a whole answer."""
    kind = surface_kind(surface)
    texts: list[str] = []
    calls: list[tuple[str, str]] = []
    usage = data.get("usage") or {}
    if kind == "messages":
        for block in data.get("content") or []:
            if block.get("type") == "text":
                texts.append(str(block.get("text") or ""))
            elif block.get("type") == "tool_use":
                calls.append((str(block.get("name")), json.dumps(block.get("input"))))
        return "".join(texts), calls, int(usage.get("output_tokens") or 0)
    if kind == "responses":
        for item in data.get("output") or []:
            if item.get("type") == "message":
                texts += [str(p.get("text") or "") for p in item.get("content") or []]
            elif item.get("type") in ("function_call", "custom_tool_call"):
                arguments = item.get("arguments") or json.dumps(item.get("input") or "")
                calls.append((str(item.get("name")), str(arguments)))
        return "".join(texts), calls, int(usage.get("output_tokens") or 0)
    message = (data.get("choices") or [{}])[0].get("message") or {}
    texts.append(str(message.get("content") or ""))
    for call in message.get("tool_calls") or []:
        function = call.get("function") or {}
        calls.append((str(function.get("name")), str(function.get("arguments") or "")))
    return "".join(texts), calls, int(usage.get("completion_tokens") or 0)


def answer_of(surface: str, data: dict[str, Any]) -> tuple[str, list[str], int]:
    """(text with each tool call's arguments after it, names of the tools called, tokens
    generated) of a whole answer on a surface."""
    text, calls, generated = parts_of(surface, data)
    return text + "".join(a for _, a in calls), [n for n, _ in calls], generated


def as_written(surface: str, data: dict[str, Any]) -> str:
    """A whole answer as the model wrote it: its text, then each tool call the server parsed
    out of it put back in Qwen2.5's `<tool_call>` format (arguments re-serialized)."""
    text, calls, _ = parts_of(surface, data)
    for name, arguments in calls:
        with contextlib.suppress(ValueError):
            arguments = json.dumps(json.loads(arguments))
        text += f'<tool_call>\n{{"name": "{name}", "arguments": {arguments}}}\n</tool_call>'
    return text


def send_edit_turn(
    http: requests.Session,
    base_url: str,
    session: EditSession,
    index: int,
    model: str,
    max_tokens: dict[str, int] | None = None,
    timeout_s: float = 1800,
) -> TurnResult:
    """Request `index` of the session on base_url, measured: wall time, llama.cpp's timings
    (where the answer has them), the proxy's headers and what the model answered."""
    turn = session.turns[index]
    cap = (max_tokens or MAX_TOKENS)[turn.step]
    result = TurnResult(session.id, "captured-edits", index, turn.step, cap)
    body = request_body(session.surface, turn, model, cap)
    t0 = time.perf_counter()
    try:
        resp = http.post(
            f"{base_url.rstrip('/')}{session.path}", json=body, timeout=(10, timeout_s)
        )
    except requests.RequestException as exc:
        result.error = f"{exc.__class__.__name__}: {exc}"
        result.seconds = time.perf_counter() - t0
        return result
    result.seconds = time.perf_counter() - t0
    if not result.take_status(resp):
        return result
    try:
        data = resp.json()
    except ValueError as exc:
        result.error = f"not JSON: {exc}"
        return result
    text, calls, generated = answer_of(session.surface, data)
    timings = Timings.parse(data.get("timings") or {})
    result.prompt_n, result.cache_n = timings.prompt_n, timings.cache_n
    result.predicted_n = timings.predicted_n or generated
    result.predicted_per_second = timings.tokens_per_s or None
    result.draft_n, result.draft_n_accepted = timings.draft_n, timings.draft_n_accepted
    result.answer = json.dumps({"text": text, "tools": calls})
    result.tools_called = calls
    result.content_chars = len(text)
    return result
