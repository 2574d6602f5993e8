"""A real agent's first session after a restart finds everything before its task cached through
specproxy: Codex, its prompt kept on disk (proxy/backends/prompt_keeper.py). A restarted bare
llama-server has no prompts at all (no disk tier): tests/integration/test_warm_sessions.py shows
that one on the small model. Claude Code's second session with another task (its per-task billing
line) is in tests/integration/test_agents.py, after the Claude Code run whose prompt it finds.

The agent tier (`-m agents`): agents installed by scripts/install-agents.sh, Qwen2.5-Coder-0.5B
(its 32 k context holds their first turns). Each session is stopped once its first turn has
been answered (loadtests/first_turns.py); the cache figures are the ones llama-server put in its
answer, read by the relay in front of the server.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from loadtests import agents
from tests.subprocess_proxy import running_proxy
from tests.warm_starts import AGENT_CONFIG, Server, cached_share, describe, sessions

pytestmark = [pytest.mark.agents, pytest.mark.timeout(3600)]


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


def test_codexs_first_session_after_a_restart_finds_its_prompt_cached(tmp_path: Path) -> None:
    if not agents.installed():
        pytest.fail("agents are not installed: run scripts/install-agents.sh (make test does)")
    proxied = sessions("codex", through_specproxy(tmp_path), True, tmp_path / "codex", narrow=True)
    print(f"\ncodex: specproxy, the second session after a restart: {describe(proxied)}")
    assert cached_share(proxied[1]) >= 0.90
