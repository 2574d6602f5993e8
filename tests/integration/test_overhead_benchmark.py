"""The overhead benchmark runs end to end on a tiny setting: every row is there, numbers positive.

It starts processes (the stub upstream, `specproxy serve`, the client), so it is integration tier;
LiteLLM is skipped (it would be installed from PyPI). The numbers themselves are not compared:
on a tiny, shared machine a proxy row may even beat the direct one.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT

SCRIPT = ROOT / "scripts" / "overhead_benchmark.py"
SETTINGS = ("direct", "specproxy (stub)", "specproxy (auto)")
MODES = ("streamed", "not streamed")


def table_rows(text: str, header_start: str) -> list[dict[str, str]]:
    """The rows of the markdown table whose header begins with header_start, by column."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header_start))
    names = [c.strip() for c in lines[start].strip("|").split("|")]
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append(dict(zip(names, (c.strip() for c in line.strip("|").split("|")), strict=True)))
    return rows


def number(cell: str) -> float:
    return float(cell.replace(",", ""))


def test_tiny_run_writes_every_row_with_positive_numbers(tmp_path: Path) -> None:
    out = tmp_path / "overhead.md"
    argv = [
        sys.executable,
        str(SCRIPT),
        "--clients",
        "1",
        "--seconds",
        "1",
        "--streams",
        "20",
        "--skip-litellm",
        "--out",
        str(out),
    ]
    done = subprocess.run(argv, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    text = out.read_text()
    assert text.strip() == done.stdout.strip()  # printed and written
    assert "- commit: " in text
    assert "--skip-litellm" in text  # the exact command is stamped
    assert "stub" in text

    loops = table_rows(text, "| setting | clients | mode |")
    seen = {(r["setting"], r["mode"]) for r in loops}
    assert seen == {(s, m) for s in SETTINGS for m in MODES}
    for row in loops:
        assert row["clients"] == "1"
        assert number(row["req/s"]) > 0, row
        assert number(row["p50 ms"]) > 0, row
        assert number(row["p99 ms"]) >= number(row["p50 ms"]), row
        assert row["errors"] == "0", row
        if row["setting"] != "direct":
            number(row["added p50 ms vs direct"])  # a number (of either sign), not missing

    streams = table_rows(text, "| setting | streams |")
    assert [r["setting"] for r in streams] == ["direct", "specproxy (stub)"]
    for row in streams:
        assert row["streams"] == "20"
        assert row["completed"] == "20", row
        assert number(row["wall s"]) > 0, row
    proxy = streams[1]
    assert number(proxy["RSS before MiB"]) > 0
    assert number(proxy["RSS peak MiB"]) >= number(proxy["RSS before MiB"])
    assert number(proxy["wall / direct"]) > 0
