"""Text new to the engine: every mode and request its own copy, the same task, another answer.

Plain and ngram share one engine on the default layout, and its ngram-mod remembers every answer:
a prompt sent to plain and then to ngram is answered by copying (issue 45). The benchmarks that
send one prompt to several modes send each its own copy (``WorkloadRequest.renamed``) or restart
the engine between them; these tests hold the copies to what a benchmark needs of them.
"""

from __future__ import annotations

import itertools
import re

import pytest

from loadtests.prompts import REQUESTS, prompt_sequence, prompt_stream
from proxy.prompts import BENCH_TASKS, chat_body
from proxy.routing.classifier import TaskClassifier
from proxy.workload import (
    WorkloadRequest,
    fresh_word,
    measurement_pool,
    of_task,
    rename_identifiers,
)
from scripts.routing_benchmark import Sample, mode_messages, report, summary
from scripts.session_benchmark import one_per_engine

MODES = ("auto", "plain", "draft", "ngram")


def _text(request: WorkloadRequest) -> str:
    return repr(request.body)


def test_fresh_words_never_repeat_and_read_as_words() -> None:
    words = [fresh_word(n) for n in range(100_000)]
    assert len(set(words)) == len(words)
    assert all(re.fullmatch(r"[a-z]{6,}", w) for w in words)


def test_renaming_takes_identifiers_and_the_names_they_begin_not_other_words() -> None:
    text = "def run(x):\n    self.run()\n    run_impl = rerun(_run, run)\nRun the run_queue."
    assert rename_identifiers(text, ["run"], "kabo") == (
        "def run_kabo(x):\n    self.run_kabo()\n    run_kabo_impl = rerun(_run, run_kabo)\n"
        "Run the run_kabo_queue."
    )
    # The longer name first: a name that begins another is not renamed inside it twice.
    assert rename_identifiers("x x_value", ["x", "x_value"], "w") == "x_w x_value_w"
    # In code only: a name that is an English word too stays a word in the prose around it.
    prose = "Implement `which(cmd, mode)`: return the path which conforms to mode."
    assert rename_identifiers(prose, ["which", "mode"], "w", code_only=True) == (
        "Implement `which_w(cmd, mode_w)`: return the path which conforms to mode."
    )


def _copies(pool: tuple[WorkloadRequest, ...]) -> dict[tuple[int, int], WorkloadRequest]:
    """What the routing benchmark sends: request i, mode m, word i * modes + m."""
    return {
        (i, m): r.renamed(fresh_word(i * len(MODES) + m))
        for i, r in enumerate(pool)
        for m in range(len(MODES))
    }


@pytest.mark.parametrize("task", ["echo", "code", "prose"])
def test_every_mode_and_request_gets_text_of_its_own_in_the_same_class(task: str) -> None:
    pool = measurement_pool(task)
    copies = _copies(pool)
    texts = {_text(c) for c in copies.values()} | {_text(r) for r in pool}
    assert len(texts) == len(copies) + len(pool), "no two copies, nor a copy and its original"
    classifier = TaskClassifier()
    moved = 0
    for (i, _), copy in copies.items():
        before, after = classifier.classify(pool[i].body), classifier.classify(copy.body)
        assert copy.task == pool[i].task and copy.kind == pool[i].kind
        # The same class, or (one prose question the classifier reads as code) the right one.
        assert after in (before, task)
        moved += after != before
        # A system prompt is the client's own: it stays, as the prompt cache would see it.
        assert copy.messages[0] == pool[i].messages[0]
    assert moved <= len(copies) // 100


def test_an_edits_copy_asks_for_lines_that_name_something_new() -> None:
    # The edited lines are where an engine that saw another mode's answer would copy: the
    # instruction names the renamed function (and the name it gives), and the file defines it.
    for i, request in enumerate(measurement_pool("echo")[:40]):
        word = fresh_word(i)
        copy = request.renamed(word)
        *_, instruction = copy.messages[-1]["content"].split("\n\n")
        function = request.names[0]
        assert f"{function}_{word}" in instruction
        assert re.search(rf"def {function}_{word}\(", copy.messages[-1]["content"])
        assert not re.search(rf"def {function}\(", copy.messages[-1]["content"])
        if "_impl everywhere" in instruction:
            assert f"{function}_{word}_impl" in instruction
        if "_value." in instruction:
            assert instruction.endswith(f"_value_{word}.")


def test_new_codes_copy_asks_for_a_function_and_parameters_named_anew() -> None:
    request = next(r for r in measurement_pool("code") if r.names[0] == "wrap")
    copy = request.renamed("kabo")
    question = copy.messages[-1]["content"]
    assert question.startswith("Implement `wrap_kabo(text_kabo, width_kabo=70, **kwargs_kabo)`")
    # The docstring is prose: its words stay.
    assert question.endswith("Wrap a single paragraph of text, returning a list of wrapped lines.")


