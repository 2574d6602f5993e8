"""Prompt-cache affinity and whole-request cost: prefix chains, what each backend holds, and the
policy's choice when one backend holds an agent's long prompt (fast tier, no llama-server)."""

from __future__ import annotations

import random
from pathlib import Path
from typing import Any

from proxy.backends.engine import Placement
from proxy.routing.policy import RoutePolicy
from proxy.routing.prefixes import PrefixCache, PromptPrefix, session_key
from proxy.routing.ranking import RequestCost
from proxy.routing.scoreboard import Outcome, Scoreboard
from proxy.testing.llama_double import Behaviour, start_double
from tests.inprocess import proxy_in_front
from tests.policy_inputs import Backend, chosen, estimate, measure, shared

TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]
SYSTEM = "You are a coding agent. " * 400


def turn(n: int, tools: list[object] | None = None) -> dict[str, Any]:
    """An agent's n-th turn: the same system prompt and tools, one more tool result each."""
    messages: list[dict[str, Any]] = [{"role": "system", "content": SYSTEM}]
    messages.append({"role": "user", "content": "rename foo to bar in app.py"})
    for i in range(n):
        call = {"id": f"c{i}", "type": "function", "function": {"name": "read_file"}}
        messages.append({"role": "assistant", "content": None, "tool_calls": [call]})
        messages.append({"role": "tool", "tool_call_id": f"c{i}", "content": f"line {i}\n" * 50})
    return {"messages": messages, "tools": tools or TOOLS}


def test_a_later_turn_shares_the_whole_earlier_prompt() -> None:
    first, second = PromptPrefix.of(turn(1)), PromptPrefix.of(turn(2))
    assert second.shared_chars(first) == first.chars
    assert first.shared_chars(second) == first.chars
    # Another session with the same system prompt and tools shares those, not the rest.
    other = turn(1)
    other["messages"][1] = {"role": "user", "content": "something else"}
    assert 0 < PromptPrefix.of(other).shared_chars(first) < first.chars
    # Other tools: nothing after the system prompt is shared.
    assert PromptPrefix.of(turn(1, tools=[{"x": 1}])).shared_chars(first) < len(SYSTEM) + 100


def test_markers_the_model_does_not_read_do_not_break_the_prefix() -> None:
    # Claude Code moves cache_control to the newest message on every turn.
    a: dict[str, object] = {
        "system": [{"type": "text", "text": SYSTEM, "cache_control": {"type": "ephemeral"}}]
    }
    b: dict[str, object] = {"system": [{"type": "text", "text": SYSTEM}]}
    a["messages"] = [{"role": "user", "content": [{"type": "text", "text": "hi"}]}]
    b["messages"] = [
        {"role": "user", "content": [{"type": "text", "text": "hi", "cache_control": {}}]}
    ]
    assert PromptPrefix.of(a).fingerprints == PromptPrefix.of(b).fingerprints


def test_the_cache_knows_where_a_prompt_is_held_and_forgets_old_ones() -> None:
    cache = PrefixCache()
    here = Placement("http://a")
    cache.record("plain", PromptPrefix.of(turn(1)), here, prompt_tokens=3000, slots=2)
    held = cache.cached("plain", PromptPrefix.of(turn(2)), {"http://a"})
    # Tokens from the measured characters per token of that backend's prompts.
    assert 2900 <= held.tokens <= 3000 and held.placement == here
    assert held.worth_following == here
    assert cache.cached("ngram", PromptPrefix.of(turn(2)), {"http://b"}).tokens == 0
    # A restarted backend (another port) holds nothing.
    assert cache.cached("plain", PromptPrefix.of(turn(2)), {"http://a2"}).tokens == 0
    # The newer turn replaces the one it extends; old prompts fall out past slots + RAM cache.
    cache.record("plain", PromptPrefix.of(turn(2)), here, prompt_tokens=3200, slots=2)
    assert len(cache.held_prompts("plain")) == 1
    for i in range(30):
        other = turn(1)
        other["messages"][1] = {"role": "user", "content": f"task {i}"}
        cache.record("plain", PromptPrefix.of(other), Placement("http://a"), 3000, 2)
    assert len(cache.held_prompts("plain")) == 2 + 16
    # The session's own turn fell out: what is left of turn 3 is the system prompt and tools
    # that the newer sessions share with it, as much as a session never seen gets.
    unseen = turn(1)
    unseen["messages"][1] = {"role": "user", "content": "never sent"}
    left = cache.cached("plain", PromptPrefix.of(turn(3)), {"http://a"}).tokens
    assert left == cache.cached("plain", PromptPrefix.of(unseen), {"http://a"}).tokens > 0


def test_client_session_keys() -> None:
    assert session_key({}, {"x-session-affinity": "s1"}) == "h:s1"
    assert session_key({"prompt_cache_key": "k"}, {}) == "k:k"
    assert session_key({"metadata": {"user_id": "u_session_x"}}, {}) == "u:u_session_x"
    assert session_key({"metadata": "odd"}, {}) is None


