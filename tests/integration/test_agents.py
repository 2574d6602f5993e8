"""The real coding agents of docs/agents.md, each given a one-line task through the proxy.

The agent tier (`-m agents`, part of `make test`): agents installed at pinned versions by
scripts/install-agents.sh, real llama-server backends (Qwen2.5-Coder-0.5B: its 32 k context holds
their 8-20 k-token prompts) and the embedded default's model aliases, so each agent sends the
model name it sends when nobody configured one. Each test asserts what its user sees: the agent
finished without a protocol error, every request it made was answered, and, where the model made
a tool call, it arrived in that agent's own format.
"""

from __future__ import annotations

import itertools
import json
import os
import signal
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from loadtests import agents
from tests.helpers import ROOT, get_json, patience, wait_until
from tests.subprocess_proxy import RunningProxy, running_proxy
from tests.warm_starts import (
    bare_llama_server,
    cached_share,
    describe,
    replayed,
    running,
    sessions,
    without_tools,
)

# Ceilings, stretched on a slow day (tests/helpers.patience).
pytestmark = [pytest.mark.agents, pytest.mark.timeout(patience(1500))]
AGENT_CONFIG = ROOT / "tests" / "configs" / "agents.yaml"
# One agent's whole run: its first turn processes 8-20 k prompt tokens on two cores.
RUN_TIMEOUT_S = patience(1200.0)


def agent_config() -> Path:
    """The agent config: it sets no model_aliases, so the agents' own names are served by the
    code's default ones, as for any user's config."""
    if not agents.installed():
        pytest.fail("agents are not installed: run scripts/install-agents.sh (make test does)")
    return AGENT_CONFIG


@pytest.fixture(scope="module")
def agent_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The proxy on the agent config, with the embedded default's aliases."""
    root = tmp_path_factory.mktemp("agents")
    log_path = root / "proxy.log"
    with running_proxy(agent_config(), log_path, SPECPROXY_CALIBRATION_REQUESTS="0") as running:
        yield running


def busy_slots(url: str) -> int:
    """Slots a llama-server is processing now."""
    slots = get_json(f"{url}/slots")[1]
    return sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))


def backend_urls(proxy: RunningProxy) -> list[str]:
    """The proxy's backends' own URLs."""
    backends = proxy.health()["backends"]
    assert isinstance(backends, dict)
    return [str(b["url"]) for b in backends.values()]


def requests_since(proxy: RunningProxy, offset: int) -> list[dict[str, object]]:
    """The proxy's request log lines written after `offset` bytes of its log."""
    with proxy.log_path.open() as log:
        log.seek(offset)
        lines = [json.loads(line) for line in log if line.startswith("{")]
    return [line for line in lines if line.get("event") == "request"]


def run_agent(
    name: str, proxy: RunningProxy, tmp_path: Path
) -> tuple[agents.AgentRun, list[dict[str, object]]]:
    """Run one agent on the task (narrowed where agents.NARROW says how) and return its run and
    the requests it made."""
    offset = proxy.log_path.stat().st_size
    run = agents.run_agent(name, proxy.url, tmp_path, RUN_TIMEOUT_S, narrow=True)
    seen = requests_since(proxy, offset)
    summary = [
        {k: r.get(k) for k in ("endpoint", "model", "status", "prompt_tokens", "ttft_s")}
        for r in seen
    ]
    print(f"\n{name}: {run.seconds:.0f} s, rc {run.returncode}, requests {summary}")
    return run, seen


def assert_answered(run: agents.AgentRun, seen: list[dict[str, object]], endpoint: str) -> None:
    """The agent used `endpoint`, and every request it sent was answered with a 200."""
    assert run.returncode != -9, f"{run.name} did not finish in {RUN_TIMEOUT_S:.0f} s\n{run.tail()}"
    assert any(r["endpoint"] == endpoint for r in seen), f"no {endpoint} request\n{run.tail()}"
    failed = [r for r in seen if r["status"] != 200]
    assert not failed, f"{run.name} got errors: {failed}\n{run.tail()}"


# What the agent tier's model, Qwen2.5-Coder-0.5B, answered to the task through each agent on
# 2026-12-08 (the failed answers, as the agents printed them). Four wrote a call of `greet`, the
# function it was asked to write, which no agent declares as a tool: no repair can make that a
# file. Through these agents the test ends xfailed, naming the answer: not a pass. aider (a
# fenced file, no tools) makes the file. docs/agents.md has the default's 1.5B beside bare
# llama-server.
SMALL_MODEL_MISSES = {
    "claude-code": 'a call of greet as text: ```json {"name": "greet", "arguments": {"name": '
    '"world"}} ```',
    "codex": 'a call of greet as text: ```json {"name": "greet", "arguments": {"name": '
    '"string"}} ```',
    "opencode": 'a call of greet as text: ```json {"name": "greet", "arguments": {"name": '
    '"name"}} ```',
    "continue": 'a call of greet as text: ```json {"name": "greet", "arguments": {}} ```',
    "qwen-code": "the file in a ```python block with prose, no tool call",
}


