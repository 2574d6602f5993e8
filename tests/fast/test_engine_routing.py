"""Routing per turn where strategies share an engine: the prompt is cached for all of them, so
each turn goes to the strategy fastest for its class at the engine's load (fast tier)."""

from __future__ import annotations

from proxy.backends.devices import Device
from proxy.routing.policy import RoutePolicy
from proxy.routing.ranking import RequestCost
from proxy.routing.scoreboard import Scoreboard
from tests.policy_inputs import Backend, measure


def engine(*names: str, in_flight: dict[str, int] | None = None) -> list[Backend]:
    """Strategies of one llama-server on the CPU, admitted as the engine."""
    device = Device("cpu", 2)
    device.add("coder", 2)
    backends = []
    for name in names:
        device.add_to_engine(name, "coder")
        b = Backend(name, spec_type=None if name == "plain" else "ngram-mod", device=device)
        b.in_flight = (in_flight or {}).get(name, 0)
        for _ in range(b.in_flight):
            assert device.try_admit(name)
        backends.append(b)
    return backends


def board() -> Scoreboard:
    """ngram wins edits alone and loses them at four streams; plain wins explanations."""
    sb = Scoreboard()
    for _ in range(4):
        measure(sb, "ngram", "echo", 20.0, accepted=40, draft_n=50)
        measure(sb, "plain", "echo", 10.0)
        measure(sb, "plain", "prose", 10.0)
        measure(sb, "ngram", "prose", 8.0, accepted=5, draft_n=50)
        measure(sb, "ngram", "echo", 4.0, level=4, accepted=10, draft_n=50)
        measure(sb, "plain", "echo", 6.0, level=4)
    return sb


def later_turn(cached: dict[str, int]) -> RequestCost:
    """An agent's later turn: 6,100 prompt tokens, of which `cached` held per backend."""
    return RequestCost(prompt_tokens=6100, cached=cached, agent="change")


def test_each_turn_of_a_session_goes_to_its_fastest_strategy_on_the_engine() -> None:
    policy = RoutePolicy(board(), explore_share=0.0)
    backends = engine("plain", "ngram")
    cost = later_turn({"plain": 6000, "ngram": 6000})
    edit = policy.choose("echo", backends, cost)
    explain = policy.choose("prose", backends, cost)
    assert edit is not None and edit.backend == "ngram"
    assert explain is not None and explain.backend == "plain"


def test_speculation_is_turned_down_where_the_engines_batch_makes_it_lose() -> None:
    policy = RoutePolicy(board(), explore_share=0.0)
    busy = engine("plain", "ngram", in_flight={"plain": 2, "ngram": 1})
    choice = policy.choose("echo", busy, later_turn({"plain": 6000, "ngram": 6000}))
    assert choice is not None and (choice.backend, choice.level) == ("plain", 4)


def test_separate_processes_keep_the_turn_where_its_prompt_is() -> None:
    # The contrast: with a process per strategy, the edit turn's prompt is only on plain, and
    # processing 6,000 tokens again costs more than ngram's faster decoding gains.
    policy = RoutePolicy(board(), explore_share=0.0)
    device = Device("cpu", 2)
    backends = [
        Backend("plain", device=device),
        Backend("ngram", spec_type="ngram-mod", device=device),
    ]
    choice = policy.choose("echo", backends, later_turn({"plain": 6000, "ngram": 0}))
    assert choice is not None and choice.backend == "plain"
