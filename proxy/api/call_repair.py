"""Answers that are tool calls written as text, sent as the calls they are, whole or streamed.

A stream holds back only an answer whose first characters could start a call
(proxy.api.text_calls.could_be_calls) and releases it, as it came, the moment it cannot be one;
every other answer passes untouched. A held answer that ends as calls of the declared tools is
sent as its API's own calls: OpenAI `tool_calls`, Anthropic `tool_use` blocks, Responses
`function_call` items, each with a fresh id. While an answer is held, the client still gets an
event now and then (agents give up on a silent stream).
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from enum import Enum
from typing import Any

from proxy.api.errors import ApiError
from proxy.api.rewrite import StreamRewriter
from proxy.api.text_calls import TextCall, ToolCatalog, could_be_calls
from proxy.sse import EVENT, SseSplitter, data_of

# The header of a whole answer whose calls were written as text.
REPAIRED_HEADER = "X-Specproxy-Repaired-Tool-Calls"
# Seconds a held answer may go without the client hearing from the stream.
KEEPALIVE_S = 15.0


@dataclass
class CallRepair:
    """One request's repair: its declared tools, and how many calls its answer became."""

    catalog: ToolCatalog
    repaired: int = 0
    clock: Callable[[], float] = field(default=time.monotonic, repr=False)

    def whole(self, answer: Any) -> Any:
        """A whole answer of the request's API, its text made calls where it is calls."""
        if not isinstance(answer, dict):
            return answer
        fix = {"chat": _whole_chat, "messages": _whole_messages, "responses": _whole_responses}
        calls = fix[self.catalog.api](answer, self.catalog)
        self.repaired += calls
        return answer

    def stream(self, inner: StreamRewriter) -> StreamRewriter:
        """`inner` (the surface's own rewriter), fed what the held answer becomes."""
        kinds = {"chat": _ChatStream, "messages": _MessagesStream, "responses": _ResponsesStream}
        return kinds[self.catalog.api](self, inner)


def _marker(calls: list[TextCall]) -> bytes:
    """An SSE comment, which clients skip, saying the stream's calls were written as text."""
    return f": specproxy: {len(calls)} tool call(s) written as text, sent as calls".encode()


def _event(name: str | None, data: dict[str, Any]) -> bytes:
    head = f"event: {name}\n".encode() if name else b""
    return head + b"data: " + json.dumps(data, ensure_ascii=False).encode() + EVENT


# Whole answers.


def _whole_chat(answer: dict[str, Any], catalog: ToolCatalog) -> int:
    choices = answer.get("choices")
    if not isinstance(choices, list) or len(choices) != 1 or not isinstance(choices[0], dict):
        return 0
    choice = choices[0]
    message = choice.get("message")
    if choice.get("finish_reason") != "stop" or not isinstance(message, dict):
        return 0
    text = message.get("content")
    if message.get("tool_calls") or not isinstance(text, str):
        return 0
    calls = catalog.calls_in(text)
    if not calls:
        return 0
    message["content"] = None
    message["tool_calls"] = [_openai_call(c) for c in calls]
    choice["finish_reason"] = "tool_calls"
    return len(calls)


def _openai_call(call: TextCall, index: int | None = None) -> dict[str, Any]:
    shaped: dict[str, Any] = {
        "id": f"call_{call.id}",
        "type": "function",
        "function": {"name": call.name, "arguments": call.arguments_json},
    }
    return shaped if index is None else {"index": index, **shaped}


def _tool_use(call: TextCall) -> dict[str, Any]:
    return {
        "type": "tool_use",
        "id": f"toolu_{call.id}",
        "name": call.name,
        "input": call.arguments,
    }


def _function_call(call: TextCall, status: str = "completed") -> dict[str, Any]:
    return {
        "id": f"fc_{call.id}",
        "type": "function_call",
        "status": status,
        "arguments": call.arguments_json if status == "completed" else "",
        "call_id": f"call_{call.id}",
        "name": call.name,
    }


