"""Every route reason is given when its rule decided, provoked on the default layout (plain
and ngram one engine, draft its own process, one CPU); docs/routing.md lists them as the code
does (fast tier)."""

from __future__ import annotations

import asyncio
import random
from collections.abc import Callable, Coroutine
from pathlib import Path
from typing import Any, get_args

import pytest
from structlog.testing import capture_logs

from proxy.backends.devices import Device
from proxy.exchange import Exchange
from proxy.reasons_reference import markdown, updated
from proxy.routing.classifier import TaskClassifier
from proxy.routing.policy import RoutePolicy
from proxy.routing.ranking import RequestCost, RouteChoice
from proxy.routing.reasons import REASONS, RouteReason
from proxy.routing.router import Router
from proxy.routing.scoreboard import Outcome, Scoreboard
from proxy.tasks import AUTO_MODEL
from tests.helpers import ROOT
from tests.inprocess import SHORT_CALIBRATION, fast_proxy
from tests.policy_inputs import Backend, decoding, default_layout, measure, on_device

DOC = ROOT / "docs" / "routing.md"


def board_of(**code: float) -> Scoreboard:
    """Each named backend measured once on code at these tokens/s, a speculative one with
    three in four of its drafted tokens accepted (on plain's process a strategy is never
    rated faster than its accepted drafts allow)."""
    board = Scoreboard()
    for name, tps in code.items():
        drafts = {} if name == "plain" else {"draft_n": 60, "accepted": 48}
        measure(board, name, "code", tps, **drafts)
    return board


def choose(board: Scoreboard, *backends: Backend, cost: RequestCost | None = None) -> RouteChoice:
    choice = RoutePolicy(board, explore_share=0).choose("code", backends, cost)
    assert choice is not None
    return choice


def engine_is(plain: Backend, ngram: Backend, **state: bool) -> None:
    """Set the shared engine's state, which both its strategies read."""
    for b in (plain, ngram):
        for field, value in state.items():
            setattr(b, field, value)


def fastest() -> None:
    plain, ngram, draft = default_layout()
    board = board_of(plain=30, ngram=20, draft=10)
    assert choose(board, plain, ngram, draft) == RouteChoice("plain", "fastest", 1)


def within_margin() -> None:
    # ngram decodes 4 % faster than plain: faster, but not by the speculation margin (5 %).
    plain, ngram, draft = default_layout()
    board = board_of(plain=10.0, ngram=10.4, draft=5)
    assert choose(board, plain, ngram, draft) == RouteChoice("plain", "within_margin", 1)
    # By 20 % it is simply the fastest, not a pick "within the margin" of anything.
    board = board_of(plain=10.0, ngram=12, draft=5)
    assert choose(board, plain, ngram, draft) == RouteChoice("ngram", "fastest", 1)


def demoted() -> None:
    plain, ngram, draft = default_layout()
    board = board_of(plain=30, draft=10)
    for _ in range(5):
        measure(board, "ngram", "code", 60, draft_n=60, accepted=48)
    for _ in range(3):  # acceptance collapses; the decayed speed still reads faster than plain
        measure(board, "ngram", "code", 25, draft_n=60, accepted=3)
    assert choose(board, plain, ngram, draft) == RouteChoice("plain", "demoted", 1)


def affinity() -> None:
    # The engine holds a session's 6 k-token prompt; the draft (say) decodes code faster, but
    # would process the whole prompt first.
    plain, ngram, draft = default_layout()
    board = board_of(plain=20, ngram=19, draft=40)
    turn = RequestCost(prompt_tokens=6200, cached={"plain": 6000, "ngram": 6000})
    assert choose(board, plain, ngram, draft, cost=turn) == RouteChoice("plain", "affinity", 1)
    # Between the engine's own strategies the prompt decides nothing: both hold it.
    board = board_of(plain=20, ngram=30, draft=10)
    assert choose(board, plain, ngram, draft, cost=turn) == RouteChoice("ngram", "fastest", 1)


def unmeasured() -> None:
    plain, ngram, draft = default_layout()
    board = board_of(plain=30, draft=10)
    cost = RequestCost(prompt_tokens=100)
    assert choose(board, plain, ngram, draft, cost=cost) == RouteChoice("ngram", "unmeasured", 1)


