"""Load tests: the locust scenarios and the sweep, run for seconds against the real proxy."""

from __future__ import annotations

import csv
import json
import os
import subprocess
import sys
from pathlib import Path

from tests.helpers import ROOT
from tests.load_runs import LOCUST
from tests.subprocess_proxy import RunningProxy


def test_sweep_smoke_run_writes_csv_markdown_and_plot(proxy: RunningProxy, tmp_path: Path) -> None:
    out = tmp_path / "results"
    command = [
        sys.executable, "-m", "loadtests.sweep", "--url", proxy.url, "--out", str(out),
        "--levels", "1,2", "--backends", "plain,auto", "--tasks", "code", "--max-tokens", "8",
        "--requests-per-user", "2", "--seconds", "120", "--drain", "60",
        # Start-up calibration may still hold the backends; queueing behind it is fine here.
        "--idle-timeout", "0",
    ]  # fmt: skip
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    # Every cell, auto's too, meets a plain backend that has not served the level's prompts.
    assert run.stdout.count("restarted plain") == 4, run.stdout
    assert "NOT restarted" not in (out / "report.md").read_text()

    with (out / "results.csv").open() as f:
        rows = list(csv.DictReader(f))
    cells = [(r["task"], r["backend"], int(r["concurrency"])) for r in rows]
    assert cells == [
        ("code", "plain", 1),
        ("code", "auto", 1),
        ("code", "plain", 2),
        ("code", "auto", 2),
    ]
    for row in rows:
        assert row["failures"] == "0" and row["cut"] == "0", row
        assert int(row["requests"]) == 2 * int(row["concurrency"])
        assert float(row["aggregate_tps"]) > 0 and float(row["per_stream_tps"]) > 0
        answered = dict(pair.split(":") for pair in row["answered_by"].split())
        assert set(answered) <= {"plain", "draft", "ngram"}
        if row["backend"] == "plain":
            assert set(answered) == {"plain"}

    report = (out / "report.md").read_text()
    assert "## code" in report and "| plain |" in report and "- auto at 2: chose " in report
    assert (out / "tokens_per_s.png").read_bytes().startswith(b"\x89PNG\r\n\x1a\n")
    stats = json.loads((out / "cells" / "code-plain-c1_stats.json").read_text())
    counted = {(r["method"], r["name"]): r["num_requests"] for r in stats}
    assert counted[("POST", "chat:code")] == 2
    assert counted[("METRIC", "tps:code:plain")] == counted[("METRIC", "ttft:code:plain")] == 2


def test_locustfile_without_streaming_configured_by_environment(
    proxy: RunningProxy, tmp_path: Path
) -> None:
    results = tmp_path / "samples.jsonl"
    env = {
        **os.environ,
        "LOCUST_MODEL": "ngram",
        "LOCUST_TASK": "mixed",
        "LOCUST_MAX_TOKENS": "4",
        "LOCUST_STREAM": "false",
        "LOCUST_REQUESTS": "3",
        "LOCUST_RESULTS_FILE": str(results),
    }
    command = [*LOCUST, "-u", "1", "-r", "1", "-t", "300s", "--host", proxy.url]
    run = subprocess.run(
        [*command, "SingleStreamUser"],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert run.returncode == 0, run.stdout + run.stderr
    samples = [json.loads(line) for line in results.read_text().splitlines()]
    assert [s["task"] for s in samples] == ["code", "prose", "echo"]
    for s in samples:
        assert s["outcome"] == "ok" and s["backend"] == "ngram" and s["route"] == "pinned", s
        assert not s["stream"] and s["ttft_s"] is None
        assert 0 < s["tokens"] <= 4 and s["tokens_per_s"] > 0
