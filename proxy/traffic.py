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
    """Where start-up calibration is, for /health: waiting for backends, running, done, off."""

    state: Literal["waiting", "running", "done", "off"] = "waiting"
    requests: int = 0
