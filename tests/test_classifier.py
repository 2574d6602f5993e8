"""Tests for the rule-based task classifier.

Labelling rule for tests/data/labelled_requests.jsonl: label by what the *answer* will be.

- echo: the answer largely repeats text that is in the request.  A rewrite, edit, proofread,
  translation, reformat or refactor of a payload (roughly 150+ characters, in the message or in
  the recent turns), or an explicit repetition ("repeat this five times", "echo back").  Edits
  that keep meaning or behaviour (refactor, add docstrings/type hints/comments, rename, port to
  another language, apply a diff, "return the full file") are echo even when a short
  explanation is also asked for, because the repeated text dominates the output.
- code: the answer is code or is about specific code: writing, completing (FIM), explaining,
  reviewing, debugging or testing code, shell/git/tool how-tos, CS questions answered with
  code.  Also any request with ``tools``/``functions`` (the answer is a structured call), and
  neutral follow-ups inside a coding session (a coding-assistant system prompt or code in the
  recent turns): "hi, how are you" under a Continue prompt is code.  A change that adds
  behaviour or fixes a bug in given code ("make it a generator", "why does this crash") is code,
  not echo.
- prose: everything else, including narrative about computing (history, biographies, careers,
  advice on learning to code), stories, poems and emails that mention code, summaries,
  critiques and titles of a pasted text, and translating a short phrase ("how do you say
  'thank you' in Japanese") since nothing substantial is repeated.

Timing is not asserted here (the machine is noisy); see scripts/classifier_speed.py.
"""

from __future__ import annotations

import json
from collections import Counter
from functools import lru_cache
from pathlib import Path
from typing import Any

import pytest

from proxy.routing.classifier import TASK_CLASSES, TaskClass, TaskClassifier

DATA = Path(__file__).parent / "data" / "labelled_requests.jsonl"
MIN_SCORE = 0.95

CONTINUE_SYSTEM = (
    "You are an expert software developer. You give helpful and concise responses. When you "
    "write code blocks, always include the language and the file path in the info string. "
    "Prefer the libraries and conventions already used in the user's workspace. " * 4
)


@lru_cache(maxsize=1)
def labelled() -> tuple[dict[str, Any], ...]:
    with DATA.open(encoding="utf-8") as fh:
        return tuple(json.loads(line) for line in fh if line.strip())


@pytest.fixture(scope="module")
def classifier() -> TaskClassifier:
    return TaskClassifier()


def chat(user: Any, system: str | None = None, **extra: Any) -> dict[str, Any]:
    messages: list[dict[str, Any]] = []
    if system is not None:
        messages.append({"role": "system", "content": system})
    messages.append({"role": "user", "content": user})
    return {"model": "auto", "messages": messages, **extra}


def scores(
    classifier: TaskClassifier, items: tuple[dict[str, Any], ...]
) -> tuple[dict[TaskClass, tuple[float, float]], str]:
    """Per-class (precision, recall) and a printable confusion matrix with the misses."""
    confusion: Counter[tuple[str, str]] = Counter()
    misses: list[str] = []
    for item in items:
        predicted = classifier.classify(item["body"])
        confusion[item["label"], predicted] += 1
        if predicted != item["label"]:
            misses.append(f"  {item['label']} -> {predicted}: {item['note']}")
    result: dict[TaskClass, tuple[float, float]] = {}
    for cls in TASK_CLASSES:
        hits = confusion[cls, cls]
        predicted_as = sum(confusion[other, cls] for other in TASK_CLASSES)
        actual = sum(confusion[cls, other] for other in TASK_CLASSES)
        result[cls] = (hits / max(predicted_as, 1), hits / max(actual, 1))
    header = "label \\ predicted " + " ".join(f"{c:>7}" for c in TASK_CLASSES)
    rows = [
        f"{label:>17} " + " ".join(f"{confusion[label, c]:>7}" for c in TASK_CLASSES)
        for label in TASK_CLASSES
    ]
    return result, "\n".join([header, *rows, "misclassified:", *misses])


