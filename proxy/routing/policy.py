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
    "spill",
    "wait_device",
    "join_queue",
    "within_margin",
]


# How much slower than the best, at the load the request will run at, a backend that can start
# at once may be and still be taken instead of waiting for the best. The device scheduler never
# lets two backends decode at once on one device, so waiting moves the batch to the best once
# the one decoding now drains, while joining keeps every later request there too: under steady
# load the first request's choice holds for as long as the load lasts. The drain is not free,
# though: up to a whole answer at that load (15-50 s on two CPU cores), with the waiting
# requests idle. At 4-8 streams two cells of one backend differ by 10-15 % on this machine, and
# auto, at 10 %, moved four code streams from plain to ngram and back on such a difference and
# made 72 % of either; a measured gain below a quarter does not pay for the drain.
JOIN_MARGIN = 0.25
# The same for a backend on another device with room: the request would otherwise queue behind
# a full batch, and it takes nothing from the streams on the best backend's device.
SPILL_MARGIN = 0.5


class DeviceView(Protocol):
    """What the policy needs to know about the device a backend decodes on."""

    def admits(self, backend: str) -> bool: ...

    def next_up(self) -> str | None: ...


class RoutableBackend(Protocol):
    """What the policy needs to know about a backend."""

    name: str

    @property
    def load(self) -> int:
        """Requests in flight where its next request would go, other proxies' included."""
        ...

    @property
    def device(self) -> DeviceView: ...

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
        speculation_margin: float = 0.05,
        rng: random.Random | None = None,
    ) -> None:
        self.scoreboard = scoreboard
        self.explore_share = explore_share
        self.speculation_margin = speculation_margin
        self.rng = rng or random.Random()

    def level(self, backend: RoutableBackend, backends: Sequence[RoutableBackend]) -> int:
        """The load level a new request on `backend` runs at.

        Backends on one device share its compute, so the level counts every request in flight
        there: a request on an idle n-gram backend next to four busy plain streams does not run
        at level 1. Requests on other devices do not count; requests other proxies sent to an
        external backend do (it reports them).
        """
        same = sum(b.load for b in backends if b.device is backend.device)
        return load_level(same + 1)

    def choose(self, task: str, backends: Sequence[RoutableBackend]) -> RouteChoice | None:
        """A backend for an `auto` request, or None when no backend is ready."""
        ready = [b for b in backends if b.ready]
        if not ready:
            return None
        ready = [b for b in ready if not b.queue_full] or ready
        levels = {b.name: self.level(b, backends) for b in ready}
        if len(ready) == 1:
            return RouteChoice(ready[0].name, "only_healthy", levels[ready[0].name])
        # Backends that would run at the same load are compared at a level all of them were
        # measured at: one known only alone (17 t/s) against another measured at two streams
        # (9 t/s) says nothing about which is faster at two.
        board = self.scoreboard
        common: dict[int, set[int]] = {}
        for b in ready:
            measured = board.measured_levels(b.name, task)
            level = levels[b.name]
            common[level] = common[level] & measured if level in common else measured
        estimates: dict[str, Estimate] = {}
        for b in ready:
            est = board.nearest(b.name, task, levels[b.name], common[levels[b.name]] or None)
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

        ranked = sorted(ready, key=lambda b: (b.name in demoted, -credited(b), b.load))
        best = ranked[0]

        def about_as_fast(other: RoutableBackend, margin: float) -> bool:
            return other.name not in demoted and credited(other) >= (1 - margin) * credited(best)

        if not self._starts_now(best):
            # The best would wait: for its device (another backend decodes there) or for a
            # slot. A backend that starts at once is taken instead if it is about as fast at
            # this load: joining the batch already decoding on the device (one process, no
            # extra threads) or spilling to one whose device has room.
            for other in ranked[1:]:
                same = other.device is best.device
                margin = JOIN_MARGIN if same else SPILL_MARGIN
                # A full batch decoding on the device is joined too: a slot frees when one of
                # its answers ends, the device only when all of them have (eight code streams
                # waited 25 s for four plain answers to drain, to move to a near-tie).
                joinable = self._starts_now(other) or (
                    same and other.load > 0 and other.device.admits(other.name)
                )
                if joinable and about_as_fast(other, margin):
                    reason: RouteReason = "join_batch" if other.load else "spill"
                    return RouteChoice(other.name, reason, levels[other.name])
            if not best.device.admits(best.name):
                # The device runs the first waiting request's backend next: if that one is
                # about as fast, waiting for the best instead would wait for a second drain.
                upcoming = best.device.next_up()
                for other in ranked[1:]:
                    same = other.device is best.device
                    if same and other.name == upcoming and about_as_fast(other, JOIN_MARGIN):
                        return RouteChoice(other.name, "join_queue", levels[other.name])
                return RouteChoice(best.name, "wait_device", levels[best.name])
        # A probe runs only where its device is idle: next to busy backends it would slow them
        # and be measured under contention it did not cause. On a device it shares, a probe
        # of a clearly slower backend holds the device for a whole answer, and every request
        # arriving meanwhile waits for it (a 29-s draft probe opened a sweep cell of eight code
        # streams and cost it 60 %): there only near-ties are probed.
        top = estimates[best.name].tokens_per_s
        probes = [
            b
            for b in ranked[1:]
            if self._starts_now(b)
            and self._device_idle(b, backends)
            and (
                not self._shares_device(b, ready)
                or estimates[b.name].tokens_per_s >= (1 - JOIN_MARGIN) * top
            )
        ]
        if probes and self.rng.random() < self.explore_share:
            other = self._explore_target(probes, estimates[best.name], estimates)
            return RouteChoice(other.name, "explore", levels[other.name])
        fastest = max(ready, key=lambda b: estimates[b.name].tokens_per_s)
        reason = "fastest"
        if fastest.name in demoted:
            reason = "demoted"
        elif fastest.name != best.name and estimates[fastest.name].tokens_per_s > credited(best):
            reason = "within_margin"
        return RouteChoice(best.name, reason, levels[best.name])

    @staticmethod
    def _starts_now(backend: RoutableBackend) -> bool:
        """Whether a request sent now would start decoding at once: a free slot, device room."""
        return not backend.saturated and backend.device.admits(backend.name)

    @staticmethod
    def _shares_device(backend: RoutableBackend, ready: Sequence[RoutableBackend]) -> bool:
        return any(b is not backend and b.device is backend.device for b in ready)

    @staticmethod
    def _device_idle(backend: RoutableBackend, backends: Sequence[RoutableBackend]) -> bool:
        return not any(b.load for b in backends if b.device is backend.device)

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
        if est.tokens_per_s < baseline:
            # Its speed already ranks it below plain. Demoting it too only kept it from being
            # joined: requests on a CPU where ngram measured 8 % slower than plain at four
            # streams waited out a whole answer's drain rather than join its batch.
            return False
        threshold = break_even_acceptance(
            est.acceptance, est.tokens_per_s / baseline, backend.draft_n_max
        )
        return threshold is None or est.recent_acceptance < threshold
