"""Server-sent events read from a byte stream: whole lines or events, and their `data:` JSON.

The one reader of SSE in the project: the relay, the token tally, the stream rewriters, the
load tests and the scripts all split streams here, so a chunk boundary in the middle of a line
is handled, once, the same way everywhere.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from typing import Any, Final

LINE: Final = b"\n"
EVENT: Final = b"\n\n"
DONE: Final = b"[DONE]"


class SseSplitter:
    """Whole pieces (lines, or events) out of chunks; an incomplete last piece waits."""

    def __init__(self, delimiter: bytes = LINE) -> None:
        self.delimiter = delimiter
        self._pending = b""

    def feed(self, chunk: bytes) -> list[bytes]:
        """The pieces this chunk completes, without their delimiter."""
        *whole, self._pending = (self._pending + chunk).split(self.delimiter)
        return whole

    def flush(self) -> bytes:
        """What is left of an unfinished last piece; the splitter is empty afterwards."""
        rest, self._pending = self._pending, b""
        return rest


def data_of(line: bytes) -> Any:
    """The JSON of a `data:` line; None for other lines, `[DONE]` and data that is not JSON."""
    if not line.startswith(b"data:"):
        return None
    payload = line[5:].strip()
    if not payload or payload == DONE:
        return None
    try:
        return json.loads(payload)
    except ValueError:
        return None


def is_done(line: bytes) -> bool:
    """Whether the line is OpenAI's `data: [DONE]`."""
    return line.startswith(b"data:") and line[5:].strip() == DONE


def _data_in(lines: Iterable[bytes]) -> Iterator[Any]:
    for line in lines:
        data = data_of(line.rstrip(b"\r"))
        if data is not None:
            yield data


def iter_data(chunks: Iterable[bytes]) -> Iterator[Any]:
    """The JSON of each `data:` line of a stream read synchronously (requests, http.client)."""
    splitter = SseSplitter()
    for chunk in chunks:
        yield from _data_in(splitter.feed(chunk))
    yield from _data_in([splitter.flush()])
