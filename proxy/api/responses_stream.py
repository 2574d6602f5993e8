"""Responses streams: the indices llama-server b11434 leaves out, filled in on the way through.

Its events lack `sequence_number`, `output_index` and `content_index`, and its text events lack
`logprobs`; the OpenAI SDK's accumulating helper (`client.responses.stream()`) indexes its
snapshot with them and fails with a TypeError. Items are numbered in the order they are added
(by item id), content parts in the order each item adds them.
"""

from __future__ import annotations

import json
import time
import uuid
from typing import Any

from proxy.api.errors import ApiError, from_upstream
from proxy.api.rewrite import EventRewriter, join_event, split_event

_TERMINAL = frozenset({"response.completed", "response.failed", "response.incomplete"})

_TEXT_EVENTS = frozenset(
    {
        "response.output_text.delta",
        "response.output_text.done",
        "response.reasoning_text.delta",
        "response.reasoning_text.done",
        "response.content_part.done",
    }
)


class ResponsesStreamFix(EventRewriter):
    """Adds the missing indices to each event of one Responses stream."""

    LAST_EVENT = "response.completed"

    def __init__(self) -> None:
        super().__init__()
        self._sequence = 0
        self._items: dict[str, int] = {}
        self._parts: dict[str, int] = {}
        self._response: dict[str, Any] = {}

    def rewrite(self, event: bytes) -> bytes:
        """The event with sequence_number, output_index and content_index where they belong."""
        lines, at, data = split_event(event)
        if isinstance(data, dict) and "error" in data and "type" not in data:
            # llama-server's mid-stream error has chat's shape here; Codex waits for a
            # response.failed and retries a stream that closes without one.
            error = from_upstream(data, raw=b"the backend failed mid-stream")
            return self.fail(error).rstrip(b"\n")
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            return event
        self._fill(data)
        if data["type"] == "response.created" and isinstance(data.get("response"), dict):
            self._response = data["response"]
        self._ended = self._ended or data["type"] in _TERMINAL
        return join_event(lines, at, data)

    def fail(self, error: ApiError) -> bytes:
        """An `error` event and a `response.failed`, as the Responses API ends a failed stream."""
        self._ended = True
        code, message = error.code, error.message
        event: dict[str, Any] = {"type": "error", "code": code, "message": message, "param": None}
        response = {
            "id": self._response.get("id") or f"resp_{uuid.uuid4().hex}",
            "object": "response",
            "created_at": self._response.get("created_at") or int(time.time()),
            "model": self._response.get("model", ""),
            "status": "failed",
            "error": {"code": code, "message": message},
            "incomplete_details": None,
            "output": [],
        }
        failed: dict[str, Any] = {"type": "response.failed", "response": response}
        out = b""
        for name, data in (("error", event), ("response.failed", failed)):
            data["sequence_number"] = self._sequence
            self._sequence += 1
            out += f"event: {name}\ndata: ".encode() + json.dumps(data).encode() + b"\n\n"
        return out

    def _fill(self, data: dict[str, Any]) -> None:
        kind = data["type"]
        data.setdefault("sequence_number", self._sequence)
        self._sequence += 1
        item = data.get("item")
        if isinstance(item, dict) and kind.startswith("response.output_item."):
            data.setdefault("output_index", self._index_of(item.get("id")))
            return
        item_id = data.get("item_id")
        if not isinstance(item_id, str):
            return
        data.setdefault("output_index", self._index_of(item_id))
        if kind == "response.content_part.added":
            data.setdefault("content_index", self._parts.get(item_id, 0))
            self._parts[item_id] = self._parts.get(item_id, 0) + 1
        elif kind in _TEXT_EVENTS:
            # llama-server gives an item at most one part: the latest one is the one meant.
            data.setdefault("content_index", max(self._parts.get(item_id, 1) - 1, 0))
            if kind.startswith("response.output_text."):
                data.setdefault("logprobs", [])

    def _index_of(self, item_id: object) -> int:
        key = item_id if isinstance(item_id, str) else f"#{len(self._items)}"
        return self._items.setdefault(key, len(self._items))
