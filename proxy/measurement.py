"""Measurement: what the relay saw of one request's answer; only the relay writes it."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.tokens import StreamTally

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

    @property
    def settled(self) -> bool:
        """Whether llama-server finished the request: a 200 relayed to its end."""
        return self.status == 200 and self.error is None

    def settle(self) -> None:
        """Take a stream's token counts from what it carried (its last timings, or usage)."""
        if self.tally is not None:
            self.timings = self.tally.counts() or self.timings
            self.tally = None
