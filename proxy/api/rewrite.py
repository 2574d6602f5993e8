"""Server-sent events: whole events out of a byte stream, so a surface can rewrite them."""

from __future__ import annotations

import json
from typing import Any, Protocol

from proxy.api.errors import ApiError
from proxy.sse import EVENT, SseSplitter, data_of

_END = EVENT


class StreamRewriter(Protocol):
    """Turns upstream SSE bytes into what the client gets, and ends the stream as its API does."""

    def feed(self, chunk: bytes) -> bytes:
        """Rewritten whole events from this chunk; an incomplete tail waits for the next."""
        ...

    def flush(self) -> bytes:
        """Whatever is left when the upstream stream ends, and the API's end if it lacked one."""
        ...

    def fail(self, error: ApiError) -> bytes:
        """The API's error event(s) that end a stream the proxy cannot finish."""
        ...

    @property
    def ended(self) -> bool:
        """Whether the client has had the event that ends the stream (a client that leaves
        after it left a finished answer)."""
        ...


class EventRewriter:
    """Splits the stream into events and passes each through `rewrite`; subclasses override it,
    set `_ended` when their API's last event goes by, and say how their API fails a stream."""

    # The event that ends a stream of the subclass's API, for the error when it is missing.
    LAST_EVENT = "its last event"

    def __init__(self) -> None:
        self._events = SseSplitter(EVENT)
        self._ended = False

    @property
    def ended(self) -> bool:
        """Whether the event that ends the stream went by."""
        return self._ended

    def feed(self, chunk: bytes) -> bytes:
        """Rewritten whole events from this chunk; an incomplete tail waits for the next."""
        return b"".join(self.rewrite(event) + _END for event in self._events.feed(chunk))

    def flush(self) -> bytes:
        """What is left when the upstream stream ends, and the API's error if it ended early."""
        rest = self._events.flush()
        rest = self.rewrite(rest) if rest.strip() else rest
        if self._ended:
            return rest
        if rest.strip():
            rest = rest.rstrip(b"\n") + _END
        early = f"the backend ended the stream before {self.LAST_EVENT}"
        return rest + self.fail(ApiError(502, early, code="upstream_error"))

    def fail(self, error: ApiError) -> bytes:
        """The API's error event(s) that end a stream the proxy cannot finish."""
        raise NotImplementedError

    def rewrite(self, event: bytes) -> bytes:
        """One event (its lines, without the blank line that ends it), rewritten."""
        return event


def split_event(event: bytes) -> tuple[list[bytes], int, Any]:
    """An event's lines, the index of its `data:` line (-1 if none) and that data parsed."""
    lines = event.split(b"\n")
    for i, line in enumerate(lines):
        if line.startswith(b"data:"):
            return lines, i, data_of(line)
    return lines, -1, None


def join_event(lines: list[bytes], index: int, data: Any) -> bytes:
    """The event with its `data:` line replaced by data."""
    lines[index] = b"data: " + json.dumps(data, ensure_ascii=False).encode()
    return b"\n".join(lines)
