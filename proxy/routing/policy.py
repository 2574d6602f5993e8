"""RoutePolicy: choose the backend for a request from health, load and measured speed."""

from __future__ import annotations

import random
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal, Protocol

from proxy.routing.scoreboard import Estimate, Scoreboard, load_level

RouteReason = Literal[
    "pinned",
    "fastest",
    "unmeasured",
    "explore",
    "demoted",
    "only_healthy",
    "join_batch",
    "within_margin",
]


# On a shared device, how much slower than the best a busy backend may be and still be joined:
# splitting costs far more than a near-tie (0.4 against 9 tokens/s measured for two streams on
# 2 cores), while a probe on a backend at half speed should not drag traffic along.
JOIN_MARGIN = 0.5


class RoutableBackend(Protocol):
    """What the policy needs to know about a backend."""

    name: str
    in_flight: int

    @property
    def ready(self) -> bool: ...

    @property
    def spec_type(self) -> str | None: ...

    @property
    def draft_n_max(self) -> int: ...

    @property
    def saturated(self) -> bool: ...

    @property
    def queue_full(self) -> bool: ...


@dataclass(frozen=True)
class RouteChoice:
    """The chosen backend, why, and the load level the request runs at."""

    backend: str
    reason: RouteReason
    level: int


def speedup(acceptance: float, n_max: int, cost: float) -> float:
    """Expected speed-up of speculation over plain decoding (Leviathan et al., 2023, eq. 1).

    acceptance: chance a drafted token is accepted; n_max: tokens drafted per step; cost: one
    draft step's time relative to one target step (0 for n-gram lookup).
    """
    a = min(acceptance, 0.999)
    return (1 - a ** (n_max + 1)) / ((1 - a) * (n_max * cost + 1))


def break_even_acceptance(acceptance: float, speed_ratio: float, n_max: int) -> float | None:
    """Acceptance below which a speculative backend is slower than plain decoding.

    The draft cost is fitted so the model reproduces the measured speed ratio at the measured
    long-run acceptance; None when even perfect acceptance could not break even.
    """
    if speed_ratio <= 0:
        return None
    cost = max(0.0, (speedup(acceptance, n_max, 0.0) / speed_ratio - 1) / n_max)
    if speedup(0.999, n_max, cost) < 1:
        return None
    lo, hi = 0.0, 0.999
    for _ in range(30):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if speedup(mid, n_max, cost) < 1 else (lo, mid)
    return hi


