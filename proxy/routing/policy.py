"""RoutePolicy: choose the backend for a request from health, load and measured speed."""

from __future__ import annotations

import random
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from proxy.backends.backend import RoutableBackend
from proxy.routing.prefixes import WORTH_FOLLOWING_TOKENS
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
    "affinity",
    "recheck",
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
# Prompt tokens a backend may have to process beyond the cheapest choice for a request to be
# sent there only to measure it (an unmeasured backend, a probe): moving an agent's turn off
# the backend holding its 20 k-token prompt costs minutes on a CPU.
CHEAP_MOVE_TOKENS = 512
# A backend holding this many more of the prompt than any other is where the request stays.
AFFINITY_TOKENS = WORTH_FOLLOWING_TOKENS
# Decisions between two re-measurements of one backend known only from a busy machine.
RECHECK_EVERY = 4
# Prompt speed assumed for a backend none was measured for, relative to those measured.
_UNKNOWN_PROMPT_TPS = 50.0
# Until agents' answers are measured, what their sessions are taken to decode, by what the
# first instruction asks: a change is mostly edits (a whole-file edit is hundreds of tokens,
# a tool call tens), a question mostly its answer, anything else tool calls and new code.
_AGENT_MIX_PRIOR: dict[str, dict[str, float]] = {
    "change": {"code": 0.4, "echo": 0.6},
    "question": {"code": 0.3, "prose": 0.7},
    "other": {"code": 1.0},
}