def test_a_questions_copy_asks_about_the_real_function_under_an_alias_to_answer_with() -> None:
    request = next(r for r in measurement_pool("prose") if r.names[0] == "split")
    copy = request.renamed("kabo")
    question = copy.messages[-1]["content"]
    assert "shlex.split()" not in question and "split_kabo()" in question
    assert "from shlex import split as split_kabo" in question
    assert "call it split_kabo in your answer" in question


def test_a_request_whose_answer_names_nothing_cannot_be_made_new() -> None:
    unnamed = next(r for r in of_task("prose"))
    with pytest.raises(ValueError, match="names nothing"):
        unnamed.renamed("kabo")
    fim = next(r for r in of_task("fim"))
    copy = fim.renamed("kabo")
    assert f"{fim.names[0]}_kabo" in copy.body["input_prefix"]


@pytest.mark.parametrize("task", BENCH_TASKS)
def test_bench_runs_each_send_a_copy_of_their_own_in_the_same_class(task: str) -> None:
    classifier = TaskClassifier()
    original = chat_body(task, 150)
    copies = [chat_body(task, 150, word=fresh_word(n)) for n in range(6)]
    texts = {repr(b["messages"]) for b in [original, *copies]}
    assert len(texts) == 7
    for n, body in enumerate(copies):
        assert classifier.classify(body) == classifier.classify(original)
        word = fresh_word(n)
        user = body["messages"][-1]["content"]
        if task == "prose":
            assert user.endswith(f"Il guardiano del faro si chiama {word.capitalize()}.")
        elif task == "edit":
            assert f"rgb_to_hls_{word} to rgb_to_hsl_{word}" in user
        else:
            assert f"LRUCache_{word}" in user and f"put_{word}" in user
    # The same copy for the same word: every configuration measures the same text.
    assert chat_body(task, 150, word="kabo") == chat_body(task, 150, word="kabo")


def test_routing_benchmark_modes_each_send_their_own_copy() -> None:
    jobs = [(r.task, r) for task in ("echo", "code", "prose") for r in REQUESTS[task][:3]]
    sent = mode_messages(jobs, list(MODES))
    texts = {repr(m) for mode in MODES for m in sent[mode]}
    assert len(texts) == len(MODES) * len(jobs)
    assert not texts & {repr(r.messages) for _, r in jobs}
    identical = mode_messages(jobs, list(MODES), identical=True)
    assert all(identical[mode] == [r.messages for _, r in jobs] for mode in MODES)
    # --runs: a later run's copies are new again, so no run's engine met an earlier run's text.
    later = {
        repr(m)
        for run in (1, 2)
        for s in mode_messages(jobs, list(MODES), run=run).values()
        for m in s
    }
    assert len(later) == 2 * len(texts) and not later & texts


def test_a_locust_run_that_uses_up_its_slice_sends_it_again_renamed() -> None:
    first = prompt_sequence("echo", 20, 5)
    sent = list(itertools.islice(prompt_stream("echo", 20, 5), 15))
    assert sent[:5] == first
    assert len({repr(m) for _, m in sent}) == 15
    assert [t for t, _ in sent] == ["echo"] * 15
    # Every mode of a level sends the same passes.
    assert sent == list(itertools.islice(prompt_stream("echo", 20, 5), 15))
    mixed = [t for t, _ in itertools.islice(prompt_stream("mixed", 0, 3), 6)]
    assert mixed == ["code", "prose", "echo"] * 2


def test_session_benchmark_restarts_each_engine_once() -> None:
    health = {
        "plain": {"engine": "coder", "state": "ready"},
        "draft": {"engine": "draft", "state": "ready"},
        "ngram": {"engine": "coder", "state": "ready"},
        "old": {"state": "ready"},
    }
    assert one_per_engine(health) == ["plain", "draft", "old"]


def test_routing_benchmark_pools_runs_and_says_how_many(capsys: pytest.CaptureFixture[str]) -> None:
    def run(speed: dict[str, float]) -> dict[str, list[Sample]]:
        return {
            mode: [
                Sample(task, mode, "fastest", 100, 100 / speed[mode]) for task in ("echo", "prose")
            ]
            for mode in ("auto", "plain", "ngram")
        }

    one, two = (
        run({"auto": 30, "plain": 20, "ngram": 40}),
        run({"auto": 40, "plain": 20, "ngram": 40}),
    )
    assert summary(one, ["echo", "prose"]).startswith("auto 30.0 t/s = 75.0% of the oracle")
    pooled = {mode: one[mode] + two[mode] for mode in one}
    report(pooled, ["echo", "prose"], 256, False, 2)
    out = capsys.readouterr().out
    assert "4 requests per mode over 2 runs" in out
    assert "auto = 85.7% of the oracle" in out