def _whole_messages(answer: dict[str, Any], catalog: ToolCatalog) -> int:
    content = answer.get("content")
    if answer.get("stop_reason") != "end_turn" or not isinstance(content, list):
        return 0
    texts = [i for i, b in enumerate(content) if isinstance(b, dict) and b.get("type") == "text"]
    others = [b for b in content if not (isinstance(b, dict) and b.get("type") in _THINKING)]
    if len(texts) != 1 or len(others) != 1:
        return 0
    calls = catalog.calls_in(str(content[texts[0]].get("text", "")))
    if not calls:
        return 0
    at = texts[0]
    answer["content"] = [*content[:at], *(_tool_use(c) for c in calls), *content[at + 1 :]]
    answer["stop_reason"] = "tool_use"
    return len(calls)


_THINKING = ("thinking", "redacted_thinking")


def _whole_responses(answer: dict[str, Any], catalog: ToolCatalog) -> int:
    output = answer.get("output")
    if answer.get("status") != "completed" or not isinstance(output, list):
        return 0
    kinds = [i.get("type") if isinstance(i, dict) else None for i in output]
    if kinds.count("message") != 1 or any(k not in ("message", "reasoning") for k in kinds):
        return 0
    at = kinds.index("message")
    parts = output[at].get("content")
    if not isinstance(parts, list) or not parts:
        return 0
    if any(not isinstance(p, dict) or p.get("type") != "output_text" for p in parts):
        return 0
    calls = catalog.calls_in("".join(str(p.get("text", "")) for p in parts))
    if not calls:
        return 0
    answer["output"] = [*output[:at], *(_function_call(c) for c in calls), *output[at + 1 :]]
    return len(calls)


# Streams.


class _State(Enum):
    WAITING = "waiting"  # no answer text yet
    HOLDING = "holding"  # text that could still be calls
    PASSING = "passing"  # decided: everything passes as it comes


class _HeldStream:
    """The part every API's held stream shares: events split, held, released, kept alive."""

    def __init__(self, repair: CallRepair, inner: StreamRewriter) -> None:
        self._repair = repair
        self._inner = inner
        self._events = SseSplitter(EVENT)
        self._state = _State.WAITING
        self._held: list[bytes] = []
        self._text = ""
        self._last_out = repair.clock()

    @property
    def ended(self) -> bool:
        """Whether the client had the stream's last event."""
        return self._inner.ended

    def feed(self, chunk: bytes) -> bytes:
        """What the client gets of this chunk: events of a held answer wait."""
        out = b"".join(self._on(event) for event in self._events.feed(chunk))
        quiet_s = self._repair.clock() - self._last_out
        if not out and self._state is _State.HOLDING and quiet_s >= KEEPALIVE_S:
            out = self._keepalive()
        if out:
            self._last_out = self._repair.clock()
        return self._inner.feed(out)

    def flush(self) -> bytes:
        """What is left when the upstream ends: a held answer as it came."""
        rest = self._release() + self._events.flush()
        return self._inner.feed(rest) + self._inner.flush()

    def fail(self, error: ApiError) -> bytes:
        """The held text first, so the client has what was generated, then the API's error."""
        return self._inner.feed(self._release()) + self._inner.fail(error)

    def _on(self, event: bytes) -> bytes:
        if self._state is _State.PASSING or event.startswith(b":"):
            return event + EVENT
        return self._event(event, data_of(_data_line(event)))

    def _event(self, event: bytes, data: Any) -> bytes:
        raise NotImplementedError

    def _keepalive(self) -> bytes:
        raise NotImplementedError

    def _hold(self, event: bytes) -> bytes:
        self._state = _State.HOLDING
        self._held.append(event + EVENT)
        return b""

    def _text_arrived(self, event: bytes, text: str) -> bytes:
        """Held while the answer so far could be calls; else released with what was held."""
        self._text += text
        if could_be_calls(self._text):
            return self._hold(event)
        return self._release() + event + EVENT

    def _release(self) -> bytes:
        self._state = _State.PASSING
        held, self._held = self._held, []
        return b"".join(held)

    def _calls(self) -> list[TextCall] | None:
        """The held answer as calls, counted; None where it is text."""
        calls = self._repair.catalog.calls_in(self._text)
        if calls:
            self._repair.repaired += len(calls)
            self._state = _State.PASSING
            self._held = []
        return calls


