"""Each doc section rendered from a result file (loadtests/results.py) is what that file renders
now: a figure in the docs is the figure a run wrote. Re-render with the script named in the
section (`--render`)."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from loadtests.results import render_agents_oneline, render_text_calls, replace_section, section
from tests.helpers import ROOT

RESULTS = ROOT / "docs" / "results"
SECTIONS: list[tuple[Path, str, Callable[[dict[str, Any]], str]]] = [
    (ROOT / "docs" / "agents.md", "agents-oneline", render_agents_oneline),
    (ROOT / "docs" / "agents.md", "text-calls", render_text_calls),
]


@pytest.mark.parametrize(("doc", "name", "render"), SECTIONS, ids=[s[1] for s in SECTIONS])
def test_each_rendered_section_is_its_result_file(
    doc: Path, name: str, render: Callable[[dict[str, Any]], str]
) -> None:
    result = RESULTS / f"{name}.json"
    assert result.is_file(), f"{result} is missing: run the script its section names"
    assert section(doc.read_text(), name) == render(json.loads(result.read_text())), (
        f"{doc.name}'s {name} section is stale: re-render it from {result.name} (--render)"
    )


def test_a_section_is_replaced_between_its_markers_only() -> None:
    doc = "a\n<!-- results:x -->\nold\n<!-- /results:x -->\nb\n"
    assert (
        replace_section(doc, "x", "new\n") == "a\n<!-- results:x -->\nnew\n<!-- /results:x -->\nb\n"
    )
    with pytest.raises(ValueError, match="no <!-- results:y -->"):
        replace_section(doc, "y", "z")
