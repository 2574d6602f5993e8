"""The repository cites nothing outside itself: no notes of the lab's (its CLIENTS.md, FACTS.md,
ANCHORS.md, seeds) and no path into the folder beside the checkout that holds them; what the code
needs from them is in docs/ (fast tier)."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

from tests.helpers import ROOT

CHECKED = ["proxy", "loadtests", "scripts", "tests", "docs", "deploy", "README.md"]
OUTSIDE = re.compile(
    r"\b(?:CLIENTS|FACTS|ANCHORS)\.md\b"  # the lab's notes, by name
    r"|(?:/work|\.\.)/shared\b"  # their folder, beside the checkout
    r"|\bseeds/\d"  # the lab's seed exercises
)


def tracked(paths: list[str]) -> list[Path]:
    """The files git tracks under `paths`."""
    listed = subprocess.run(
        ["git", "-C", str(ROOT), "ls-files", "-z", "--", *paths],
        capture_output=True,
        check=True,
    ).stdout.decode()
    return [ROOT / name for name in listed.split("\0") if name]


def test_no_tracked_file_cites_notes_outside_the_repository() -> None:
    files = [f for f in tracked(CHECKED) if f != Path(__file__)]
    assert len(files) > 100, "git listed too few files: is this a checkout?"
    cited = [
        f"{f.relative_to(ROOT)}:{n}: {m.group(0)}"
        for f in files
        if f.is_file()
        for n, line in enumerate(f.read_bytes().decode(errors="ignore").splitlines(), 1)
        for m in OUTSIDE.finditer(line)
    ]
    assert not cited, "cite docs/ (e.g. docs/agents.md) instead:\n" + "\n".join(cited)


def test_the_pattern_finds_what_it_is_for_and_not_in_repo_paths() -> None:
    for citing in ("(shared CLIENTS.md)", "FACTS.md's table", "/work/shared/ANCHORS", "seeds/000"):
        assert OUTSIDE.search(citing), citing
    for fine in ("docs/agents.md", 'tmp_path / "shared" / "x"', "build/classifier-eval"):
        assert not OUTSIDE.search(fine), fine
