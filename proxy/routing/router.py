"""Router: from a request's model id and messages to a task class and a backend choice."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass, replace
from typing import Any, TypeVar

from proxy.backends.engine import RoutableBackend
from proxy.backends.strategy import Strategy
from proxy.exchange import Exchange, Route
from proxy.llamacpp import Timings
from proxy.measurement import CLIENT_GONE
from proxy.routing.aliases import ModelAliases
from proxy.routing.classifier import TaskClassifier
from proxy.routing.draft_length import DraftLengths
from proxy.routing.policy import RoutePolicy
from proxy.routing.prefix_sharing import PrefixSharing, Shared
from proxy.routing.prefixes import Cached, PrefixCache
from proxy.routing.ranking import RequestCost, RouteChoice
from proxy.routing.scoreboard import Estimate, Outcome, Scoreboard, load_level
from proxy.tasks import AUTO_MODEL, AUTO_TASK_MODELS, FIM_TASK, TASK_CLASSES

# The caller's own backend type: what it gives the router is what the router hands back.
B = TypeVar("B", bound=RoutableBackend)


# A stream its client left still measured its speed up to there.
_MEASURED = (None, CLIENT_GONE)


@dataclass(frozen=True)
class Measured:
    """One cell of what the router measured: a backend, a task class, a load level."""

    backend: str
    task: str
    level: int
    estimate: Estimate
    # The interval the router compares backends by (90 %).
    interval: tuple[float, float]
    # Samples from a quiet and from a busy machine together (the estimate holds the quiet ones
    # where there are any).
    all_samples: int


class UnknownModelError(LookupError):
    """The request names a model id that is neither `auto*`, an alias nor a backend."""


class NoBackendError(RuntimeError):
    """No backend can take the request right now."""


def fim_outcome(outcome: Outcome, timings: Timings) -> Outcome:
    """A FIM sample, its speed the tokens per second of the backend's time to the last token.

    What an editor waiting for a short completion feels is the time to the last token, so FIM's
    own scoreboard rows rank backends by that.
    """
    busy_ms = timings.prompt_ms + timings.predicted_ms
    if outcome.predicted_n <= 0 or busy_ms <= 0:
        return outcome
    return replace(outcome, tokens_per_s=outcome.predicted_n * 1000.0 / busy_ms)


class Router:
    """Classifies a request, then pins or asks the policy for a backend; records outcomes."""

    def __init__(
        self,
        classifier: TaskClassifier,
        policy: RoutePolicy,
        scoreboard: Scoreboard,
        aliases: ModelAliases | None = None,
        share_prefixes: bool = True,
        drafts: DraftLengths | None = None,
    ):
        self.classifier = classifier
        self.policy = policy
        self.scoreboard = scoreboard
        # None: every request drafts at its backend's own length.
        self.drafts = drafts
        self.aliases = aliases or ModelAliases({})
        self.prefixes = PrefixCache()
        self.sharing = PrefixSharing(share_prefixes)

    def resolve_model(self, model: str) -> str:
        """The model id an alias stands for; any other id unchanged."""
        return self.aliases.resolve(model) or model

    def task_for(
        self,
        body: Mapping[str, Any],
        model: str,
        header_task: str | None,
        endpoint_task: str | None = None,
    ) -> str:
        """The task class: the endpoint's own, header override, `auto-<task>`, the classifier."""
        if endpoint_task is not None:
            return endpoint_task
        if header_task:
            if header_task not in TASK_CLASSES:
                classes = ", ".join(TASK_CLASSES)
                raise ValueError(f"X-Specproxy-Task must be one of {classes}, not {header_task!r}")
            return str(header_task)
        if model in AUTO_TASK_MODELS:
            return str(AUTO_TASK_MODELS[model])
        return str(self.classifier.classify(body))

    def choose(
        self, task: str, backends: Sequence[B], cost: RequestCost | None = None
    ) -> tuple[B, RouteChoice]:
        """The fastest backend for this request's task and cost; raises NoBackendError."""
        choice = self.policy.choose(task, backends, cost)
        if choice is None:
            raise NoBackendError("no backend is ready")
        return next(b for b in backends if b.name == choice.backend), choice

    @staticmethod
    def choose_any(backends: Sequence[B], cost: RequestCost | None = None) -> B:
        """A ready backend for a request every backend answers alike (the model is shared)."""
        ready = [b for b in backends if b.engine.ready]
        if not ready:
            raise NoBackendError("no backend is ready")
        # One that starts at once on its device first: another would wait for, or crowd, it;
        # among those, the one holding most of the prompt (an embedding of a long document).
        held = cost.cached if cost is not None else {}
        return min(
            ready,
            key=lambda b: (
                not b.engine.device.admits_past_background(b.name),
                b.load,
                -held.get(b.name, 0),
            ),
        )

    def route(
        self,
        exchange: Exchange,
        backends: Sequence[Strategy],
        prompt_tokens: int,
        budget: int | None,
        quiet: bool,
    ) -> Route:
        """Where the request goes, why, and what the router expects it to find cached there:
        by the whole request's cost for a task, else any ready backend. Raises
        UnknownModelError or NoBackendError."""
        prompt, model = exchange.prompt, exchange.model
        held = {
            b.name: self.prefixes.cached(
                b.engine.name, prompt.prefix, b.engine.server_urls, prompt.session
            )
            if prompt is not None
            else Cached(0, None)
            for b in backends
        }
        cost = RequestCost(
            prompt_tokens=prompt_tokens,
            cached={name: c.tokens for name, c in held.items()},
            max_tokens=budget,
            quiet=quiet,
            agent=prompt.agent if prompt is not None else None,
        )
        pinned = exchange.pinned
        if pinned is not None:
            if not pinned.engine.ready:
                raise NoBackendError(f"backend {pinned.name!r} is not ready")
            level = self.policy.level(pinned, backends) if exchange.task is not None else 0
            return Route(pinned, "pinned", level, held[pinned.name])
        if model != AUTO_MODEL and model not in AUTO_TASK_MODELS:
            raise UnknownModelError(model)
        if exchange.task is None:
            backend = self.choose_any(backends, cost)
            return Route(backend, "least_busy", 0, held[backend.name])
        backend, choice = self.choose(exchange.task, backends, cost)
        route = Route(backend, choice.reason, choice.level, held[backend.name])
        return self._with_draft_length(route, exchange.task)

    def _with_draft_length(self, route: Route, task: str) -> Route:
        """The route with the draft length measured fastest for its strategy, class and load."""
        backend = route.backend
        if self.drafts is None or not backend.tunes_draft_length:
            return route
        pick = self.drafts.choose(backend.name, task, route.level, backend.draft_cap)
        return replace(route, draft_n_max=pick.n_max, draft_explored=pick.explored)

    def computing(
        self, exchange: Exchange, prompt_tokens: int
    ) -> AbstractAsyncContextManager[float]:
        """Hold the request while its chosen engine computes the start of its prompt for
        another (bounded by what waiting saves), then count it as computing its own prompt
        until the context ends; the context yields the seconds waited."""
        route, prompt = exchange.route, exchange.prompt
        if route is None or prompt is None:
            return nullcontext(0.0)
        engine = route.backend.engine.name
        return self.sharing.turn(
            Shared(
                engine=engine,
                prefix=prompt.prefix,
                cached_tokens=route.cached.tokens,
                prompt_tokens=max(prompt_tokens, route.cached.tokens),
                chars_per_token=self.prefixes.chars_per_token(engine),
                prompt_speed=self.prompt_speed(engine),
                keeps_copies=route.backend.spec.our_build,
            )
        )

    def record(self, exchange: Exchange) -> Outcome | None:
        """Learn from a finished request: its speed, filed under the load it ran at, and where
        its prompt is cached now. The outcome it measured; None for a request never sent."""
        route, upstream = exchange.route, exchange.measured
        if route is None or upstream is None:
            return None
        timings = Timings.parse(upstream.timings)
        # Filed under the load it ran at: one that started alone and was joined by three more
        # decoded at four streams' speed, and would otherwise drag down the one-stream estimate.
        mean = exchange.mean_load
        ran_at = route.level if mean is None else load_level(int(mean + 0.5))
        prompt = exchange.prompt
        outcome = Outcome.from_timings(
            route.backend.name,
            exchange.task or "",
            ran_at,
            timings,
            upstream.ttft_s,
            exchange.contended,
            agent=prompt.agent if prompt is not None else None,
            engine=route.backend.engine.name,
        )
        if exchange.task == FIM_TASK:
            outcome = fim_outcome(outcome, timings)
        measured = upstream.status == 200 and upstream.error in _MEASURED
        # A client's own speculation settings are not the backend's measured speed.
        if exchange.task is not None and measured and not exchange.client_speculation:
            self.scoreboard.record(outcome)
            self._record_draft_length(route, outcome)
        admission = exchange.admission
        if prompt is not None and admission is not None and upstream.status == 200:
            self.prefixes.record(
                route.backend.engine.name,
                prompt.prefix,
                admission.placement,
                timings.prompt_n + timings.cache_n,
                admission.slots,
                prompt.session,
            )
        return outcome

    def _record_draft_length(self, route: Route, outcome: Outcome) -> None:
        """A routed request's decode speed, filed under the draft length it ran with; a busy
        machine's samples would compare lengths by the other programs' load."""
        n_max = route.draft_n_max
        if self.drafts is None or n_max is None or outcome.contended:
            return
        if not outcome.tokens_per_s or outcome.predicted_n < self.scoreboard.min_tokens:
            return
        acceptance = outcome.draft_n_accepted / outcome.draft_n if outcome.draft_n else None
        self.drafts.record(
            outcome.backend, outcome.task, outcome.level, n_max, outcome.tokens_per_s, acceptance
        )

    def measured(self) -> Iterator[Measured]:
        """Every cell the router has measured, with the interval it compares by."""
        board = self.scoreboard
        for (backend, task, level), est in board.items():
            yield Measured(
                backend,
                task,
                level,
                est,
                est.interval(board.alpha),
                board.samples(backend, task, level),
            )

    def prompt_speed(self, engine: str) -> float | None:
        """The engine's measured prompt tokens/s (every strategy on it has it), None before any."""
        rate = self.scoreboard.prompt_speed(engine)
        return rate.tokens_per_s if rate is not None else None

    def exact_aliases(self) -> list[str]:
        """The model names configured as exact aliases (patterns are not ids)."""
        return list(self.aliases.exact)
