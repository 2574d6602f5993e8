"""Responses streams: the indices llama-server b11434 leaves out, filled in on the way through.

Its events lack `sequence_number`, `output_index` and `content_index`, and its text events lack
`logprobs`; the OpenAI SDK's accumulating helper (`client.responses.stream()`) indexes its
snapshot with them and fails with a TypeError. Items are numbered in the order they are added
(by item id), content parts in the order each item adds them.
"""

from __future__ import annotations

from typing import Any

from proxy.api.sse import EventRewriter, join_event, split_event

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

    def __init__(self) -> None:
        super().__init__()
        self._sequence = 0
        self._items: dict[str, int] = {}
        self._parts: dict[str, int] = {}

    def rewrite(self, event: bytes) -> bytes:
        """The event with sequence_number, output_index and content_index where they belong."""
        lines, at, data = split_event(event)
        if not isinstance(data, dict) or not isinstance(data.get("type"), str):
            return event
        self._fill(data)
        return join_event(lines, at, data)

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
