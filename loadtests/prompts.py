"""The load tests' requests by task class: the chat part of the workload's measurement pool.

``proxy.workload`` documents the mix: whole-file and search/replace edits of standard-library
modules (echo), new code and technical questions under a coding assistant's system prompt
(code, prose), each request different from the others and from what calibration sends, so no
backend has seen a prompt before (ngram-mod remembers every prompt and answer it served).
"""

from __future__ import annotations

import itertools
from typing import Final

from proxy.workload import measurement_pool

Messages = tuple[dict[str, str], ...]

PROMPTS: Final[dict[str, tuple[Messages, ...]]] = {
    task: tuple(tuple(r.messages) for r in measurement_pool(task))
    for task in ("code", "prose", "echo")
}


def prompt_sequence(task_class: str, start: int, count: int) -> list[tuple[str, Messages]]:
    """The (task, messages) pairs a run sends, in order: ``count`` from ``start`` of the pool.

    Every request of a run is a different prompt until the slice is used up. The sweep gives
    each level a slice of its own, sent by every mode, and restarts the backends a cell can
    use before it, so no backend meets a prompt whose answer it has already generated
    (ngram-mod would copy it back).
    """
    classes = list(PROMPTS) if task_class == "mixed" else [task_class]
    # Interleaved, so a mixed run alternates code, prose and echo.
    rounds = itertools.zip_longest(*(PROMPTS[c] for c in classes))
    pairs = [(c, p) for r in rounds for c, p in zip(classes, r, strict=True) if p is not None]
    start %= len(pairs)
    return (pairs[start:] + pairs[:start])[: count or len(pairs)]
