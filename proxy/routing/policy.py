"""RoutePolicy: choose the backend for a request from health, load and measured speed."""

from __future__ import annotations

import random
from collections.abc import Mapping, Sequence

from proxy.backends.engine import RoutableBackend
from proxy.routing.break_even import break_even_acceptance
from proxy.routing.prefixes import WORTH_FOLLOWING_TOKENS
from proxy.routing.ranking import CHEAP_MOVE_TOKENS, Ranking, RequestCost, RouteChoice
from proxy.routing.reasons import AutoReason
from proxy.routing.scoreboard import Estimate, Scoreboard, load_level

# How much slower than the best, at the load the request will run at, a backend that starts at
# once may be and still be taken instead of waiting for the best. Joining keeps every later
# request on that backend for as long as the load lasts, and waiting costs up to a whole
# answer's drain with the waiting requests idle; so the margin is the gain that pays for the
# drain, above the spread of two cells of one backend (docs/routing.md, "The policy's rules").
JOIN_MARGIN = 0.25
# The same for a backend on another device with room: the request would otherwise queue behind
# a full batch, and it takes nothing from the streams on the best backend's device.
SPILL_MARGIN = 0.5
# A prompt this long held by a backend makes an agent's turn a later one of its session.
AFFINITY_TOKENS = WORTH_FOLLOWING_TOKENS
# Decisions between two re-measurements of one backend known only from a busy machine.
RECHECK_EVERY = 4
# Prompt speed assumed for a backend none was measured for, relative to those measured.
_UNKNOWN_PROMPT_TPS = 50.0
# The share of an answer accepted drafts may be credited with when bounding a strategy's speed
# by plain's on one process: a verbatim copy (acceptance near 1) would make the bound useless.
_MOST_ACCEPTED = 0.95
# Until agents' answers are measured, what their sessions are taken to decode, by what the
# first instruction asks: a change is mostly edits (a whole-file edit is hundreds of tokens,
# a tool call tens), a question mostly its answer, anything else tool calls and new code.
_AGENT_MIX_PRIOR: dict[str, dict[str, float]] = {
    "change": {"code": 0.4, "echo": 0.6},
    "question": {"code": 0.3, "prose": 0.7},
    "other": {"code": 1.0},
}


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
        same = sum(b.load for b in backends if b.engine.device is backend.engine.device)
        return load_level(same + 1)

    def choose(
        self,
        task: str,
        backends: Sequence[RoutableBackend],
        cost: RequestCost | None = None,
    ) -> RouteChoice | None:
        """A backend for an `auto` request, or None when no backend is ready.

        Backends are ranked once by the time the whole request would take there: the prompt
        tokens it does not hold at its measured prompt speed, plus the expected answer at its
        measured decode speed for the class at this load. Then the rules decide in order, each
        choosing or passing: re-measure, join or spill, wait for the device, explore, fastest.
        """
        cost = cost or RequestCost()
        self._decisions += 1
        ready = [b for b in backends if b.engine.ready]
        if not ready:
            return None
        ready = [b for b in ready if not b.engine.queue_full] or ready
        levels = {b.name: self.level(b, backends) for b in ready}
        if len(ready) == 1:
            return RouteChoice(ready[0].name, "only_healthy", levels[ready[0].name])
        cheapest = min(cost.uncached(b.name) for b in ready)
        common = self._comparable(task, ready, levels)
        estimates: dict[str, Estimate] = {}
        for b in ready:
            est = self.scoreboard.nearest(
                b.name, task, levels[b.name], common[levels[b.name]] or None
            )
            if est is not None:
                estimates[b.name] = est
            elif cost.uncached(b.name) - cheapest <= CHEAP_MOVE_TOKENS:
                return RouteChoice(b.name, "unmeasured", levels[b.name])
        # One not measured yet whose prompt would cost too much waits for a cheaper request.
        ready = [b for b in ready if b.name in estimates]
        if len(ready) == 1:
            return RouteChoice(ready[0].name, "only_measured", levels[ready[0].name])
        ranking = self._rank(task, cost, backends, ready, levels, estimates, cheapest)
        for rule in (
            self._rule_recheck,
            self._rule_join_or_spill,
            self._rule_wait_for_device,
            self._rule_explore,
        ):
            choice = rule(ranking)
            if choice is not None:
                return choice
        return self._rule_fastest(ranking)

    def _rank(
        self,
        task: str,
        cost: RequestCost,
        backends: Sequence[RoutableBackend],
        ready: list[RoutableBackend],
        levels: dict[str, int],
        estimates: dict[str, Estimate],
        cheapest: int,
    ) -> Ranking:
        """The measured backends ranked by the whole request's speed there, demoted ones last."""
        demoted = {b.name for b in ready if self._below_break_even(b, ready, estimates)}
        plain = any(b.spec_type is None for b in ready)
        answer = self._answer_tokens(task, ready, estimates, cost)
        prompt_tps = self._prompt_speeds(ready)
        mix = self._session_mix(task, ready, levels, cost)
        seconds: dict[str, float] = {}
        cold: dict[str, float] = {}
        unmargined: dict[str, float] = {}
        for b in ready:
            per_token = sum(share / self._speed(b, c, levels, estimates, ready) for c, share in mix)
            decode = answer * per_token
            # Speculation must win by more than the noise: its speed swings with how
            # predictable each prompt is, and a rejected draft costs compute the device shares.
            margin = 1 + self.speculation_margin if plain and b.spec_type else 1.0
            prompt = cost.uncached(b.name) / prompt_tps[b.name]
            seconds[b.name] = prompt + decode * margin
            cold[b.name] = cost.prompt_tokens / prompt_tps[b.name] + decode * margin
            unmargined[b.name] = prompt + decode
        ranked = sorted(ready, key=lambda b: (b.name in demoted, seconds[b.name], b.load))
        return Ranking(
            task,
            cost,
            backends,
            ranked,
            levels,
            estimates,
            demoted,
            seconds,
            cold,
            unmargined,
            answer,
            cheapest,
        )

    def _rule_recheck(self, r: Ranking) -> RouteChoice | None:
        """Re-measure a backend known for this class only from a busy machine.

        Only on a quiet machine, on an idle device, for a request cheap to send there; and
        one backend every RECHECK_EVERY decisions, so a machine that stays busy does not
        turn every request into a probe.
        """
        if not r.cost.quiet:
            return None
        for b in r.ranked_by_name():
            last = self._rechecked.get((b.name, r.task))
            due = last is None or self._decisions - last >= RECHECK_EVERY
            if (
                r.estimates[b.name].contended
                and due
                and self._starts_now(b)
                and self._device_idle(b, r.backends)
                and r.cheap_to_move(b)
            ):
                self._rechecked[(b.name, r.task)] = self._decisions
                return r.choice(b, "recheck")
        return None

    def _rule_join_or_spill(self, r: Ranking) -> RouteChoice | None:
        """Where the best would wait (for its device or a slot), take a backend that starts at
        once and is about as fast: joining the batch on the device, or spilling to another.

        Joining keeps every later request on the device there too, so on the same device only
        the margin decides; the best's wait is counted where the request is the only one it
        matters to, on another device. A full batch decoding on the device is joined too: a
        slot frees when one of its answers ends, the device only when all of them have. Another
        strategy of the best's own engine is no way round: it waits for the same slots.
        """
        best = r.best
        if self._starts_now(best):
            return None
        wait = self._wait_s(best, r.ranked, r.estimates, r.answer, r.levels)
        for other in r.ranked[1:]:
            if other.engine.name == best.engine.name:
                continue
            same = other.engine.device is best.engine.device
            joinable = self._starts_now(other) or (
                same and other.load > 0 and other.engine.device.admits_past_background(other.name)
            )
            margin = JOIN_MARGIN if same else SPILL_MARGIN
            if joinable and r.about_as_fast(other, margin, 0.0 if same else wait):
                return r.choice(other, "join_batch" if same else "spill")
        return None

    def _rule_wait_for_device(self, r: Ranking) -> RouteChoice | None:
        """Where the best's device runs another backend, wait for it, unless the backend that
        runs next there is about as fast: waiting for the best would wait for a second drain.
        Where the best's own engine runs next, waiting for it costs no second drain."""
        best = r.best
        device = best.engine.device
        if self._starts_now(best) or device.admits(best.name):
            return None
        upcoming = device.next_up()
        if upcoming == device.engine_of(best.name):
            return r.choice(best, "wait_device")
        for other in r.ranked[1:]:
            same = other.engine.device is best.engine.device
            runs_next = other.engine.device.engine_of(other.name) == upcoming
            if same and runs_next and r.about_as_fast(other, JOIN_MARGIN):
                return r.choice(other, "join_queue")
        return r.choice(best, "wait_device")

    def _rule_explore(self, r: Ranking) -> RouteChoice | None:
        """Now and then, re-measure a backend the ranking may have wrong.

        A probe runs only where it starts at once on an idle device (next to busy backends it
        would slow them and be measured under contention it did not cause), and only where it
        would not process much more of its prompt than the best. On a device it shares, a
        clearly slower backend's probe holds the device for a whole answer while every
        arrival waits, so there only near-ties and backends whose interval overlaps the
        best's are probed. An agent session's first turn is never a probe: the session stays
        where that turn lands, so the probe would cost every later turn too.
        """
        best, board = r.best, self.scoreboard
        top = r.credited(best)
        low = r.estimates[best.name].interval(board.alpha)[0]

        def unsure_of(b: RoutableBackend) -> bool:
            return r.estimates[b.name].interval(board.alpha)[1] >= low

        probes = [
            b
            for b in r.ranked[1:]
            if self._starts_now(b)
            and self._device_idle(b, r.backends)
            and r.cheap_to_move(b)
            and (
                not self._shares_device(b, r.ranked)
                or r.credited(b) >= (1 - JOIN_MARGIN) * top
                or unsure_of(b)
            )
        ]
        # Where the intervals overlap, probe at the configured share; a backend clearly
        # slower is re-measured half as often.
        unsure = [b for b in probes if unsure_of(b)]
        share = self.explore_share if unsure else self.explore_share / 2
        if not probes or self._opens_session(r.cost) or self.rng.random() >= share:
            return None
        other = self._explore_target(unsure or probes, r.estimates[best.name], r.estimates)
        return r.choice(other, "explore")

    @staticmethod
    def _rule_fastest(r: Ranking) -> RouteChoice:
        """The best, named for the term of the ranking that made it the best rather than
        another: a demotion, the prompt it holds, the speculation margin; else `fastest`.

        Each is asked by ranking without it: the reason is the first whose absence would have
        put another backend first.
        """
        best, held = r.best, r.cost.cached
        reason: AutoReason = "fastest"
        cold = r.first_by(r.cold_seconds)
        if r.first_by(r.seconds, demote=False) is not best:
            reason = "demoted"
        elif cold is not best and held.get(best.name, 0) > held.get(cold.name, 0):
            reason = "affinity"
        elif r.first_by(r.unmargined_seconds) is not best:
            reason = "within_margin"
        return r.choice(best, reason)

    def _comparable(
        self, task: str, ready: Sequence[RoutableBackend], levels: Mapping[str, int]
    ) -> dict[int, set[int]]:
        """Per load level, the levels every ready backend running at it was measured at.

        Backends that would run at the same load are compared at a level all of them were
        measured at: a speed measured alone says nothing about the order at two streams.
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
        speed = max(est.tokens_per_s if est is not None else 0.0, 1e-9)
        plain = next(
            (p for p in ready if p.spec_type is None and p.engine.name == b.engine.name), None
        )
        if b.spec_type is None or est is None or est.tokens <= 0 or plain is None:
            return speed
        # On plain's own process a step that verifies a draft costs at least a plain step, so
        # speculation saves at most the steps of the tokens it had accepted: a strategy that
        # drafted nothing for a class decodes as plain does, whatever two samples' noise says
        # (ngram once read 11 % faster than plain on prose with no draft accepted).
        kept = 1 - min(est.accepted / est.tokens, _MOST_ACCEPTED)
        return min(speed, self._speed(plain, task, levels, estimates, ready) / kept)

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
        """Each backend's prompt tokens/s: its engine's measured one (strategies sharing a
        process process prompts alike, so they share one measurement), else the slowest
        measured. A backend with a draft model runs every prompt through it too, so it is
        never taken for faster at prompts than a plain backend on its device."""
        speeds: dict[str, float] = {}
        for b in ready:
            rate = self.scoreboard.prompt_speed(b.engine.name)
            if rate is not None and rate.tokens_per_s > 0:
                speeds[b.name] = rate.tokens_per_s
        for b in ready:
            plain = [
                speeds[o.name]
                for o in ready
                if o.spec_type is None and o.engine.device is b.engine.device and o.name in speeds
            ]
            if b.name in speeds and plain and _runs_a_draft_model(b):
                speeds[b.name] = min(speeds[b.name], min(plain))
        fallback = min(speeds.values(), default=_UNKNOWN_PROMPT_TPS)
        return {b.name: speeds.get(b.name, fallback) for b in ready}

    @staticmethod
    def _wait_s(
        best: RoutableBackend,
        ready: Sequence[RoutableBackend],
        estimates: Mapping[str, Estimate],
        answer: float,
        levels: Mapping[str, int],
    ) -> float:
        """Expected wait before `best` starts: half an answer of what decodes on its device."""
        running = [b for b in ready if b.engine.device is best.engine.device and b.load > 0]
        if not running:
            return 0.0
        return max(answer / max(estimates[b.name].tokens_per_s, 1e-9) for b in running) / 2

    @staticmethod
    def _starts_now(backend: RoutableBackend) -> bool:
        """Whether a request sent now would start decoding at once: a free slot, device room;
        the proxy's own calibration request, which a user's waits out, takes neither."""
        return not backend.engine.saturated and backend.engine.device.admits_past_background(
            backend.name
        )

    @staticmethod
    def _shares_device(backend: RoutableBackend, ready: Sequence[RoutableBackend]) -> bool:
        return any(b is not backend and b.engine.device is backend.engine.device for b in ready)

    @staticmethod
    def _device_idle(backend: RoutableBackend, backends: Sequence[RoutableBackend]) -> bool:
        return not any(b.load for b in backends if b.engine.device is backend.engine.device)

    def _explore_target(
        self,
        others: Sequence[RoutableBackend],
        best: Estimate,
        estimates: Mapping[str, Estimate],
    ) -> RoutableBackend:
        """A non-best backend to re-measure, drawn by the fourth power of its relative speed.

        A near-tie is where a stale estimate is most likely to hide a better choice, and a probe
        there costs little; a backend measured at half speed is still re-measured, 1/16 as often.
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
            # Its speed already ranks it below plain; demoting it too would only keep it from
            # being joined, so requests would wait out a drain rather than join its batch.
            return False
        threshold = break_even_acceptance(
            est.acceptance, est.tokens_per_s / baseline, backend.draft_n_max
        )
        return threshold is None or est.recent_acceptance < threshold


def _runs_a_draft_model(backend: RoutableBackend) -> bool:
    """Whether a separate draft model processes the backend's prompts beside its target."""
    return backend.spec_type is not None and "draft-simple" in backend.spec_type