@dataclass(frozen=True)
class RequestCost:
    """What a request asks of a backend besides its answer: its prompt, and what each holds."""

    prompt_tokens: int = 0
    cached: Mapping[str, int] = field(default_factory=dict)
    max_tokens: int | None = None
    # Whether the machine's CPUs were left to the proxy and its backends just now.
    quiet: bool = True
    # For an agent's turn (a request with tools), what its session asks for (session_intent):
    # where its first turn lands, the session stays.
    agent: str | None = None

    def uncached(self, backend: str) -> int:
        """Prompt tokens this backend would have to process."""
        return max(self.prompt_tokens - self.cached.get(backend, 0), 0)


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
        self._decisions = 0
        self._rechecked: dict[tuple[str, str], int] = {}

    def level(self, backend: RoutableBackend, backends: Sequence[RoutableBackend]) -> int:
        """The load level a new request on `backend` runs at.

        Backends on one device share its compute, so the level counts every request in flight
        there: a request on an idle n-gram backend next to four busy plain streams does not run
        at level 1. Requests on other devices do not count; requests other proxies sent to an
        external backend do (it reports them).
        """
        same = sum(b.load for b in backends if b.device is backend.device)
        return load_level(same + 1)

    def choose(
        self,
        task: str,
        backends: Sequence[RoutableBackend],
        cost: RequestCost | None = None,
    ) -> RouteChoice | None:
        """A backend for an `auto` request, or None when no backend is ready.

        Backends are ranked by the time the whole request would take there: the prompt tokens
        it does not hold at its measured prompt speed, plus the expected answer at its measured
        decode speed for the class at this load, plus, where it cannot start at once, the wait
        for its device.
        """
        cost = cost or RequestCost()
        self._decisions += 1
        ready = [b for b in backends if b.ready]
        if not ready:
            return None
        ready = [b for b in ready if not b.queue_full] or ready
        levels = {b.name: self.level(b, backends) for b in ready}
        if len(ready) == 1:
            return RouteChoice(ready[0].name, "only_healthy", levels[ready[0].name])
        cheapest = min(cost.uncached(b.name) for b in ready)

        def cheap_to_move(b: RoutableBackend) -> bool:
            return cost.uncached(b.name) - cheapest <= CHEAP_MOVE_TOKENS

        board = self.scoreboard
        common = self._comparable(task, ready, levels)
        estimates: dict[str, Estimate] = {}
        for b in ready:
            est = board.nearest(b.name, task, levels[b.name], common[levels[b.name]] or None)
            if est is not None:
                estimates[b.name] = est
            elif cheap_to_move(b):
                return RouteChoice(b.name, "unmeasured", levels[b.name])
        # One not measured yet whose prompt would cost too much waits for a cheaper request.
        ready = [b for b in ready if b.name in estimates]
        if len(ready) == 1:
            return RouteChoice(ready[0].name, "only_healthy", levels[ready[0].name])
        recheck = self._recheck(task, ready, backends, estimates, cost, cheap_to_move)
        if recheck is not None:
            return RouteChoice(recheck.name, "recheck", levels[recheck.name])
        demoted = {b.name for b in ready if self._below_break_even(b, ready, estimates)}
        plain = any(b.spec_type is None for b in ready)
        answer = self._answer_tokens(task, ready, estimates, cost)
        prompt_tps = self._prompt_speeds(ready)

        mix = self._session_mix(task, ready, levels, cost)

        def seconds(b: RoutableBackend) -> float:
            # Speculation must win by more than the noise: its speed swings with how
            # predictable each prompt is, and a rejected draft costs compute the device shares.
            per_token = sum(share / self._speed(b, c, levels, estimates, ready) for c, share in mix)
            if plain and b.spec_type:
                per_token *= 1 + self.speculation_margin
            return cost.uncached(b.name) / prompt_tps[b.name] + answer * per_token

        def credited(b: RoutableBackend) -> float:
            """The whole request's speed here: answer tokens per second of its time."""
            return answer / seconds(b)

        ranked = sorted(ready, key=lambda b: (b.name in demoted, -credited(b), b.load))
        best = ranked[0]

        def about_as_fast(other: RoutableBackend, margin: float, wait_s: float = 0.0) -> bool:
            # Within the margin of the best, or done sooner than the best would be after its wait.
            if other.name in demoted:
                return False
            theirs = seconds(other)
            return theirs * (1 - margin) <= seconds(best) or theirs <= seconds(best) + wait_s

        if not self._starts_now(best):
            # The best would wait: for its device (another backend decodes there) or for a
            # slot. A backend that starts at once is taken instead if it is about as fast at
            # this load, the wait counted: joining the batch already decoding on the device
            # (one process, no extra threads) or spilling to one whose device has room.
            wait = self._wait_s(best, ready, estimates, answer, levels)
            for other in ranked[1:]:
                same = other.device is best.device
                margin = JOIN_MARGIN if same else SPILL_MARGIN
                # A full batch decoding on the device is joined too: a slot frees when one of
                # its answers ends, the device only when all of them have (eight code streams
                # waited 25 s for four plain answers to drain, to move to a near-tie).
                joinable = self._starts_now(other) or (
                    same and other.load > 0 and other.device.admits_past_background(other.name)
                )
                # The wait is counted where the request is the only one it matters to: on
                # another device. Joining the device's batch keeps every later request there
                # too, so there only the margin decides (it prices the drain the sweep measured).
                if joinable and about_as_fast(other, margin, 0.0 if same else wait):
                    reason: RouteReason = "join_batch" if other.load else "spill"
                    return RouteChoice(other.name, reason, levels[other.name])
            if not best.device.admits(best.name):
                # The device runs the first waiting request's backend next: if that one is
                # about as fast, waiting for the best instead would wait for a second drain.
                upcoming = best.device.next_up()
                for other in ranked[1:]:
                    same = other.device is best.device
                    runs_next = other.device.engine_of(other.name) == upcoming
                    if same and runs_next and about_as_fast(other, JOIN_MARGIN):
                        return RouteChoice(other.name, "join_queue", levels[other.name])
                return RouteChoice(best.name, "wait_device", levels[best.name])
        # A probe runs only where its device is idle: next to busy backends it would slow them
        # and be measured under contention it did not cause. Nor is a request sent where it
        # would process much more of its prompt than on the best.
        top = credited(best)
        low = estimates[best.name].interval(board.alpha)[0]

        def unsure_of(b: RoutableBackend) -> bool:
            # The intervals overlap: the order may be wrong.
            return estimates[b.name].interval(board.alpha)[1] >= low

        # On a device it shares, a probe of a backend clearly slower holds the device for a
        # whole answer, and every request arriving meanwhile waits for it (a 29-s draft probe
        # opened a sweep cell of eight code streams and cost it 60 %): there only near-ties
        # and backends whose measurement cannot yet tell them apart from the best are probed,
        # so one unlucky sample does not bar a backend for good.
        probes = [
            b
            for b in ranked[1:]
            if self._starts_now(b)
            and self._device_idle(b, backends)
            and cheap_to_move(b)
            and (
                not self._shares_device(b, ready)
                or credited(b) >= (1 - JOIN_MARGIN) * top
                or unsure_of(b)
            )
        ]
        # Where the intervals overlap, probe at the configured share; a backend clearly slower
        # is re-measured half as often.
        unsure = [b for b in probes if unsure_of(b)]
        share = self.explore_share if unsure else self.explore_share / 2
        # An agent session's first turn is never a probe: the session stays where that turn
        # lands, so the probe would cost every later turn too (an explain session sent to
        # ngram to measure it kept decoding there at 0.8x plain).
        if probes and not self._opens_session(cost) and self.rng.random() < share:
            other = self._explore_target(unsure or probes, estimates[best.name], estimates)
            return RouteChoice(other.name, "explore", levels[other.name])
        fastest = max(ready, key=lambda b: estimates[b.name].tokens_per_s)
        reason = "fastest"
        held = cost.cached.get(best.name, 0)
        elsewhere = max((cost.cached.get(b.name, 0) for b in ready if b is not best), default=0)
        if fastest.name in demoted:
            reason = "demoted"
        elif held >= AFFINITY_TOKENS and held - elsewhere >= AFFINITY_TOKENS:
            reason = "affinity"
        elif fastest.name != best.name and estimates[fastest.name].tokens_per_s > credited(best):
            reason = "within_margin"
        return RouteChoice(best.name, reason, levels[best.name])

    def _comparable(
        self, task: str, ready: Sequence[RoutableBackend], levels: Mapping[str, int]
    ) -> dict[int, set[int]]:
        """Per load level, the levels every ready backend running at it was measured at.

        Backends that would run at the same load are compared at a level all of them were
        measured at: one known only alone (17 t/s) against another measured at two streams
        (9 t/s) says nothing about which is faster at two.
        """
        common: dict[int, set[int]] = {}
        for b in ready:
            measured = self.scoreboard.measured_levels(b.name, task)
            level = levels[b.name]
            common[level] = common[level] & measured if level in common else measured
        return common

    def _speed(
        self,
        b: RoutableBackend,
        task: str,
        levels: Mapping[str, int],
        estimates: dict[str, Estimate],
        ready: Sequence[RoutableBackend],
    ) -> float:
        """Decode tokens/s of `b` for a class, from this request's estimate where it is its own,
        else at a level every backend it is compared with was measured at, as for its own."""
        if task == "":
            est: Estimate | None = estimates[b.name]
        else:
            among = self._comparable(task, ready, levels)[levels[b.name]] or None
            est = self.scoreboard.nearest(b.name, task, levels[b.name], among)
        return max(est.tokens_per_s if est is not None else 0.0, 1e-9)

    @staticmethod
    def _opens_session(cost: RequestCost) -> bool:
        """An agent's turn whose prompt no backend holds: where it lands, its session stays."""
        return cost.agent is not None and not any(
            n >= AFFINITY_TOKENS for n in cost.cached.values()
        )

    def _session_mix(
        self,
        task: str,
        ready: Sequence[RoutableBackend],
        levels: Mapping[str, int],
        cost: RequestCost,
    ) -> list[tuple[str, float]]:
        """The classes the decode time is weighed over: this request's own (as ""), or for an
        agent session's first turn, held nowhere yet, the session's measured mix of classes.

        An agent's session stays where its first turn lands (moving its prompt costs more
        than any decode gain), so that turn is placed for the answers the session will give:
        its edits as much as the tool call it starts with.
        """
        if cost.agent is None or not self._opens_session(cost):
            return [("", 1.0)]
        mix = self.scoreboard.agent_mix(cost.agent) or _AGENT_MIX_PRIOR.get(cost.agent, {task: 1.0})
        usable = [
            (t, share)
            for t, share in mix.items()
            if all(self.scoreboard.nearest(b.name, t, levels[b.name]) for b in ready)
        ]
        total = sum(share for _, share in usable)
        if total <= 0:
            return [("", 1.0)]
        return [("" if t == task else t, share / total) for t, share in usable]

    def _recheck(
        self,
        task: str,
        ready: Sequence[RoutableBackend],
        backends: Sequence[RoutableBackend],
        estimates: dict[str, Estimate],
        cost: RequestCost,
        cheap_to_move: Callable[[RoutableBackend], bool],
    ) -> RoutableBackend | None:
        """A backend known for this class only from a busy machine, to measure again now.

        Only on a quiet machine, on an idle device, for a request cheap to send there; and
        one backend every RECHECK_EVERY decisions, so a machine that stays busy does not
        turn every request into a probe.
        """
        if not cost.quiet:
            return None
        for b in ready:
            last = self._rechecked.get((b.name, task))
            due = last is None or self._decisions - last >= RECHECK_EVERY
            if (
                estimates[b.name].contended
                and due
                and self._starts_now(b)
                and self._device_idle(b, backends)
                and cheap_to_move(b)
            ):
                self._rechecked[(b.name, task)] = self._decisions
                return b
        return None

    def _answer_tokens(
        self,
        task: str,
        ready: Sequence[RoutableBackend],
        estimates: dict[str, Estimate],
        cost: RequestCost,
    ) -> float:
        """The answer length expected for this class: the same model answers on every backend,
        so one length for all, from every backend's measured answers (short ones included)."""
        lengths = [self.scoreboard.answer_tokens(b.name, task) for b in ready]
        known = [n for n in lengths if n is not None]
        mean = sum(known) / len(known) if known else estimates[ready[0].name].tokens
        if cost.max_tokens is not None:
            mean = min(mean, float(cost.max_tokens))
        return max(mean, 1.0)

    def _prompt_speeds(self, ready: Sequence[RoutableBackend]) -> dict[str, float]:
        """Each backend's prompt tokens/s: measured, else its engine's (strategies sharing a
        process process prompts alike), else the slowest measured. A backend with a draft
        model runs every prompt through it too, so it is never taken for faster at prompts
        than a plain backend on its device: samples of different prompt lengths and loads
        once rated the draft's faster, and sent agents' long first turns there."""
        speeds: dict[str, float] = {}
        for b in ready:
            rate = self.scoreboard.prompt_speed(b.name)
            if rate is not None and rate.tokens_per_s > 0:
                speeds[b.name] = rate.tokens_per_s
        for b in ready:
            mates = [speeds[o.name] for o in ready if o.engine == b.engine and o.name in speeds]
            if b.name not in speeds and mates:
                speeds[b.name] = max(mates)
        for b in ready:
            plain = [
                speeds[o.name]
                for o in ready
                if o.spec_type is None and o.device is b.device and o.name in speeds
            ]
            if b.name in speeds and plain and _runs_a_draft_model(b):
                speeds[b.name] = min(speeds[b.name], min(plain))
        fallback = min(speeds.values(), default=_UNKNOWN_PROMPT_TPS)
        return {b.name: speeds.get(b.name, fallback) for b in ready}

    @staticmethod
    def _wait_s(
        best: RoutableBackend,
        ready: Sequence[RoutableBackend],
        estimates: dict[str, Estimate],
        answer: float,
        levels: Mapping[str, int],
    ) -> float:
        """Expected wait before `best` starts: half an answer of what decodes on its device."""
        running = [b for b in ready if b.device is best.device and b.load > 0]
        if not running:
            return 0.0
        return max(answer / max(estimates[b.name].tokens_per_s, 1e-9) for b in running) / 2

    @staticmethod
    def _starts_now(backend: RoutableBackend) -> bool:
        """Whether a request sent now would start decoding at once: a free slot, device room;
        the proxy's own calibration request, which a user's waits out, takes neither."""
        return not backend.saturated and backend.device.admits_past_background(backend.name)

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


def _runs_a_draft_model(backend: RoutableBackend) -> bool:
    """Whether a separate draft model processes the backend's prompts beside its target."""
    return backend.spec_type is not None and "draft-simple" in backend.spec_type