class RoutePolicy:
    """Fastest measured backend for the task at the current load, with bounded exploration."""

    def __init__(
        self,
        scoreboard: Scoreboard,
        explore_share: float = 0.05,
        spill_over: bool = False,
        speculation_margin: float = 0.05,
        rng: random.Random | None = None,
    ) -> None:
        self.scoreboard = scoreboard
        self.explore_share = explore_share
        self.spill_over = spill_over
        self.speculation_margin = speculation_margin
        self.rng = rng or random.Random()

    def level(self, backend: RoutableBackend, backends: Sequence[RoutableBackend]) -> int:
        """The load level a new request on `backend` runs at.

        Backends on one device share its compute, so the level counts every request in flight
        there: a request on an idle n-gram backend next to four busy plain streams does not run
        at level 1. On separate devices only the backend's own requests count.
        """
        if self.spill_over:
            return load_level(backend.in_flight + 1)
        return load_level(sum(b.in_flight for b in backends) + 1)

    def choose(self, task: str, backends: Sequence[RoutableBackend]) -> RouteChoice | None:
        """A backend for an `auto` request, or None when no backend is ready."""
        ready = [b for b in backends if b.ready]
        if not ready:
            return None
        # Backends on one device share its compute: a free slot elsewhere is no free capacity,
        # so requests queue at the fastest and move on only when its queue is full. Backends
        # on separate devices (spill_over) skip one whose slots are all busy.
        if self.spill_over:
            ready = [b for b in ready if not b.saturated] or ready
        else:
            ready = [b for b in ready if not b.queue_full] or ready
        levels = {b.name: self.level(b, backends) for b in ready}
        if len(ready) == 1:
            return RouteChoice(ready[0].name, "only_healthy", levels[ready[0].name])
        estimates: dict[str, Estimate] = {}
        for b in ready:
            est = self.scoreboard.nearest(b.name, task, levels[b.name])
            if est is None:
                return RouteChoice(b.name, "unmeasured", levels[b.name])
            estimates[b.name] = est
        demoted = {b.name for b in ready if self._below_break_even(b, ready, estimates)}
        plain = any(b.spec_type is None for b in ready)

        def credited(b: RoutableBackend) -> float:
            # Speculation must win by more than the noise: its speed swings with how
            # predictable each prompt is, and a rejected draft costs compute the device shares.
            tps = estimates[b.name].tokens_per_s
            return tps / (1 + self.speculation_margin) if plain and b.spec_type else tps

        ranked = sorted(ready, key=lambda b: (b.name in demoted, -credited(b), b.in_flight))
        best = ranked[0]
        if not self.spill_over:
            # Two llama-server processes decoding at once on one device fight over it (measured
            # on 2 cores: 2 streams split over plain and ngram made 0.4 tokens/s, 9 on either
            # alone), so a request joins a busy backend's batch unless that one is clearly
            # slower; a clearly slower one then drains, since nothing new joins it.
            # Judged on single-stream speed, the best-sampled estimate: per-level ones are few
            # and noisy, and one wrong split costs more than any near-tie.
            busy = [b for b in ranked if b.in_flight and b.name not in demoted]
            if busy and busy[0] is not best:
                alone = {b.name: self._single_stream(b.name, task) for b in ready}
                if alone[busy[0].name] >= (1 - JOIN_MARGIN) * max(alone.values()):
                    return RouteChoice(busy[0].name, "join_batch", levels[busy[0].name])
        # On one device a probe next to busy backends would slow them and be measured under
        # contention it did not cause, so it waits for an idle moment.
        idle = self.spill_over or not any(b.in_flight for b in backends)
        if len(ranked) > 1 and idle and self.rng.random() < self.explore_share:
            other = self._explore_target(ranked[1:], estimates[best.name], estimates)
            return RouteChoice(other.name, "explore", levels[other.name])
        fastest = max(ready, key=lambda b: estimates[b.name].tokens_per_s)
        reason: RouteReason = "fastest"
        if fastest.name in demoted:
            reason = "demoted"
        elif fastest.name != best.name and estimates[fastest.name].tokens_per_s > credited(best):
            reason = "within_margin"
        return RouteChoice(best.name, reason, levels[best.name])

    def _single_stream(self, backend: str, task: str) -> float:
        est = self.scoreboard.nearest(backend, task, 1)
        return est.tokens_per_s if est else 0.0

    def _explore_target(
        self,
        others: Sequence[RoutableBackend],
        best: Estimate,
        estimates: dict[str, Estimate],
    ) -> RoutableBackend:
        """A non-best backend to re-measure, drawn by the fourth power of its relative speed.

        A near-tie is where a stale estimate is most likely to hide a better choice, and a probe
        there costs little; a backend measured at half speed is still re-measured, 1/16 as often
        (the routing benchmark saw one probe on a half-speed draft cost 7 % of auto's time).
        """
        top = max(best.tokens_per_s, 1e-9)
        weights = [max(estimates[b.name].tokens_per_s / top, 0.1) ** 4 for b in others]
        return self.rng.choices(list(others), weights=weights)[0]

    def _below_break_even(
        self,
        backend: RoutableBackend,
        ready: Sequence[RoutableBackend],
        estimates: dict[str, Estimate],
    ) -> bool:
        """Whether recent acceptance fell below what this backend needs to beat plain decoding."""
        est = estimates[backend.name]
        plain = [estimates[b.name] for b in ready if b.spec_type is None]
        if backend.spec_type is None or not plain or est.acceptance is None:
            return False
        if est.recent_acceptance is None:
            return False
        baseline = max(p.tokens_per_s for p in plain)
        threshold = break_even_acceptance(
            est.acceptance, est.tokens_per_s / baseline, backend.draft_n_max
        )
        return threshold is None or est.recent_acceptance < threshold
