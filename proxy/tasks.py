"""The task classes requests are routed by, and the model ids that route: declared once."""

from __future__ import annotations

from typing import Final, Literal

# Classes the classifier assigns to chat-like requests, by the shape of the answer.
TaskClass = Literal["code", "prose", "echo"]
TASK_CLASSES: Final[tuple[TaskClass, ...]] = ("code", "prose", "echo")
# Fill-in-the-middle (/infill): a class of its own, assigned by the endpoint, never by the
# classifier; for short completions the time to the last token matters more than tokens/s.
FIM_TASK: Final = "fim"
ROUTED_TASKS: Final[tuple[str, ...]] = (*TASK_CLASSES, FIM_TASK)

AUTO_MODEL: Final = "auto"
AUTO_TASK_MODELS: Final[dict[str, str]] = {f"auto-{task}": task for task in TASK_CLASSES}
ROUTING_MODEL_IDS: Final = frozenset({AUTO_MODEL, *AUTO_TASK_MODELS})
