"""Measurement: what the relay saw of one request, read by routing and metrics alike."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from proxy.tokens import StreamTally


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
    device_wait_s: float = 0.0
    # Requests decoding at once on its device, on average over its life (itself included).
    mean_load: float | None = None
    tally: StreamTally | None = None
    # Whether the client had the stream's last event: one that leaves after it (Codex closes at
    # response.completed) left a finished answer, not an abandoned one.
    answered: bool = False
    # Whether other programs took a good share of the machine's CPUs while it ran.
    contended: bool = False

    def settle(self) -> None:
        """Take a stream's token counts from what it carried (its last timings, or usage)."""
        if self.tally is not None:
            self.timings = self.tally.counts() or self.timings
            self.tally = None
