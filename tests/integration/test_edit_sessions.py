"""Real agents' captured edit sessions replayed through specproxy on each agent's own surface.

Claude Code's Messages, Codex's Responses, opencode's and aider's chat: every request of one
rename per agent (tests/data/edit_turns/, grown by loadtests/edit_sessions.py) on the agents' config
(Qwen2.5-Coder-0.5B, whose 32 k context holds their 2-20 k-token prompts), answers cut short:
what is tested is that the proxy and llama-server take each agent's conversation as the agent
sends it, that a session's later turns find its earlier ones in the prompt cache, and that the
edit turn is classed as an edit (echo), on every surface.
"""

from __future__ import annotations

from collections.abc import Iterator

import pytest
import requests

from loadtests.edit_replay import send_edit_turn
from loadtests.edit_sessions import edit_sessions
from loadtests.edit_turns import load_all
from tests.subprocess_proxy import RunningProxy, running_proxy
from tests.warm_starts import AGENT_CONFIG

pytestmark = pytest.mark.timeout(1800)
SHORT = {"open": 8, "edit": 16, "close": 8}
# Every surface and message shape, each once: Qwen Code's session is chat with tool calls as
# opencode's is, and its 20 k-token prompt alone took 6 of this test's 16 minutes here.
AGENTS = ("aider", "claude-code", "codex", "opencode")


@pytest.fixture(scope="module")
def edit_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """specproxy on the agents' config, its one backend not calibrated."""
    log = tmp_path_factory.mktemp("edit-sessions") / "proxy.log"
    with running_proxy(AGENT_CONFIG, log, SPECPROXY_CALIBRATION_REQUESTS="0") as proxy:
        yield proxy


def test_every_agents_captured_session_replays_on_its_surface(edit_proxy: RunningProxy) -> None:
    captured = {turn.agent: turn.surface for turn in load_all()}
    assert set(AGENTS) <= set(captured)
    assert {captured[a] for a in AGENTS} == set(captured.values())  # every surface
    sessions = edit_sessions(len(AGENTS), tasks=1, agents=AGENTS)
    assert sorted(s.agent for s in sessions) == sorted(AGENTS)
    with requests.Session() as http:
        for session in sessions:
            results = [
                send_edit_turn(http, edit_proxy.url, session, i, "plain", SHORT)
                for i in range(len(session.turns))
            ]
            for result in results:
                assert result.ok, (session.agent, result.turn, result.error)
                assert result.backend == "plain" and result.route == "pinned", session.agent
                assert 0 < result.predicted_n <= SHORT[result.kind], (session.agent, result)
            edit = next(r for r in results if r.kind == "edit")
            assert edit.task == "echo", (session.agent, edit.task)
            for later in results[1:]:
                # The turn before is this one's prefix: all but its new messages are cached.
                total = later.prompt_n + later.cache_n
                assert later.cache_n >= 0.8 * total, (session.agent, later)