def assert_scores(classifier: TaskClassifier, items: tuple[dict[str, Any], ...]) -> None:
    result, report = scores(classifier, items)
    low = {cls: pr for cls, pr in result.items() if pr[0] < MIN_SCORE or pr[1] < MIN_SCORE}
    assert not low, f"precision/recall below {MIN_SCORE}: {low}\n{report}"


# ------------------------------------------------------------------------- labelled set


def test_labelled_set_is_large_and_balanced() -> None:
    items = labelled()
    counts = Counter(item["label"] for item in items)
    assert len(items) >= 200
    assert set(counts) == set(TASK_CLASSES)
    assert min(counts.values()) >= 60, counts
    for item in items:
        assert isinstance(item["body"], dict)
        assert isinstance(item["note"], str) and item["note"]


def test_precision_and_recall_on_labelled_set(classifier: TaskClassifier) -> None:
    assert_scores(classifier, labelled())


def test_precision_and_recall_on_holdout(classifier: TaskClassifier) -> None:
    # Every 5th example was held out while tuning the rules.
    assert_scores(classifier, labelled()[4::5])


# ------------------------------------------------------------------------- robustness

ODD_BODIES: list[Any] = [
    None,
    "not a body",
    42,
    [],
    [{"role": "user", "content": "hi"}],
    {},
    {"model": "x"},
    {"messages": None},
    {"messages": "write a python function"},
    {"messages": []},
    {"messages": [None, 3, "x"]},
    {"messages": [{"role": "user"}]},
    {"messages": [{"role": "user", "content": None}]},
    {"messages": [{"role": "user", "content": 12345}]},
    {"messages": [{"role": "user", "content": {"text": "def f(): pass"}}]},
    {"messages": [{"role": "user", "content": [None, 1, "def f(): pass", {"type": "text"}]}]},
    {"messages": [{"role": "user", "content": [{"type": "text", "text": None}]}]},
    {
        "messages": [
            {
                "role": "user",
                "content": [{"type": "image_url", "image_url": {"url": "data:image/png;base64,"}}],
            }
        ]
    },
    {"messages": [{"role": None, "content": ""}, {"content": ["a", "b"]}]},
    {"messages": [{"role": "system", "content": None}, {"role": "user", "content": ""}]},
    {"prompt": None},
    {"prompt": 7},
    {"prompt": [1, 2, None]},
    {"prompt": b"def f(): pass"},
    {"prompt": ""},
    {"tools": [], "messages": [{"role": "user", "content": "hello"}]},
    {"tools": "not a list", "messages": [{"role": "user", "content": "hello"}]},
    {"tools": None, "functions": None},
]


@pytest.mark.parametrize("body", ODD_BODIES, ids=[repr(b)[:50] for b in ODD_BODIES])
def test_odd_bodies_are_prose_and_never_raise(classifier: TaskClassifier, body: Any) -> None:
    # The internal path must cope by itself, not only thanks to classify's safety net.
    assert classifier._classify(body) == "prose"
    assert classifier.classify(body) == "prose"


def test_very_long_requests_still_classify(classifier: TaskClassifier) -> None:
    story = "The lighthouse keeper walked along the shore and watched the boats. " * 15_000
    assert classifier.classify(chat("What do you think of my novel?\n\n" + story)) == "prose"
    code = "```python\n" + "def step(x):\n    return x + 1\n\n" * 20_000 + "```"
    assert classifier.classify(chat("Why is this so slow?\n\n" + code)) == "code"
    assert classifier.classify(chat("Add type hints to every function:\n\n" + code)) == "echo"


# ------------------------------------------------------------------------- targeted cases


def test_task_classes_constant() -> None:
    assert TASK_CLASSES == ("code", "prose", "echo")


def test_lab_prompts(classifier: TaskClassifier) -> None:
    story = "Scrivi un racconto di 300 parole su un faro abbandonato, con un finale a sorpresa."
    lru = (
        "Scrivi in Python una classe LRUCache con metodi get e put, complessità O(1), "
        "con docstring e un piccolo test."
    )
    assert classifier.classify(chat(story)) == "prose"
    assert classifier.classify(chat(lru)) == "code"