def only_measured() -> None:
    # A session's prompt is on the draft; plain and ngram never measured for code would each
    # have to process 6 k tokens to be measured.
    plain, ngram, draft = default_layout()
    board = board_of(draft=10)
    turn = RequestCost(prompt_tokens=6200, cached={"draft": 6000})
    assert choose(board, plain, ngram, draft, cost=turn) == RouteChoice("draft", "only_measured", 1)


def only_healthy() -> None:
    board = board_of(plain=30, ngram=28, draft=10)
    plain, ngram, draft = default_layout()
    engine_is(plain, ngram, ready=False)
    assert choose(board, plain, ngram, draft) == RouteChoice("draft", "only_healthy", 1)
    plain, ngram, draft = default_layout()
    engine_is(plain, ngram, queue_full=True)
    assert choose(board, plain, ngram, draft) == RouteChoice("draft", "only_healthy", 1)


def recheck() -> None:
    # The draft was measured only while a build used the cores; the machine is quiet now.
    plain, ngram, draft = default_layout()
    board = board_of(plain=30, ngram=28)
    board.record(Outcome("draft", "code", 1, 10, 0.1, 64, 60, 30, contended=True))
    assert choose(board, plain, ngram, draft) == RouteChoice("draft", "recheck", 1)


def join_batch() -> None:
    # plain decodes on the engine; the draft, best, would wait for the device; ngram, of the
    # engine decoding, starts at once. It joins the batch there, whatever its own load.
    plain, ngram, draft = default_layout()
    decoding(plain, 1)
    board = board_of(plain=20, ngram=28, draft=30)
    assert choose(board, plain, ngram, draft) == RouteChoice("ngram", "join_batch", 2)


def spill() -> None:
    # Never on the default layout: a full engine's request queues there (its own other
    # strategy waits for the same slots, and the draft for the device).
    plain, ngram, draft = default_layout()
    decoding(plain, 4)
    engine_is(plain, ngram, saturated=True)
    board = board_of(plain=30, ngram=28, draft=20)
    assert choose(board, plain, ngram, draft).reason == "fastest"
    # With the draft on a device of its own (another GPU, another machine), it spills there.
    cpu, gpu = Device("cpu", 2), Device("gpu", 1)
    plain, ngram, draft = default_layout(cpu)
    on_device(gpu, [draft], share=1)
    decoding(plain, 4)
    engine_is(plain, ngram, saturated=True)
    assert choose(board, plain, ngram, draft) == RouteChoice("draft", "spill", 1)


def wait_device() -> None:
    # A probe of the draft decodes; ngram is best, and the draft is far slower: wait for it.
    plain, ngram, draft = default_layout()
    decoding(draft, 1)
    board = board_of(plain=30, ngram=40, draft=10)
    assert choose(board, plain, ngram, draft) == RouteChoice("ngram", "wait_device", 2)


async def join_queue() -> None:
    # plain decodes, and a request for the draft waits for the device: it runs next. The draft
    # about as fast as plain, a request that must wait anyway goes there.
    plain, ngram, draft = default_layout()
    decoding(plain, 1)
    waiter = asyncio.create_task(plain.device.admit("draft"))
    await asyncio.sleep(0)
    board = board_of(plain=30, ngram=20, draft=28)
    try:
        assert choose(board, plain, ngram, draft) == RouteChoice("draft", "join_queue", 2)
    finally:
        waiter.cancel()


async def test_the_engine_running_next_is_waited_for_as_the_best_not_joined_by_a_mate() -> None:
    # The draft decodes and a request for plain waits: the engine runs next. The best, plain,
    # is of that engine, so waiting for it costs no second drain; ngram is no better a queue.
    plain, ngram, draft = default_layout()
    decoding(draft, 1)
    waiter = asyncio.create_task(plain.device.admit("plain"))
    await asyncio.sleep(0)
    board = board_of(plain=30, ngram=28, draft=10)
    try:
        assert choose(board, plain, ngram, draft) == RouteChoice("plain", "wait_device", 2)
    finally:
        waiter.cancel()


