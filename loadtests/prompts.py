"""The load tests' requests by task class: the chat part of the realistic workload.

``proxy.workload`` documents the mix: whole-file and search/replace edits of standard-library
modules (echo), new code and technical questions under a coding assistant's system prompt
(code, prose). Its FIM bodies go to ``/infill``, which the chat load test does not drive.
"""

from __future__ import annotations

from typing import Final

from proxy.workload import workload

Messages = tuple[dict[str, str], ...]

PROMPTS: Final[dict[str, tuple[Messages, ...]]] = {
    task: tuple(
        tuple(r.messages) for r in workload() if r.task == task and r.path == "/v1/chat/completions"
    )
    for task in ("code", "prose", "echo")
}
