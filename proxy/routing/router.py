"""Router: from a request's model id and messages to a task class and a backend choice."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from proxy.routing.classifier import TASK_CLASSES, TaskClassifier
from proxy.routing.policy import RoutableBackend, RouteChoice, RoutePolicy
from proxy.routing.scoreboard import Outcome, Scoreboard

AUTO_MODEL = "auto"
AUTO_TASK_MODELS = {f"auto-{task}": task for task in TASK_CLASSES}


class UnknownModelError(LookupError):
    """The request names a model id that is neither `auto*` nor a backend."""


class NoBackendError(RuntimeError):
    """No backend can take the request right now."""


class Router:
    """Classifies a request, then pins or asks the policy for a backend; records outcomes."""

    def __init__(self, classifier: TaskClassifier, policy: RoutePolicy, scoreboard: Scoreboard):
        self.classifier = classifier
        self.policy = policy
        self.scoreboard = scoreboard

    def task_for(self, body: Mapping[str, Any], model: str, header_task: str | None) -> str:
        """The task class: header override, then `auto-<task>` model id, then the classifier."""
        if header_task:
            if header_task not in TASK_CLASSES:
                classes = ", ".join(TASK_CLASSES)
                raise ValueError(f"X-Specproxy-Task must be one of {classes}, not {header_task!r}")
            return str(header_task)
        if model in AUTO_TASK_MODELS:
            return str(AUTO_TASK_MODELS[model])
        return str(self.classifier.classify(body))

    def choose(
        self, model: str, task: str, backends: Sequence[RoutableBackend]
    ) -> tuple[RoutableBackend, RouteChoice]:
        """The backend for this request; raises UnknownModelError or NoBackendError."""
        by_name = {b.name: b for b in backends}
        if model in by_name:
            pinned = by_name[model]
            if not pinned.ready:
                raise NoBackendError(f"backend {model!r} is not ready")
            return pinned, RouteChoice(model, "pinned", self.policy.level(pinned, backends))
        if model != AUTO_MODEL and model not in AUTO_TASK_MODELS:
            raise UnknownModelError(model)
        choice = self.policy.choose(task, backends)
        if choice is None:
            raise NoBackendError("no backend is ready")
        return by_name[choice.backend], choice

    def record(self, outcome: Outcome) -> None:
        """Feed a finished request's measurements back into the scoreboard."""
        self.scoreboard.record(outcome)
