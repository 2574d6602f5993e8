"""`specproxy bench` without backends: text comparison, task names, the edit row."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from proxy.bench.report import first_difference
from proxy.prompts import BENCH_TASKS, chat_body
from tests.helpers import ROOT, clean_env


def test_first_difference() -> None:
    assert first_difference("abc", "abc") is None
    assert first_difference("abcd", "abXd") == 2
    assert first_difference("ab", "abc") == 2


def test_unknown_task_is_refused_before_anything_starts(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "--config", str(ROOT / "tests" / "configs" / "test.yaml"),
         "bench", "--out", str(tmp_path), "--tasks", "code,edits"],
        cwd=ROOT, capture_output=True, text=True, timeout=60, env=clean_env(),
    )  # fmt: skip
    assert result.returncode == 2
    assert "unknown task edits" in result.stderr and "prose, code, echo, edit" in result.stderr
    assert not any(tmp_path.iterdir())


def test_edit_row_is_a_whole_file_edit_of_a_real_module() -> None:
    assert BENCH_TASKS == ("prose", "code", "echo", "edit")
    system, user = chat_body("edit", 150)["messages"]
    assert "COMPLETE updated file" in system["content"]
    assert user["content"].startswith("Lib/") and user["content"].count("\n") > 100
