"""Users' requests in the proxy now, from arrival to record, and the proxy's own background work
(start-up calibration) that yields to them."""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from dataclasses import dataclass
from typing import Literal


class UserTraffic:
    """A count of users' requests in progress, and a wait for none."""

    def __init__(self) -> None:
        self.active = 0
        self._quiet = asyncio.Event()
        self._quiet.set()

    @contextlib.contextmanager
    def request(self) -> Iterator[None]:
        """Count one user's request for as long as it is in the proxy, waiting or running."""
        self.active += 1
        self._quiet.clear()
        try:
            yield
        finally:
            self.active -= 1
            if not self.active:
                self._quiet.set()

    async def quiet(self) -> None:
        """Return once no user's request is waiting or running."""
        await self._quiet.wait()


@dataclass
class CalibrationProgress:
    """Where start-up calibration is, for /health and the status page: its state, requests done
    of those planned, and the time left."""

    state: Literal["waiting", "running", "done", "off"] = "waiting"
    requests: int = 0  # measurements recorded
    planned: int = 0  # requests calibration means to send, known once the backends are ready
    done: int = 0  # of those, sent or passed over (a backend down, a class it refused)
    sent: int = 0  # of those done, sent to a backend
    sent_s: float = 0.0  # how long the sent ones took, waits for users' requests not included

    def step_taken(self, seconds: float | None) -> None:
        """One planned request done: sent, taking `seconds`, or passed over (None)."""
        self.done += 1
        if seconds is not None:
            self.sent += 1
            self.sent_s += seconds

    def eta_s(self) -> float | None:
        """Seconds left at the mean pace of the requests sent so far; None before the first."""
        if self.state == "done":
            return 0.0
        if self.state != "running" or not self.sent:
            return None
        return round(self.sent_s / self.sent * (self.planned - self.done), 1)

    def view(self) -> dict[str, object]:
        """What /health says of it."""
        return {
            "state": self.state,
            "requests": self.requests,
            "done": self.done,
            "planned": self.planned,
            "eta_s": self.eta_s(),
        }