def assert_did_the_task(run: agents.AgentRun) -> None:
    """The one-line task is done on disk: hello.py's greet("Ada") returns "Hello, Ada!". The
    agent had to act on the model's answer, through its own tool or edit format."""
    missed = run.task_missed()
    if missed is not None and run.name in SMALL_MODEL_MISSES:
        pytest.xfail(
            f"{run.name}: Qwen2.5-Coder-0.5B cannot do the task through it (2026-12-08 it "
            f"answered {SMALL_MODEL_MISSES[run.name]}); now: {missed}"
        )
    assert missed is None, f"{run.name} did not do the task: {missed}\n{run.tail()}"


def test_an_agent_killed_mid_prompt_frees_the_device_within_seconds(
    agent_proxy: RunningProxy, tmp_path: Path
) -> None:
    """Claude Code's 19 k-token first turn, the agent killed while its prompt is processed."""
    process = agents.start(agents.claude_code(agent_proxy.url, tmp_path, RUN_TIMEOUT_S))
    try:
        # Its whole 20 k-token first turn, not narrowed: llama-server processes it for minutes.
        assert wait_until(lambda: agent_proxy.health()["devices"]["cpu"]["in_use"] > 0, 120)
        assert wait_until(lambda: any(busy_slots(url) for url in backend_urls(agent_proxy)), 60)
    finally:
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()  # reaps it and closes its pipes
    killed = time.monotonic()
    assert wait_until(lambda: agent_proxy.health()["devices"]["cpu"]["in_use"] == 0, 60)
    freed_s = time.monotonic() - killed
    busy = {url: busy_slots(url) for url in backend_urls(agent_proxy)}
    print(f"\ndevice free {freed_s:.1f} s after the agent was killed; busy slots {busy}")
    assert freed_s < 20 and not any(busy.values())


@pytest.fixture(scope="module")
def claude_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One work directory for the module's Claude Code sessions: the path is in its prompt."""
    return tmp_path_factory.mktemp("claude-code")


def test_claude_code(agent_proxy: RunningProxy, claude_dir: Path) -> None:
    run, seen = run_agent("claude-code", agent_proxy, claude_dir)
    assert_answered(run, seen, "messages")
    assert all(str(r["model"]).startswith("claude-") for r in seen), seen
    lines = run.json_lines()
    result = [line for line in lines if line.get("type") == "result"]
    assert result, run.tail()
    assert "API Error" not in str(result[-1].get("result", "")), run.tail()
    assert result[-1]["subtype"] in ("success", "error_max_turns"), run.tail()
    assert_did_the_task(run)


def test_claude_codes_next_session_with_another_task_finds_its_prompt_cached(
    agent_proxy: RunningProxy, claude_dir: Path, tmp_path: Path
) -> None:
    """Two more sessions in test_claude_code's directory, the first with its task (so it finds
    that run's 19 k-token prompt cached, seconds, not minutes of CI), the second with another:
    Claude Code's first system block is a billing line hashed from the task
    (proxy/api/billing_header.py), so the second finds everything before its task cached only
    through specproxy. The baseline is bare llama-server (the same binary, model and flags)
    sent the two first turns as Claude Code sent them, less their tools: the billing line comes
    before the tools, so where the two differ does not depend on them."""
    proxied = sessions("claude-code", running(agent_proxy.url), False, claude_dir, narrow=True)
    assert proxied[0] is not None and proxied[1] is not None, describe(proxied)
    bodies = [without_tools(turn) for turn in proxied]
    assert bodies[0]["system"] != bodies[1]["system"], "the billing lines did not differ"
    bare = replayed(bodies, proxied[0].path, bare_llama_server(tmp_path))
    print(
        f"\nclaude-code: specproxy {describe(proxied)}; bare llama-server, the same first turns "
        f"without their tools: {describe(bare)}"
    )
    assert cached_share(proxied[1]) >= 0.85
    assert cached_share(bare[1]) < 0.05


def test_codex(agent_proxy: RunningProxy, tmp_path: Path) -> None:
    run, seen = run_agent("codex", agent_proxy, tmp_path)
    assert_answered(run, seen, "responses")
    events = run.json_lines()
    kinds = [e.get("type") for e in events]
    assert "turn.completed" in kinds and "turn.failed" not in kinds, run.tail()
    assert_did_the_task(run)


