"""RoutePolicy: choose the backend for a request from health, load and measured speed."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from proxy.routing.scoreboard import Scoreboard, load_level

RouteReason = Literal[
    "pinned", "fastest", "unmeasured", "explore", "demoted", "only_healthy", "least_loaded"
]


class RoutableBackend(Protocol):
    """What the policy needs to know about a backend."""

    name: str
    in_flight: int

    @property
    def ready(self) -> bool: ...

    @property
    def spec_type(self) -> str | None: ...


@dataclass(frozen=True)
class RouteChoice:
    """The chosen backend, why, and the load level the request runs at."""

    backend: str
    reason: RouteReason
    level: int


class RoutePolicy:
    """Fastest measured backend for the task at the current load, with bounded exploration."""

    def __init__(
        self,
        scoreboard: Scoreboard,
        explore_share: float = 0.05,
        min_acceptance: float = 0.3,
        rng: random.Random | None = None,
    ) -> None:
        self.scoreboard = scoreboard
        self.explore_share = explore_share
        self.min_acceptance = min_acceptance
        self.rng = rng or random.Random()

    def choose(self, task: str, backends: Sequence[RoutableBackend]) -> RouteChoice | None:
        """A backend for an `auto` request, or None when no backend is ready."""
        ready = [b for b in backends if b.ready]
        if not ready:
            return None
        if len(ready) == 1:
            b = ready[0]
            return RouteChoice(b.name, "only_healthy", load_level(b.in_flight + 1))
        scored = []
        for b in ready:
            level = load_level(b.in_flight + 1)
            est = self.scoreboard.nearest(b.name, task, level)
            if est is None:
                return RouteChoice(b.name, "unmeasured", level)
            demoted = (
                b.spec_type is not None
                and est.acceptance is not None
                and est.acceptance < self.min_acceptance
            )
            scored.append((demoted, -est.tokens_per_s, b.in_flight, b, level))
        scored.sort(key=lambda row: row[:3])
        demoted, _, _, best, level = scored[0]
        if self.rng.random() < self.explore_share:
            other = self.rng.choice([row for row in scored if row[3] is not best] or scored)
            return RouteChoice(other[3].name, "explore", other[4])
        return RouteChoice(best.name, "demoted" if demoted else "fastest", level)
