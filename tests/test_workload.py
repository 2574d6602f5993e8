"""The workload: calibration and measurement requests kept apart, and each sweep cell's own."""

from __future__ import annotations

import pytest

from loadtests.prompts import PROMPTS, prompt_sequence
from loadtests.sweep import prompt_slices, warm_up_prompts
from proxy.routing.calibration import calibration_requests
from proxy.tasks import TASK_CLASSES
from proxy.workload import measurement_pool, of_task, workload

# The default slot of the CPU config: 8192 tokens of context over 4 slots, 64 generated.
SLOT_TOKENS = 8192 // 4 - 64


def _key(messages: object) -> str:
    return repr(messages)


@pytest.mark.parametrize("task", TASK_CLASSES)
def test_measurement_requests_are_never_calibration_requests(task: str) -> None:
    calibration = {_key(r.messages) for r in of_task(task)}
    pool = [_key(r.messages) for r in measurement_pool(task)]
    assert len(pool) >= 200
    assert len(set(pool)) == len(pool), "every measurement request is a different prompt"
    assert not calibration & set(pool)
    # Calibration reads at most what the workload defines, whatever calibration_prompts says.
    assert {_key(r.messages) for r in calibration_requests(task, 99, 10**6)} == calibration


def test_pool_edits_paste_real_files_and_fit_a_default_slot() -> None:
    edits = measurement_pool("echo")
    kinds = {r.kind for r in edits}
    assert kinds == {"whole-file edit", "search/replace edit"}
    files = {r.messages[-1]["content"].split("\n", 1)[0] for r in edits}
    assert len(files) == 4 and all(f.startswith("Lib/") for f in files)
    calibration_files = {r.messages[-1]["content"].split("\n", 1)[0] for r in of_task("echo")}
    assert not files & calibration_files
    # Three characters per token over-estimates code's token count with these tokenizers.
    assert max(r.prompt_chars() for r in edits) // 3 <= SLOT_TOKENS


def test_pool_questions_are_short_and_under_a_coding_system_prompt() -> None:
    for task in ("code", "prose"):
        for r in measurement_pool(task):
            system, user = r.messages
            assert system["role"] == "system" and "software developer" in system["content"]
            assert len(user["content"]) < 2000


def test_every_sweep_cell_gets_prompts_no_other_cell_sends() -> None:
    levels, modes = (1, 2, 4, 8), ("plain", "draft", "ngram", "auto")
    plan = [(t, lv, m) for t in PROMPTS for lv in levels for m in modes]
    sizes = {t: len(PROMPTS[t]) for t in PROMPTS}
    slices = prompt_slices(plan, sizes)
    assert set(slices) == set(plan)
    for task in PROMPTS:
        used: list[int] = []
        for (t, level, _), (start, count) in slices.items():
            if t == task:
                assert count >= level, "each concurrent user has a prompt of its own"
                used += range(start, start + count)
        assert len(used) == len(set(used)), "no prompt is in two cells"
        assert max(used) < sizes[task]
    # More concurrent users get more prompts: a cell at 8 issues more requests than one at 1.
    assert slices[("echo", 8, "auto")][1] > slices[("echo", 1, "auto")][1]


def test_warm_up_covers_every_prefix_once_with_prompts_no_cell_sends() -> None:
    echo = warm_up_prompts("echo")
    assert len(echo) == 8  # four files, two edit formats
    assert len(warm_up_prompts("code")) == 1  # one system prompt; the questions are short
    for task in PROMPTS:
        for warm in warm_up_prompts(task):
            assert warm not in PROMPTS[task]
            # The same prefix as pool requests: the file is processed once, before any cell.
            prefix = warm[-1]["content"].removesuffix("Reply with OK.")
            assert any(m[-1]["content"].startswith(prefix) for m in PROMPTS[task])


def test_a_locust_run_sends_its_slice_in_order_then_starts_it_again() -> None:
    pool = PROMPTS["code"]
    sequence = prompt_sequence("code", 10, 3)
    assert [m for _, m in sequence] == list(pool[10:13])
    assert prompt_sequence("code", len(pool) - 1, 2)[1][1] == pool[0]
    assert len(prompt_sequence("code", 0, 0)) == len(pool)
    mixed = [task for task, _ in prompt_sequence("mixed", 0, 6)]
    assert mixed == ["code", "prose", "echo"] * 2


def test_workload_still_holds_fim_and_every_class() -> None:
    assert {r.task for r in workload()} == {*TASK_CLASSES, "fim"}
