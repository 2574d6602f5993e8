"""The workload: calibration and measurement requests kept apart, and each sweep cell's own."""

from __future__ import annotations

import pytest

from loadtests.measure import RunSummary
from loadtests.prompts import PROMPTS, prompt_sequence
from loadtests.report import Cell, auto_lines
from loadtests.sweep import prompt_slices, restart_before, warm_up_prompts
from proxy.api.background import calibration_requests
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


def test_every_mode_at_a_level_gets_the_same_prompts_and_levels_disjoint_ones() -> None:
    levels = [1, 2, 4, 8]
    sizes = {t: len(PROMPTS[t]) for t in PROMPTS}
    slices = prompt_slices(levels, sizes)
    assert set(slices) == {(t, lv) for t in PROMPTS for lv in levels}
    for task in PROMPTS:
        used: list[int] = []
        for level in levels:
            start, count = slices[(task, level)]
            # A cell cycles only once its slice is used up: at 8 users, 8 cells' worth of edits.
            assert count >= 4 * level, "a cell should not run out of prompts of its own"
            used += range(start, start + count)
        assert len(used) == len(set(used)), "no prompt is in two levels"
        assert max(used) < sizes[task]
    assert slices[("echo", 8)][1] > slices[("echo", 1)][1]


def test_before_each_cell_the_backends_it_can_use_start_afresh() -> None:
    backends = ["plain", "draft", "ngram", "auto"]
    kinds = {"plain": "plain", "draft": "draft-simple", "ngram": "ngram-mod"}
    for task in ("code", "prose"):
        assert restart_before(task, "plain", backends, kinds) == ["plain"]
        assert restart_before(task, "auto", backends, kinds) == ["plain", "draft", "ngram"]
    # Edits: only the n-gram backend's memory of answers matters; files take minutes to warm.
    assert restart_before("echo", "ngram", backends, kinds) == ["ngram"]
    assert restart_before("echo", "auto", backends, kinds) == ["ngram"]
    assert restart_before("echo", "plain", backends, kinds) == []


def test_warm_up_of_a_cells_prompts_covers_their_prefixes_only() -> None:
    sent = [m for _, m in prompt_sequence("echo", 200, 10)]
    warm = warm_up_prompts("echo", sent)
    assert 1 <= len(warm) < len(warm_up_prompts("echo"))
    for messages in sent:
        assert any(
            messages[-1]["content"].startswith(w[-1]["content"].removesuffix("Reply with OK."))
            and messages[0] == w[0]
            for w in warm
        )


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


def _cell(backend: str, tps: float, answered: dict[str, int]) -> Cell:
    summary = RunSummary(4, 0, 0, int(tps * 40), 40.0, tps, None, None, None, answered)
    return Cell("prose", backend, 8, summary)


def test_auto_line_compares_auto_with_the_best_and_with_the_backend_it_used() -> None:
    cells = [
        _cell("plain", 20.0, {"plain": 4}),
        _cell("ngram", 22.0, {"ngram": 4}),
        _cell("auto", 16.0, {"plain": 5}),
    ]
    (line,) = auto_lines(cells, "prose", [8])
    assert line == (
        "- auto at 8: chose plain 100%; 73% of the best pinned backend (ngram, 22.0 tok/s), "
        "80% of plain pinned"
    )
    # Auto on the best backend: one comparison says it all.
    cells[2] = _cell("auto", 16.0, {"ngram": 5})
    assert auto_lines(cells, "prose", [8])[0].endswith("(ngram, 22.0 tok/s)")