def board_with(prompt_tps: float = 90.0) -> Scoreboard:
    """On two CPU cores: ngram decodes code 10 % faster than plain; prompts at 90 t/s."""
    board = Scoreboard()
    for _ in range(3):
        measure(board, "plain", "code", 10.0)
        measure(board, "ngram", "code", 11.0)
    for name in ("plain", "ngram"):
        board.record(Outcome(name, "code", 1, 10.0, 1.0, 64, 0, 0, 900, 900 / prompt_tps * 1000))
    return board


def test_a_turn_stays_on_the_backend_holding_its_prompt() -> None:
    policy = RoutePolicy(board_with(), explore_share=0, rng=random.Random(1))
    backends = shared(Backend("plain"), Backend("ngram", "ngram-mod"))
    # New session: the decode speed decides.
    fresh = RequestCost(prompt_tokens=6000, max_tokens=64)
    choice = policy.choose("code", backends, fresh)
    assert choice is not None and choice.backend == "ngram"
    # The same session's next turn, its 6 k-token prompt held by plain: 10 % slower decode
    # costs under a second, the prompt again over a minute.
    held = RequestCost(prompt_tokens=6200, cached={"plain": 6000}, max_tokens=64)
    choice = policy.choose("code", backends, held)
    assert choice is not None and (choice.backend, choice.reason) == ("plain", "affinity")


def test_a_short_prompt_held_elsewhere_does_not_outweigh_a_much_faster_decode() -> None:
    # An edit: 400-token answers, ngram 2.5x plain; 280 cached tokens save 3 s, decode 24 s.
    board = board_with()
    for _ in range(3):
        board.record(Outcome("plain", "echo", 1, 10.0, 1.0, 400, 0, 0))
        board.record(Outcome("ngram", "echo", 1, 25.0, 1.0, 400, 300, 250))
    policy = RoutePolicy(board, explore_share=0)
    backends = shared(Backend("plain"), Backend("ngram", "ngram-mod"))
    short = RequestCost(prompt_tokens=300, cached={"plain": 280})
    choice = policy.choose("echo", backends, short)
    assert choice is not None and (choice.backend, choice.reason) == ("ngram", "fastest")
    # With a 6 k-token prompt held by plain, the prompt outweighs it: a minute against 24 s.
    long = RequestCost(prompt_tokens=6200, cached={"plain": 6000})
    choice = policy.choose("echo", backends, long)
    assert choice is not None and (choice.backend, choice.reason) == ("plain", "affinity")


def test_a_long_uncached_prompt_is_not_sent_to_measure_a_backend() -> None:
    board = board_with()
    backends = shared(Backend("plain"), Backend("ngram", "ngram-mod"), Backend("draft", "draft"))
    policy = RoutePolicy(board, explore_share=1.0, rng=random.Random(3))
    held = RequestCost(prompt_tokens=6200, cached={"plain": 6000}, max_tokens=64)
    # draft is unmeasured and every request may explore: neither on a 6 k-token move.
    reasons = {chosen(policy, "code", backends, held).reason for _ in range(50)}
    assert reasons == {"affinity"}
    # A short request measures draft.
    choice = policy.choose("code", backends, RequestCost(prompt_tokens=200))
    assert choice is not None and (choice.backend, choice.reason) == ("draft", "unmeasured")


def test_answer_length_is_measured_per_backend_and_prompt_speed_per_engine() -> None:
    board = Scoreboard()
    board.record(Outcome("plain", "echo", 1, 10.0, 1.0, 400, 0, 0, 1000, 10_000, engine="coder"))
    board.record(Outcome("plain", "echo", 1, None, 1.0, 3, 0, 0, 10, 500))  # short answer
    rate = board.prompt_speed("coder")
    assert rate is not None and round(rate.tokens_per_s) == 100
    answer = board.answer_tokens("plain", "echo")
    assert answer is not None and 3 < answer < 400  # short answers count toward the length
    assert board.answer_tokens("ngram", "echo") is None
    assert board.prompt_speed("plain") is None and board.prompt_speed("draft") is None


def test_a_busy_machines_samples_stand_in_only_until_a_quiet_one() -> None:
    board = Scoreboard()
    for _ in range(3):
        board.record(Outcome("plain", "code", 1, 4.0, 1.0, 64, 0, 0, contended=True))
    est = estimate(board, "plain", "code", 1)
    assert est.contended and round(est.tokens_per_s) == 4
    board.record(Outcome("plain", "code", 1, 12.0, 1.0, 64, 0, 0))
    est = estimate(board, "plain", "code", 1)
    assert not est.contended and round(est.tokens_per_s) == 12
    # More busy samples do not move the quiet estimate.
    for _ in range(5):
        board.record(Outcome("plain", "code", 1, 3.0, 1.0, 64, 0, 0, contended=True))
    assert round(estimate(board, "plain", "code", 1).tokens_per_s) == 12


