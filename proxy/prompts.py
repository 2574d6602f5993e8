"""Reference prompts per task class: the lab's, used by calibration and `specproxy bench`.

`specproxy bench` sends each run its own copy (``chat_body``'s ``word``): the names the answer
writes renamed (``proxy.workload.rename_identifiers``), and the story's lighthouse keeper named,
so no run meets an answer its engine generated for an earlier one.
"""

from __future__ import annotations

from typing import Any, Final

from proxy.workload import of_task, rename_identifiers

_LRU = """class LRUCache:
    def __init__(self, capacity):
        self.capacity = capacity
        self.items = {}
        self.order = []

    def get(self, key):
        if key not in self.items:
            return -1
        self.order.remove(key)
        self.order.append(key)
        return self.items[key]

    def put(self, key, value):
        if key in self.items:
            self.order.remove(key)
        elif len(self.items) >= self.capacity:
            oldest = self.order.pop(0)
            del self.items[oldest]
        self.items[key] = value
        self.order.append(key)
"""

REFERENCE_PROMPTS: dict[str, str] = {
    # The lab's two prompts (docs/benchmarks.md, "The lab table"), verbatim.
    "prose": "Scrivi un racconto di 300 parole su un faro abbandonato, con un finale a sorpresa.",
    "code": "Scrivi in Python una classe LRUCache con metodi get e put, complessità O(1), "
    "con docstring e un piccolo test.",
    # The lab's rewrite prompt: output that repeats its input.
    "echo": "Add type hints to this Python code. Return the full code and nothing else.\n\n"
    f"```python\n{_LRU}```",
}


# The names each reference prompt's answer writes: what a run's copy renames. The story has none:
# its copy names the lighthouse keeper, whom the story then names.
_REFERENCE_NAMES: Final = {
    "code": ("LRUCache", "get", "put"),
    "echo": ("LRUCache", "get", "put", "items", "order"),
}

# `specproxy bench`'s echo-heavy row: a whole-file edit of a real module in the shape editing
# assistants send (the workload's rename in the 166-line colorsys.py: docs/benchmarks.md).
EDIT_TASK: Final = "edit"
_EDIT_FILE: Final = "Lib/colorsys.py\n"
BENCH_TASKS: Final = (*REFERENCE_PROMPTS, EDIT_TASK)


def _messages(task: str, word: str | None) -> list[dict[str, str]]:
    if task == EDIT_TASK:
        edits = [r for r in of_task("echo") if r.kind == "whole-file edit"]
        edit = next(r for r in edits if r.messages[-1]["content"].startswith(_EDIT_FILE))
        return (edit if word is None else edit.renamed(word)).messages
    prompt = REFERENCE_PROMPTS[task]
    if word is not None and task in _REFERENCE_NAMES:
        prompt = rename_identifiers(prompt, _REFERENCE_NAMES[task], word)
    elif word is not None:
        prompt += f" Il guardiano del faro si chiama {word.capitalize()}."
    return [{"role": "user", "content": prompt}]


def chat_body(
    task: str,
    max_tokens: int,
    temperature: float = 0.0,
    seed: int = 42,
    word: str | None = None,
) -> dict[str, Any]:
    """An OpenAI chat request for a bench task's reference prompt (``BENCH_TASKS``); with a
    word (``proxy.workload.fresh_word``), a copy of it no other word gives: the names its answer
    writes renamed, the story's keeper named."""
    return {
        "messages": _messages(task, word),
        "max_tokens": max_tokens,
        "temperature": temperature,
        "seed": seed,
    }


def infill_body(max_tokens: int, seed: int = 42) -> dict[str, Any]:
    """A llama.cpp /infill request: the reference class with one method body left to fill."""
    head, _, tail = _LRU.partition(
        "        self.order.remove(key)\n        self.order.append(key)\n"
    )
    return {
        "input_prefix": head,
        "input_suffix": tail,
        "n_predict": max_tokens,
        "temperature": 0.0,
        "seed": seed,
    }
