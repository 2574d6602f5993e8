"""Real agents' captured edit sessions replayed through specproxy on each agent's own surface.

Claude Code's Messages, Codex's Responses, opencode's and aider's chat: every request of one
rename per agent (tests/data/edit_turns/, grown by loadtests/edit_sessions.py) on the agents' config
(Qwen2.5-Coder-0.5B), answers cut short: what is tested is that the proxy and llama-server take
each agent's conversation in the agent's shapes, that a session's later turns find its earlier
ones in the prompt cache, and that the edit turn is classed as an edit (echo), on every surface.
Each turn keeps the tools its conversation calls and its system texts' first SYSTEM_CHARS
characters (loadtests/edit_turns.trimmed): 2-3 k prompt tokens, not 2-20 k, since a cold 20 k-token
prompt alone took 6 minutes here and what is asserted does not depend on the prompt's length.
The agents' whole first turns go through the proxy in tests/integration/test_agents.py.
"""

from __future__ import annotations

import itertools
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
# opencode's is.
AGENTS = ("aider", "claude-code", "codex", "opencode")
SYSTEM_CHARS = 1500
# The tokens of a turn's boundary llama-server may process again.
SLACK_TOKENS = 16


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
    sessions = edit_sessions(len(AGENTS), tasks=1, agents=AGENTS, system_chars=SYSTEM_CHARS)
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
            for earlier, later in itertools.pairwise(results):
                # The turn before is this one's prefix: all of it is cached, but for the few
                # tokens where the scripted answer parts from what the model answered.
                before = earlier.prompt_n + earlier.cache_n
                assert later.cache_n >= before - SLACK_TOKENS, (session.agent, earlier, later)