def test_a_backend_known_only_from_a_busy_machine_is_rechecked_once_quiet() -> None:
    # The start-up: plain measured while a build ran looks slower than the draft.
    board = Scoreboard()
    for _ in range(3):
        board.record(Outcome("plain", "code", 1, 5.0, 1.0, 64, 0, 0, contended=True))
        measure(board, "draft", "code", 7.0)
    policy = RoutePolicy(board, explore_share=0)
    backends = shared(Backend("plain"), Backend("draft", "draft-simple"))
    # Still busy: no recheck, the evidence there is is used.
    busy = policy.choose("code", backends, RequestCost(quiet=False))
    assert busy is not None and busy.backend == "draft"
    quiet = policy.choose("code", backends, RequestCost(quiet=True))
    assert quiet is not None and (quiet.backend, quiet.reason) == ("plain", "recheck")
    # Until the recheck's sample lands, no second recheck of it for a few decisions.
    assert chosen(policy, "code", backends).reason != "recheck"
    board.record(Outcome("plain", "code", 1, 12.0, 1.0, 64, 0, 0))
    choice = policy.choose("code", backends)
    assert choice is not None and choice.backend == "plain"


def test_intervals_narrow_with_repeated_measurements() -> None:
    board = Scoreboard()
    measure(board, "plain", "code", 10.0)
    one = estimate(board, "plain", "code", 1)
    assert one.interval(board.alpha) == (5.0, 20.0)
    for tps in (9.5, 10.5, 10.0, 9.8, 10.2):
        measure(board, "plain", "code", tps)
    lo, hi = estimate(board, "plain", "code", 1).interval(board.alpha)
    assert 9.0 < lo < 10.0 < hi < 11.0


def test_an_agent_sessions_first_turn_is_placed_for_the_whole_session() -> None:
    # Tool calls decode alike on both; edits 2x on ngram. The first turn is a tool call, but
    # the session stays where it starts, and its edits are most of what it will decode.
    board = board_with()
    for _ in range(8):
        measure(board, "ngram", "code", 9.0)  # a shade slower at tool calls
    for _ in range(3):
        board.record(Outcome("plain", "echo", 1, 10.0, 1.0, 400, 0, 0))
        board.record(Outcome("ngram", "echo", 1, 20.0, 1.0, 400, 300, 250))
    policy = RoutePolicy(board, explore_share=0, speculation_margin=0)
    backends = shared(Backend("plain"), Backend("ngram", "ngram-mod"))
    lone = policy.choose("code", backends, RequestCost(prompt_tokens=6000))
    assert lone is not None and lone.backend == "plain"
    change = RequestCost(prompt_tokens=6000, agent="change")
    first = policy.choose("code", backends, change)
    assert first is not None and first.backend == "ngram"
    # A session that asks a question, or one of tool calls, has no edits to win.
    for intent in ("question", "other"):
        asked = policy.choose("code", backends, RequestCost(prompt_tokens=6000, agent=intent))
        assert asked is not None and asked.backend == "plain", intent
    # Measured agent answers set the mix: change sessions of tool calls only stay where those win.
    for _ in range(20):
        board.record(Outcome("plain", "code", 1, 10.0, 1.0, 40, 0, 0, agent="change"))
    assert board.agent_mix("change") == {"code": 1.0}
    calls = policy.choose("code", backends, change)
    assert calls is not None and calls.backend == "plain"


def test_an_agent_sessions_first_turn_is_never_a_probe() -> None:
    # Twins measured alike, so each is unsure of the other and explore_share 1 probes every time.
    board = board_with()
    for name in ("plain", "ngram"):
        for tps in (9.0, 11.0):
            measure(board, name, "code", tps)
    policy = RoutePolicy(board, explore_share=1.0, speculation_margin=0)
    backends = shared(Backend("plain"), Backend("ngram", "ngram-mod"))
    lone = policy.choose("code", backends, RequestCost(prompt_tokens=6000))
    assert lone is not None and lone.reason == "explore"
    # Its session would stay on the probed backend: the first turn goes where it is best.
    for intent in ("change", "question", "other"):
        first = policy.choose("code", backends, RequestCost(prompt_tokens=6000, agent=intent))
        assert first is not None and first.reason != "explore", (intent, first)


async def test_no_slot_is_named_to_llama_server_not_even_a_clients(tmp_path: Path) -> None:
    # llama-server finds a prompt in its slots and RAM cache only for a request naming no slot.
    double = await start_double(Behaviour())
    try:
        async with proxy_in_front(tmp_path, [{"name": "plain", "url": double.url}]) as proxy:
            for extra in ({}, {"id_slot": 1, "cache_prompt": False}):
                body = {"model": "plain", "messages": turn(2)["messages"], **extra}
                resp = await proxy.http.post("/v1/chat/completions", json=body)
                assert resp.status == 200, await resp.text()
    finally:
        await double.stop()
    sent = double.received
    assert len(sent) == 2 and not any("id_slot" in b for b in sent), sent
    # The client's other cache settings reach llama-server as it sent them.
    assert "cache_prompt" not in sent[0] and sent[1]["cache_prompt"] is False
