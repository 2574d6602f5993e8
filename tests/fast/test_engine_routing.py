"""Routing per turn where strategies share an engine: the prompt is cached for all of them, so
each turn goes to the strategy fastest for its class at the engine's load (fast tier)."""

from __future__ import annotations

from proxy.backends.devices import Device
from proxy.exchange import Exchange, Route
from proxy.measurement import Measurement
from proxy.routing.classifier import TaskClassifier
from proxy.routing.policy import RoutePolicy
from proxy.routing.prefixes import Cached
from proxy.routing.ranking import RequestCost, RouteChoice
from proxy.routing.router import Router
from proxy.routing.scoreboard import Outcome, Scoreboard
from tests.policy_inputs import Backend, default_layout, measure


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


def prompt_sample(board: Scoreboard, backend: str, tokens_per_s: float) -> None:
    """A 3,000-token prompt the engine `coder` processed for `backend` at this speed."""
    board.record(
        Outcome(backend, "prose", 1, None, None, 0, 0, 0, 3000, 3e6 / tokens_per_s, engine="coder")
    )


def test_strategies_sharing_an_engine_share_its_measured_prompt_speed() -> None:
    # One process measured 73.0 tokens/s as plain and 80.3 as ngram (docs/configuration.md):
    # noise, which filed per strategy sent an explanation's long first turn to ngram although
    # plain decodes prose faster. Filed per engine, the prompt costs both the same.
    board = Scoreboard()
    for _ in range(3):
        measure(board, "plain", "prose", 10.0)
        measure(board, "ngram", "prose", 9.5, draft_n=40, accepted=10)
        measure(board, "draft", "prose", 6.0, draft_n=40, accepted=20)
    prompt_sample(board, "plain", 73.0)
    prompt_sample(board, "ngram", 80.3)
    rate = board.prompt_speed("coder")
    assert rate is not None and 73.0 < rate.tokens_per_s < 80.3
    assert board.prompt_speed("plain") is None and board.prompt_speed("ngram") is None
    plain, ngram, draft = default_layout()
    policy = RoutePolicy(board, explore_share=0.0)
    speeds = policy._prompt_speeds([plain, ngram, draft])
    assert speeds["plain"] == speeds["ngram"] == rate.tokens_per_s
    first_turn = RequestCost(prompt_tokens=3000)
    assert policy.choose("prose", [plain, ngram, draft], first_turn) == RouteChoice(
        "plain", "fastest", 1
    )


def test_the_router_files_a_prompt_sample_under_the_engine_that_processed_it() -> None:
    board = Scoreboard()
    router = Router(TaskClassifier(), RoutePolicy(board), board)
    plain, ngram, _ = default_layout()
    for strategy, ms in ((plain, 40_000.0), (ngram, 40_000.0)):
        exchange = Exchange("chat", "r", task="prose")
        # A routable stand-in where a Route holds a Strategy: record() reads its name and engine.
        exchange.route = Route(strategy, "fastest", 1, Cached(0, None))  # type: ignore[arg-type]
        timings = {"prompt_n": 3000, "prompt_ms": ms, "predicted_n": 64, "predicted_ms": 6400.0}
        exchange.measured = Measurement(status=200, timings=timings)
        router.record(exchange)
    rate = board.prompt_speed("coder")
    assert rate is not None and rate.samples == 2 and round(rate.tokens_per_s) == 75
    assert router.prompt_speed("coder") == rate.tokens_per_s


def test_a_strategy_that_drafted_nothing_is_not_taken_for_faster_than_plain_on_its_process() -> (
    None
):
    # The scoreboard of 2026-12-07's calibration: ngram read 8.21 t/s on prose against plain's
    # 7.41 with no draft made, two or three samples each; explanations went to ngram.
    board = Scoreboard()
    for _ in range(3):
        measure(board, "plain", "prose", 7.41)
        measure(board, "ngram", "prose", 8.21)
        measure(board, "draft", "prose", 5.67, draft_n=30, accepted=9)
    plain, ngram, draft = default_layout()
    policy = RoutePolicy(board, explore_share=0.0)
    choice = policy.choose("prose", [plain, ngram, draft], RequestCost(prompt_tokens=80))
    assert choice is not None and choice.backend == "plain"
    # Where its drafts were accepted, its measured speed stands: copying beats plain.
    for _ in range(3):
        measure(board, "ngram", "prose", 8.21, draft_n=40, accepted=20)
    choice = policy.choose("prose", [plain, ngram, draft], RequestCost(prompt_tokens=80))
    assert choice is not None and choice.backend == "ngram"