@pytest.mark.parametrize(
    ("prefix", "suffix", "middle"),
    [
        ("<|fim_prefix|>", "<|fim_suffix|>", "<|fim_middle|>"),
        ("<fim_prefix>", "<fim_suffix>", "<fim_middle>"),
        ("<PRE> ", " <SUF>", " <MID>"),
        ("<｜fim▁begin｜>", "<｜fim▁hole｜>", "<｜fim▁end｜>"),
    ],
)
def test_fim_markers_are_code(
    classifier: TaskClassifier, prefix: str, suffix: str, middle: str
) -> None:
    # Even when the surrounding text looks like prose.
    prompt = f"{prefix}Dear diary, today I{suffix} and then I went home.{middle}"
    assert classifier.classify({"prompt": prompt}) == "code"
    assert classifier.classify({"prompt": [prompt]}) == "code"
    assert classifier.classify(chat(prompt)) == "code"


def test_infill_body_is_code(classifier: TaskClassifier) -> None:
    body = {"input_prefix": "def add(a, b):\n    ", "input_suffix": "\n", "prompt": ""}
    assert classifier.classify(body) == "code"


def test_tools_schema_is_code(classifier: TaskClassifier) -> None:
    tools = [
        {
            "type": "function",
            "function": {
                "name": "get_weather",
                "parameters": {"type": "object", "properties": {"city": {"type": "string"}}},
            },
        }
    ]
    assert classifier.classify(chat("What's the weather in Rome?", tools=tools)) == "code"
    assert classifier.classify(chat("What's the weather in Rome?")) == "prose"


def test_explicit_repetition_is_echo(classifier: TaskClassifier) -> None:
    body = chat('Repeat this sentence five times: "I will check my work before I submit it."')
    assert classifier.classify(body) == "echo"
    assert classifier.classify(chat("Ripeti questa frase tre volte: 'Piano piano.'")) == "echo"


def test_writing_code_that_repeats_is_code(classifier: TaskClassifier) -> None:
    body = chat("Write a Python function that prints a string 5 times with a separator.")
    assert classifier.classify(body) == "code"


def test_italian_rewrite_needs_a_payload(classifier: TaskClassifier) -> None:
    text = (
        "Gentile professore, le scrivo per chiederle se è possibile spostare il ricevimento di "
        "giovedì perchè ho un esame nello stesso orario. Avrei bisogno di parlarle della tesi, "
        "in particolare del capitolo sui metodi. La ringrazio e le porgo cordiali saluti."
    )
    assert classifier.classify(chat(f"Riscrivi questo testo in modo più formale:\n\n{text}")) == (
        "echo"
    )
    no_payload = "Riscrivi la storia di Cappuccetto Rosso ambientata su Marte."
    assert classifier.classify(chat(no_payload)) == "prose"


def test_code_edit_vs_code_question(classifier: TaskClassifier) -> None:
    snippet = (
        "```python\ndef load(path):\n    rows = []\n    for line in open(path):\n"
        "        rows.append(line.strip().split(','))\n    return rows\n```"
    )
    assert classifier.classify(chat(f"Add type hints and a docstring:\n\n{snippet}")) == "echo"
    assert classifier.classify(chat(f"What does this function do?\n\n{snippet}")) == "code"


def test_coding_system_prompt_decides_neutral_messages(classifier: TaskClassifier) -> None:
    assert classifier.classify(chat("hi, how are you", system=CONTINUE_SYSTEM)) == "code"
    assert classifier.classify(chat("hi, how are you")) == "prose"
    haiku = chat("Write a haiku about autumn leaves.", system=CONTINUE_SYSTEM)
    assert classifier.classify(haiku) == "prose"


def test_python_the_snake_is_prose(classifier: TaskClassifier) -> None:
    body = chat("Write a short story about a python that escapes from the zoo.")
    assert classifier.classify(body) == "prose"


def test_content_parts_are_read(classifier: TaskClassifier) -> None:
    parts = [{"type": "text", "text": "Write a bash script that"}, {"type": "text", "text": "x"}]
    assert classifier.classify(chat(parts)) == "code"