def test_opencode(agent_proxy: RunningProxy, tmp_path: Path) -> None:
    run, seen = run_agent("opencode", agent_proxy, tmp_path)
    assert_answered(run, seen, "chat")
    assert run.returncode == 0, run.tail()
    events = run.json_lines()
    assert not [e for e in events if e.get("type") == "error"], run.tail()
    assert_did_the_task(run)


def test_aider(agent_proxy: RunningProxy, tmp_path: Path) -> None:
    run, seen = run_agent("aider", agent_proxy, tmp_path)
    assert_answered(run, seen, "chat")
    # aider exits 0 even when the API failed: what it printed says.
    assert "litellm." not in run.stdout and "APIError" not in run.stdout, run.tail()
    # Whole-file edits: aider writes the file from the fenced block the model answers with.
    assert_did_the_task(run)


def test_continue(agent_proxy: RunningProxy, tmp_path: Path) -> None:
    run, seen = run_agent("continue", agent_proxy, tmp_path)
    assert_answered(run, seen, "chat")
    assert run.returncode == 0, run.tail()
    assert '"status":"error"' not in run.stdout.replace(" ", ""), run.tail()
    assert_did_the_task(run)


@pytest.fixture
def recording_proxy(tmp_path: Path) -> Iterator[RunningProxy]:
    """The agent proxy with request bodies in its log, to tell an agent's turns from its side
    requests (a test's own proxy: bodies are never logged by default)."""
    with running_proxy(
        agent_config(),
        tmp_path / "proxy.log",
        SPECPROXY_CALIBRATION_REQUESTS="0",
        SPECPROXY_LOG_PROMPTS="true",
    ) as running:
        yield running


# A later message of the same Qwen Code session, continuing the last run (`--continue`), so a
# turn the 0.5B ends without a tool call still leads to another main turn. One follow-up, not
# two: each run processes a 9 k-token memory prompt, and a third run took CI past 20 minutes.
QWEN_FOLLOW_UP = "Now add a docstring to greet."


@pytest.mark.timeout(2 * RUN_TIMEOUT_S)
def test_qwen_code(recording_proxy: RunningProxy, tmp_path: Path) -> None:
    """Qwen Code's task, then a follow-up in the same session. It sends a memory-extraction
    request after every main turn: the next main turn still finds its previous prompt in
    llama-server's cache. (One test, not two: each first run is a cold 19 k-token prompt.)"""
    offset = recording_proxy.log_path.stat().st_size
    command = agents.qwen_code(recording_proxy.url, tmp_path, RUN_TIMEOUT_S)
    run = agents.run(agents.narrowed(command), RUN_TIMEOUT_S)
    seen = requests_since(recording_proxy, offset)
    print(f"\nqwen-code: {run.seconds:.0f} s, rc {run.returncode}, {len(seen)} requests")
    assert_answered(run, seen, "chat")
    assert run.returncode == 0, run.tail()
    assert "API Error" not in run.stdout + run.stderr, run.tail()

    follow_up = agents.qwen_code(recording_proxy.url, tmp_path, RUN_TIMEOUT_S, QWEN_FOLLOW_UP, True)
    followed = agents.run(agents.narrowed(follow_up), RUN_TIMEOUT_S)
    assert followed.returncode == 0, followed.tail()
    seen = requests_since(recording_proxy, offset)
    assert all(r["status"] == 200 for r in seen), seen

    def is_main(r: dict[str, object]) -> bool:
        """A main turn: the session's own system prompt (the memory request has its own)."""
        body = r.get("body")
        messages = body.get("messages") if isinstance(body, dict) else None
        first = messages[0] if isinstance(messages, list) and messages else {}
        return str(first.get("content", "")).startswith(agents.QWEN_SYSTEM_PROMPT)

    summary = [
        (is_main(r), r["prompt_tokens"], r["cached_tokens"], r["task"], r["route"]) for r in seen
    ]
    print(f"\nqwen-code requests (main, prompt, cached, class, route): {summary}")
    main = [r for r in seen if is_main(r)]
    side = [r for r in seen if not is_main(r)]
    assert len(main) >= 2 and side, summary
    for before, after in itertools.pairwise(main):
        previous, cached = before["prompt_tokens"], after["cached_tokens"]
        assert isinstance(previous, int) and isinstance(cached, int)
        assert cached >= 0.9 * previous, summary
    # Last: where the model cannot do the task, the test ends here, xfailed.
    assert_did_the_task(run)
