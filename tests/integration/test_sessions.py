"""Agent sessions on the real proxy: locust's session users, and the benchmark's wait for idle."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import requests

from scripts.session_benchmark import wait_until_idle
from tests.helpers import ROOT
from tests.load_runs import LOCUST
from tests.subprocess_proxy import RunningProxy


def test_agent_session_users_replay_their_sessions_on_the_proxy(
    proxy: RunningProxy, tmp_path: Path
) -> None:
    results = tmp_path / "turns.jsonl"
    stats = tmp_path / "stats"
    command = [
        *LOCUST, "-u", "2", "-r", "2", "-t", "300s", "--host", proxy.url, "--only-summary",
        "--json-file", str(stats), "AgentSessionUser", "--model", "plain",
        "--session-shape", "mixed", "--session-turns", "3", "--sessions-per-user", "1",
        # The test backends hold 2,048 tokens: a short prompt, short answers.
        "--system-tokens", "150", "--session-max-tokens", "16", "--results-file", str(results),
    ]  # fmt: skip
    run = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=600)
    assert run.returncode == 0, run.stdout + run.stderr
    samples = [json.loads(line) for line in results.read_text().splitlines()]
    assert len(samples) == 6, samples
    by_session: dict[str, list[dict[str, Any]]] = {}
    for s in samples:
        assert s["outcome"] == "ok" and s["backend"] == "plain" and s["route"] == "pinned", s
        assert s["task"] == "agent-mixed" and 0 < s["tokens"] <= 16 and s["ttft_s"] > 0
        by_session.setdefault(s["session"], []).append(s)
    assert sorted(by_session) == ["mixed-s0-0", "mixed-s0-1"]
    for turns in by_session.values():
        assert [t["turn"] for t in turns] == [0, 1, 2]
        # Each later turn resends the conversation: the backend has most of it cached.
        assert all(t["cache_n"] > 0 for t in turns[1:]), turns
    rows = {(r["method"], r["name"]) for r in json.loads((tmp_path / "stats.json").read_text())}
    assert {("POST", "chat:agent-mixed"), ("METRIC", "cached:agent-mixed:plain")} <= rows
    assert "2 agent sessions" in run.stderr


def test_the_session_benchmark_waits_for_a_busy_proxy_to_go_idle(proxy: RunningProxy) -> None:
    # A long answer in flight stands for start-up calibration: the benchmark must not start.
    body: dict[str, Any] = {
        "model": "plain",
        "messages": [{"role": "user", "content": "Count to 500."}],
    }
    body |= {"max_tokens": 1500, "stream": True, "ignore_eos": True}
    url = f"{proxy.url}/v1/chat/completions"
    with requests.post(url, json=body, stream=True, timeout=120) as answer:
        # The first lines may precede the upstream's first token: wait for a few tokens.
        lines = answer.iter_lines()
        for _ in range(6):
            next(lines)
        assert not wait_until_idle(proxy.url, None, quiet_s=1, patience_s=2)
    assert wait_until_idle(proxy.url, None, quiet_s=1, patience_s=60)