def test_a_full_engine_is_queued_at_not_joined_through_its_other_strategy() -> None:
    # The engine's slots are full of plain's requests and ngram is best: sending the request
    # to plain instead would wait for the same slots and decode it slower.
    plain, ngram, draft = default_layout()
    decoding(plain, 4)
    engine_is(plain, ngram, saturated=True)
    board = board_of(plain=36, ngram=40, draft=10)
    assert choose(board, plain, ngram, draft) == RouteChoice("ngram", "fastest", 8)


def explore() -> None:
    plain, ngram, draft = default_layout()
    board = board_of(plain=30, ngram=28, draft=10)
    policy = RoutePolicy(board, explore_share=1.0, rng=random.Random(3))
    choice = policy.choose("code", [plain, ngram, draft])
    assert choice is not None and choice.reason == "explore" and choice.backend != "plain"


def router_of(board: Scoreboard) -> Router:
    return Router(TaskClassifier(), RoutePolicy(board, explore_share=0), board)


def pinned() -> None:
    plain, ngram, draft = default_layout()
    # default_layout()'s stand-ins are routable backends, not Strategy objects: the router
    # reads only what RoutableBackend has, which the ignores below are for.
    exchange = Exchange("chat", "r1", model="draft", pinned=draft, task="code")  # type: ignore[arg-type]
    route = router_of(board_of(plain=30)).route(exchange, [plain, ngram, draft], 100, None, True)  # type: ignore[list-item]
    assert (route.backend.name, route.reason) == ("draft", "pinned")


def least_busy() -> None:
    # A passthrough (tokenize) under `auto`: any backend, the one starting at once first.
    plain, ngram, draft = default_layout()
    decoding(plain, 1)
    # A stand-in list where the router takes Strategy objects (see pinned()).
    exchange = Exchange("tokenize", "r1", generates=False, model=AUTO_MODEL)
    route = router_of(board_of()).route(exchange, [draft, plain, ngram], 0, None, True)  # type: ignore[list-item]
    assert (route.backend.name, route.reason) == ("ngram", "least_busy")


async def test_calibration_requests_carry_their_reason_in_the_log(tmp_path: Path) -> None:
    # The proxy's own requests, seen only in the log; the in-process proxy in front of stub
    # servers (the reason does not depend on the layout).
    with capture_logs() as logs:
        async with fast_proxy(
            tmp_path,
            **SHORT_CALIBRATION,
        ) as proxy:
            await proxy.wait_calibrated(60)
    routes = {e.get("route") for e in logs if e["event"] == "request"}
    assert routes == {"calibration"}


PROVOKED: dict[str, Callable[[], Coroutine[Any, Any, None] | None]] = {
    "pinned": pinned,
    "least_busy": least_busy,
    "only_healthy": only_healthy,
    "unmeasured": unmeasured,
    "only_measured": only_measured,
    "recheck": recheck,
    "join_batch": join_batch,
    "join_queue": join_queue,
    "wait_device": wait_device,
    "explore": explore,
    "demoted": demoted,
    "affinity": affinity,
    "within_margin": within_margin,
    "fastest": fastest,
}


@pytest.mark.parametrize("reason", list(PROVOKED))
async def test_each_reason_is_given_on_the_default_layout_when_its_rule_decides(
    reason: str,
) -> None:
    done = PROVOKED[reason]()
    if done is not None:
        await done


def test_spill_is_never_given_on_the_default_layout_and_is_elsewhere() -> None:
    spill()


def test_every_reason_is_provoked_or_documented_as_impossible_on_the_default() -> None:
    reasons = set(get_args(RouteReason))
    assert set(REASONS) == reasons
    impossible = {r for r, doc in REASONS.items() if doc.not_on_default}
    assert impossible == {"spill"}
    assert set(PROVOKED) | {"calibration"} == reasons - impossible


def test_the_documented_reasons_are_the_generated_ones() -> None:
    text = DOC.read_text()
    assert text == updated(text), "docs/routing.md is stale: run scripts/references.py"
    for reason in get_args(RouteReason):
        assert f"| `{reason}` |" in markdown()
