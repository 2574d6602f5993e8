"""`specproxy bench` on real backends: the lab's table and its files."""

from __future__ import annotations

import csv
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT, clean_env


def run_bench(config: str, out: Path, *args: str) -> str:
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "--config", str(ROOT / "tests" / "configs" / config),
         "bench", "--out", str(out), "--tokens", "24", *args],
        cwd=ROOT, capture_output=True, text=True, timeout=600,
        env=clean_env(SPECPROXY_LOG_FORMAT="json"),
    )  # fmt: skip
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


def rows(out: Path) -> dict[tuple[str, str, str], dict[str, str]]:
    with (out / "bench.csv").open() as fh:
        return {(r["task"], r["configuration"], r["temperature"]): r for r in csv.DictReader(fh)}


def test_lab_table_with_draft_sweep_and_ngram(tmp_path: Path) -> None:
    stdout = run_bench("test.yaml", tmp_path, "--tasks", "code,prose", "--n-max", "2")
    table = rows(tmp_path)
    configs = {c for (_, c, _) in table}
    assert configs == {"plain", "draft-simple n-max 3", "draft-simple n-max 2", "ngram-mod"}
    assert len(table) == 4 * 2 * 2  # configurations × tasks × temperatures
    plain = table[("code", "plain", "0.0")]
    assert plain["speedup"] == "1.000" and float(plain["tokens_per_s"]) > 0
    # SmolLM2 drafting for itself: the draft always agrees with the target.
    draft = table[("code", "draft-simple n-max 3", "0.0")]
    assert float(draft["acceptance"]) > 0.9 and float(draft["mean_accepted_length"]) > 1
    assert all(r["same_text_as_plain"] != "n/a" for r in table.values())
    assert "(best n-max)" in (tmp_path / "bench.md").read_text()
    assert (tmp_path / "bench.png").read_bytes()[:4] == b"\x89PNG"
    assert "For a coding assistant (code):" in stdout and "For general chat (prose):" in stdout


def test_mtp_row_appears_when_an_mtp_backend_is_configured(tmp_path: Path) -> None:
    run_bench("mtp.yaml", tmp_path, "--tasks", "code", "--temperatures", "0")
    table = rows(tmp_path)
    mtp = table[("code", "draft-mtp n-max 3", "0.0")]
    assert float(mtp["acceptance"]) > 0.9
    noisy = table[("code", "draft-mtp n-max 3 [mtp-noisy]", "0.0")]
    assert float(noisy["acceptance"]) < 0.5
