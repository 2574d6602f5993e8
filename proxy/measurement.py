"""Measurement: what the relay saw of one request's answer; only the relay writes it."""

from __future__ import annotations

import time
from collections.abc import Awaitable
from dataclasses import dataclass, field
from typing import Any, TypeVar

from proxy.tokens import StreamTally

T = TypeVar("T")
# The error of an answer whose client left before its end.
CLIENT_GONE = "client disconnected"


@dataclass
class Measurement:
    """What the relay saw of one request: status, first-token time and its token counts."""

    status: int = 0
    ttft_s: float | None = None
    duration_s: float = 0.0
    # llama.cpp's timings, or for answers without them the usage counts under the same keys
    # (proxy.tokens); a stream's are settled when it ends, however it ends.
    timings: dict[str, Any] = field(default_factory=dict)
    error: str | None = None
    tally: StreamTally | None = None
    # Whether the client had the stream's last event: one that leaves after it (Codex closes at
    # response.completed) left a finished answer, not an abandoned one.
    answered: bool = False
    # Seconds the relay spent waiting on others: the backend (connecting, its answer) and the
    # client (taking what was written). The rest of the relay's time is the proxy's own.
    waited_s: float = 0.0
    # Whether the connection failed (refused, reset): the one failure that says the server may
    # be gone. A bad answer or a slow connect does not; health checks decide the rest.
    connection_lost: bool = False
    # Tool calls the model wrote as text that the answer carries as calls (proxy.api.call_repair).
    repaired_calls: int = 0

    async def waiting(self, step: Awaitable[T]) -> T:
        """Await a step that waits on the backend or the client, its time counted as waited."""
        start = time.monotonic()
        try:
            return await step
        finally:
            self.waited_s += time.monotonic() - start

    @property
    def settled(self) -> bool:
        """Whether llama-server finished the request: a 200 relayed to its end."""
        return self.status == 200 and self.error is None

    def settle(self) -> None:
        """Take a stream's token counts from what it carried (its last timings, or usage)."""
        if self.tally is not None:
            self.timings = self.tally.counts() or self.timings
            self.tally = None