def _data_line(event: bytes) -> bytes:
    for line in event.split(b"\n"):
        if line.startswith(b"data:"):
            return line
    return b""


class _ChatStream(_HeldStream):
    """OpenAI chat chunks: content deltas held, then one tool_calls delta and its finish."""

    def _event(self, event: bytes, data: Any) -> bytes:
        choices = data.get("choices") if isinstance(data, dict) else None
        if not isinstance(choices, list) or not choices:
            # [DONE], or the usage chunk after the finish: the answer is decided by then.
            return (self._release() if self._state is _State.HOLDING else b"") + event + EVENT
        choice = choices[0]
        if len(choices) != 1 or not isinstance(choice, dict) or choice.get("index", 0) != 0:
            return self._release() + event + EVENT  # several choices: not ours to merge
        delta = choice.get("delta")
        delta = delta if isinstance(delta, dict) else {}
        if delta.get("tool_calls"):
            return self._release() + event + EVENT  # the server parsed calls itself
        content = delta.get("content")
        finish = choice.get("finish_reason")
        if isinstance(content, str) and content:
            out = self._text_arrived(event, content)
            if not finish or self._state is _State.PASSING:
                return out
        elif self._state is not _State.HOLDING:
            return event + EVENT  # the role, reasoning, or an answer without text
        elif not finish:
            return self._hold(event)
        else:
            self._hold(event)
        calls = self._calls() if finish == "stop" else None
        return self._as_calls(data, calls) if calls else self._release()

    def _as_calls(self, data: dict[str, Any], calls: list[TextCall]) -> bytes:
        head = {k: v for k, v in data.items() if k not in ("choices", "timings", "usage")}
        delta = {"tool_calls": [_openai_call(c, i) for i, c in enumerate(calls)]}
        first = {**head, "choices": [{"index": 0, "delta": delta, "finish_reason": None}]}
        finish = {**data, "choices": [{**data["choices"][0], "delta": {}}]}
        finish["choices"][0]["finish_reason"] = "tool_calls"
        return _marker(calls) + EVENT + _event(None, first) + _event(None, finish)

    def _keepalive(self) -> bytes:
        return b": specproxy: holding an answer that may be a tool call" + EVENT


class _MessagesStream(_HeldStream):
    """Anthropic Messages events: the text block held, then tool_use blocks in its place."""

    def __init__(self, repair: CallRepair, inner: StreamRewriter) -> None:
        super().__init__(repair, inner)
        self._index = 0  # the held text block's
        self._opened = False  # its content_block_start went out (to keep the stream alive)

    def _event(self, event: bytes, data: Any) -> bytes:
        kind = data.get("type") if isinstance(data, dict) else None
        if self._state is _State.WAITING:
            block = data.get("content_block") if kind == "content_block_start" else None
            if isinstance(block, dict) and block.get("type") == "text":
                self._index = int(data.get("index", 0))
                return self._hold(event)
            return event + EVENT
        # Holding: the text block's own events wait; any other block ends the hold.
        assert isinstance(data, dict)
        if kind == "ping":
            return event + EVENT
        if data.get("index") == self._index and kind == "content_block_delta":
            delta = data.get("delta")
            if isinstance(delta, dict) and delta.get("type") == "text_delta":
                return self._text_arrived(event, str(delta.get("text", "")))
        if data.get("index") == self._index and kind == "content_block_stop":
            return self._hold(event)
        if kind == "message_delta":
            stop = data.get("delta", {}).get("stop_reason")
            calls = self._calls() if stop == "end_turn" else None
            if calls:
                return self._as_calls(data, calls)
        return self._release() + event + EVENT

    def _as_calls(self, data: dict[str, Any], calls: list[TextCall]) -> bytes:
        out = _marker(calls) + EVENT
        index = self._index
        if self._opened:
            out += _event("content_block_stop", {"type": "content_block_stop", "index": index})
            index += 1
        for at, call in enumerate(calls, start=index):
            start = {**_tool_use(call), "input": {}}
            out += _event(
                "content_block_start",
                {"type": "content_block_start", "index": at, "content_block": start},
            )
            partial = {"type": "input_json_delta", "partial_json": call.arguments_json}
            out += _event(
                "content_block_delta",
                {"type": "content_block_delta", "index": at, "delta": partial},
            )
            out += _event("content_block_stop", {"type": "content_block_stop", "index": at})
        delta = {**data, "delta": {**data.get("delta", {}), "stop_reason": "tool_use"}}
        return out + _event("message_delta", delta)

    def _keepalive(self) -> bytes:
        """The held text block opened (once), then an empty delta: real events, which Claude
        Code counts as the stream being alive (it does not count `ping`)."""
        if not self._opened:
            self._opened = True
            return self._held.pop(0)
        empty = {"type": "text_delta", "text": ""}
        return _event(
            "content_block_delta",
            {"type": "content_block_delta", "index": self._index, "delta": empty},
        )


