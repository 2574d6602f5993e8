"""The load tests' requests by task class: the chat part of the workload's measurement pool.

``proxy.workload`` documents the mix: whole-file and search/replace edits of standard-library
modules (echo), new code and technical questions under a coding assistant's system prompt
(code, prose), each request different from the others and from what calibration sends, so no
backend has seen a prompt before (ngram-mod remembers every prompt and answer it served).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import Final

from proxy.workload import WorkloadRequest, fresh_word, measurement_pool

Messages = tuple[dict[str, str], ...]

REQUESTS: Final[dict[str, tuple[WorkloadRequest, ...]]] = {
    task: measurement_pool(task) for task in ("code", "prose", "echo")
}
PROMPTS: Final[dict[str, tuple[Messages, ...]]] = {
    task: tuple(tuple(r.messages) for r in requests) for task, requests in REQUESTS.items()
}


def _request_sequence(task_class: str, start: int, count: int) -> list[WorkloadRequest]:
    classes = list(REQUESTS) if task_class == "mixed" else [task_class]
    # Interleaved, so a mixed run alternates code, prose and echo.
    rounds = itertools.zip_longest(*(REQUESTS[c] for c in classes))
    requests = [r for row in rounds for r in row if r is not None]
    start %= len(requests)
    return (requests[start:] + requests[:start])[: count or len(requests)]


def prompt_sequence(task_class: str, start: int, count: int) -> list[tuple[str, Messages]]:
    """The (task, messages) pairs a run sends first, in order: ``count`` from ``start`` of the
    pool.

    Every request of a run is a different prompt until the slice is used up (``prompt_stream``
    then sends it again renamed). The sweep gives each level a slice of its own, sent by every
    mode, and restarts the backends a cell can use before it, so no backend meets a prompt whose
    answer it has already generated (ngram-mod would copy it back).
    """
    return [(r.task, tuple(r.messages)) for r in _request_sequence(task_class, start, count)]


def prompt_stream(task_class: str, start: int, count: int) -> Iterator[tuple[str, Messages]]:
    """What a run sends, endlessly: ``prompt_sequence``, then the same slice again and again,
    each pass with the names the answers write renamed afresh (``WorkloadRequest.renamed``), so
    a run that uses up its slice still sends its engine no prompt it has answered. Every mode
    gets the same passes."""
    requests = _request_sequence(task_class, start, count)
    yield from ((r.task, tuple(r.messages)) for r in requests)
    for n in itertools.count():
        word = fresh_word(n)
        yield from ((r.task, tuple(r.renamed(word).messages)) for r in requests)
