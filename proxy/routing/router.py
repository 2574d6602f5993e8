"""Router: from a request's model id and messages to a task class and a backend choice."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any, Literal, TypeVar

from proxy.backends.backend import RoutableBackend
from proxy.llamacpp import Timings
from proxy.routing.aliases import ModelAliases
from proxy.routing.classifier import TaskClassifier
from proxy.routing.policy import RequestCost, RouteChoice, RoutePolicy
from proxy.routing.prefixes import PrefixCache
from proxy.routing.scoreboard import Outcome, Scoreboard
from proxy.tasks import AUTO_MODEL, AUTO_TASK_MODELS, TASK_CLASSES

# How a request that needs any backend, not the fastest one, found it.
AnyReason = Literal["pinned", "least_busy"]
# The caller's own backend type: what it gives the router is what the router hands back.
B = TypeVar("B", bound=RoutableBackend)


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
    ):
        self.classifier = classifier
        self.policy = policy
        self.scoreboard = scoreboard
        self.aliases = aliases or ModelAliases({})
        self.prefixes = PrefixCache()

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
        self,
        model: str,
        task: str,
        backends: Sequence[B],
        cost: RequestCost | None = None,
    ) -> tuple[B, RouteChoice]:
        """The backend for this request; raises UnknownModelError or NoBackendError."""
        by_name = {b.name: b for b in backends}
        if model in by_name:
            pinned = by_name[model]
            if not pinned.ready:
                raise NoBackendError(f"backend {model!r} is not ready")
            return pinned, RouteChoice(model, "pinned", self.policy.level(pinned, backends))
        if model != AUTO_MODEL and model not in AUTO_TASK_MODELS:
            raise UnknownModelError(model)
        choice = self.policy.choose(task, backends, cost)
        if choice is None:
            raise NoBackendError("no backend is ready")
        return by_name[choice.backend], choice

    def choose_any(
        self,
        model: str,
        backends: Sequence[B],
        cost: RequestCost | None = None,
    ) -> tuple[B, AnyReason]:
        """A ready backend for a request every backend answers alike (the model is shared)."""
        by_name = {b.name: b for b in backends}
        if model in by_name:
            if not by_name[model].ready:
                raise NoBackendError(f"backend {model!r} is not ready")
            return by_name[model], "pinned"
        if model != AUTO_MODEL and model not in AUTO_TASK_MODELS:
            raise UnknownModelError(model)
        ready = [b for b in backends if b.ready]
        if not ready:
            raise NoBackendError("no backend is ready")
        # One that starts at once on its device first: another would wait for, or crowd, it;
        # among those, the one holding most of the prompt (an embedding of a long document).
        held = cost.cached if cost is not None else {}
        best = min(
            ready,
            key=lambda b: (
                not b.device.admits_past_background(b.name),
                b.load,
                -held.get(b.name, 0),
            ),
        )
        return best, "least_busy"

    def record(self, outcome: Outcome) -> None:
        """Feed a finished request's measurements back into the scoreboard."""
        self.scoreboard.record(outcome)
