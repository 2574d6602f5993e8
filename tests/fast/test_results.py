"""Each doc section rendered from a result file (loadtests/results.py) is what that file renders
now: a figure in the docs is the figure a run wrote. Re-render with the script named in the
section (`--render`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loadtests.results import (
    not_run,
    render_agents_oneline,
    render_text_calls,
    replace_section,
    section,
)
from tests.helpers import ROOT

RESULTS = ROOT / "docs" / "results"
# Each section: its doc, its name (and result file's), how it is rendered, the script that
# writes the file.
SECTIONS: list[tuple[Path, str, Callable[[dict[str, Any]], str], str]] = [
    (
        ROOT / "docs" / "agents.md",
        "agents-oneline",
        render_agents_oneline,
        "scripts/agents_oneline.py",
    ),
    (
        ROOT / "docs" / "agents.md",
        "text-calls",
        render_text_calls,
        "scripts/text_calls_benchmark.py",
    ),
]


@pytest.mark.parametrize(
    ("doc", "name", "render", "script"), SECTIONS, ids=[s[1] for s in SECTIONS]
)
def test_each_rendered_section_is_its_result_file(
    doc: Path, name: str, render: Callable[[dict[str, Any]], str], script: str
) -> None:
    result = RESULTS / f"{name}.json"
    shown = section(doc.read_text(), name)
    if not result.is_file():
        # No figures without a run behind them: the section says it was not run.
        assert shown == not_run(script), f"{doc.name}'s {name} section has no {result.name}"
        return
    assert shown == render(json.loads(result.read_text())), (
        f"{doc.name}'s {name} section is stale: re-render it from {result.name} (--render)"
    )


def test_a_section_is_replaced_between_its_markers_only() -> None:
    doc = "a\n<!-- results:x -->\nold\n<!-- /results:x -->\nb\n"
    assert (
        replace_section(doc, "x", "new\n") == "a\n<!-- results:x -->\nnew\n<!-- /results:x -->\nb\n"
    )
    with pytest.raises(ValueError, match="no <!-- results:y -->"):
        replace_section(doc, "y", "z")