class _ResponsesStream(_HeldStream):
    """Responses events: the message item held, then function_call items in its place."""

    def __init__(self, repair: CallRepair, inner: StreamRewriter) -> None:
        super().__init__(repair, inner)
        self._item = ""  # the held message item's id
        self._response: dict[str, Any] = {}

    def _event(self, event: bytes, data: Any) -> bytes:
        kind = data.get("type") if isinstance(data, dict) else None
        if kind == "response.created" and isinstance(data.get("response"), dict):
            self._response = data["response"]
        if self._state is _State.WAITING:
            item = data.get("item") if kind == "response.output_item.added" else None
            if isinstance(item, dict) and item.get("type") == "message":
                self._item = str(item.get("id", ""))
                return self._hold(event)
            return event + EVENT
        assert isinstance(data, dict)
        if kind == "response.output_text.delta" and data.get("item_id") == self._item:
            return self._text_arrived(event, str(data.get("delta", "")))
        if kind == "response.completed" and isinstance(data.get("response"), dict):
            calls = self._calls()
            if calls:
                return self._as_calls(data, calls)
            return self._release() + event + EVENT
        mine = data.get("item_id") == self._item or (
            isinstance(data.get("item"), dict) and data["item"].get("id") == self._item
        )
        if mine and kind in _HELD_ITEM_EVENTS:
            return self._hold(event)
        return self._release() + event + EVENT

    def _as_calls(self, data: dict[str, Any], calls: list[TextCall]) -> bytes:
        out = _marker(calls) + EVENT
        for call in calls:
            item_id = f"fc_{call.id}"
            added = {
                "type": "response.output_item.added",
                "item": _function_call(call, "in_progress"),
            }
            out += _event("response.output_item.added", added)
            arguments = call.arguments_json
            for kind, key in (
                ("response.function_call_arguments.delta", "delta"),
                ("response.function_call_arguments.done", "arguments"),
            ):
                out += _event(kind, {"type": kind, "item_id": item_id, key: arguments})
            done = {"type": "response.output_item.done", "item": _function_call(call)}
            out += _event("response.output_item.done", done)
        response = dict(data["response"])
        output = response.get("output")
        if isinstance(output, list):
            items = [_function_call(c) for c in calls]
            at = next(
                (
                    i
                    for i, o in enumerate(output)
                    if isinstance(o, dict) and o.get("id") == self._item
                ),
                None,
            )
            response["output"] = (
                [*output[:at], *items, *output[at + 1 :]] if at is not None else [*output, *items]
            )
        return out + _event(data["type"], {**data, "response": response})

    def _keepalive(self) -> bytes:
        """A repeated `response.in_progress`: an event Codex reads as the stream being alive."""
        response = {
            "id": self._response.get("id", ""),
            "object": "response",
            "status": "in_progress",
        }
        return _event(
            "response.in_progress", {"type": "response.in_progress", "response": response}
        )


_HELD_ITEM_EVENTS = frozenset(
    {
        "response.content_part.added",
        "response.output_text.done",
        "response.content_part.done",
        "response.output_item.done",
    }
)
