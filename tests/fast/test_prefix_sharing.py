"""Prefix sharing: who waits for a request computing the same prompt start, how long, in turn."""

from __future__ import annotations

import asyncio
import time

import pytest

from proxy.routing.prefix_sharing import WORTH_WAITING_TOKENS, PrefixSharing, Shared
from proxy.routing.prefixes import PromptPrefix

SYSTEM = "You are a coding agent. " * 200  # 4,800 characters, as many tokens at 1 char a token


def _turn(
    question: str,
    engine: str = "coder",
    cached: int = 0,
    speed: float | None = 1000.0,
    copies: bool = False,
) -> Shared:
    body = {
        "messages": [{"role": "system", "content": SYSTEM}, {"role": "user", "content": question}]
    }
    prefix = PromptPrefix.of(body)
    return Shared(engine, prefix, cached, prefix.chars, 1.0, speed, keeps_copies=copies)


async def _run(
    sharing: PrefixSharing, req: Shared, hold_s: float, log: list[str], name: str
) -> float:
    async with sharing.turn(req) as waited:
        log.append(f"{name} start")
        await asyncio.sleep(hold_s)
        log.append(f"{name} end")
    return waited


async def test_a_turn_sharing_the_system_prompt_waits_for_the_one_computing_it() -> None:
    sharing, log = PrefixSharing(), list[str]()
    first = asyncio.create_task(_run(sharing, _turn("Where is main?"), 0.3, log, "a"))
    await asyncio.sleep(0)
    waited = await _run(sharing, _turn("List the config modules."), 0.0, log, "b")
    assert log == ["a start", "a end", "b start", "b end"]
    assert waited >= 0.25
    assert await first == pytest.approx(0.0, abs=0.05)


async def test_on_upstream_llama_server_requests_released_together_go_one_at_a_time() -> None:
    # Upstream moves a cached prompt into the one slot that loads it: the second of two
    # released at once would compute it all again.
    sharing, log = PrefixSharing(), list[str]()
    holder = asyncio.create_task(_run(sharing, _turn("q0"), 0.1, log, "a"))
    await asyncio.sleep(0)
    waiters = [
        asyncio.create_task(_run(sharing, _turn(f"q{i}"), 0.1, log, n))
        for i, n in ((1, "b"), (2, "c"))
    ]
    await asyncio.gather(holder, *waiters)
    assert log == ["a start", "a end", "b start", "b end", "c start", "c end"]


async def test_the_wait_ends_when_recomputing_would_have_been_sooner() -> None:
    # 1 char a token: the shared ~4.8 k tokens take 0.5 s at 9,600 tokens/s, so a waiter gives
    # up about 0.5 s after the holder's own prompt (0.5 s) is done: about 1 s, not the 5 s the
    # holder takes to answer.
    sharing, log = PrefixSharing(), list[str]()
    slow = asyncio.create_task(_run(sharing, _turn("q0", speed=9600.0), 5.0, log, "a"))
    await asyncio.sleep(0)
    started = time.monotonic()
    waited = await _run(sharing, _turn("q1", speed=9600.0), 0.0, log, "b")
    assert 0.8 <= waited <= 1.5
    assert time.monotonic() - started < 2.0
    assert log[:3] == ["a start", "b start", "b end"]
    slow.cancel()


@pytest.mark.parametrize(
    "second",
    [
        pytest.param(_turn("q1", engine="draft"), id="another engine"),
        pytest.param(_turn("q1", speed=None), id="prompt speed not measured yet"),
        # Its own last turn, longer than the system prompt it shares, is cached: it keeps it.
        pytest.param(_turn("q1", cached=len(SYSTEM) + 400), id="own longer prompt cached"),
    ],
)
async def test_no_wait_where_waiting_gains_nothing(second: Shared) -> None:
    sharing, log = PrefixSharing(), list[str]()
    holder = asyncio.create_task(_run(sharing, _turn("q0"), 0.3, log, "a"))
    await asyncio.sleep(0)
    waited = await _run(sharing, second, 0.0, log, "b")
    assert waited < 0.05
    assert log[:3] == ["a start", "b start", "b end"]
    await holder


async def test_a_short_shared_start_is_not_worth_a_wait() -> None:
    sharing, log = PrefixSharing(), list[str]()
    short = "x" * (WORTH_WAITING_TOKENS // 2)

    def turn(q: str) -> Shared:
        prefix = PromptPrefix.of(
            {"messages": [{"role": "system", "content": short}, {"role": "user", "content": q}]}
        )
        return Shared("coder", prefix, 0, prefix.chars, 1.0, 1000.0)

    holder = asyncio.create_task(_run(sharing, turn("q0" * 400), 0.3, log, "a"))
    await asyncio.sleep(0)
    assert await _run(sharing, turn("q1" * 400), 0.0, log, "b") < 0.05
    await holder


async def test_switched_off_nobody_waits() -> None:
    sharing, log = PrefixSharing(enabled=False), list[str]()
    holder = asyncio.create_task(_run(sharing, _turn("q0"), 0.3, log, "a"))
    await asyncio.sleep(0)
    assert await _run(sharing, _turn("q1"), 0.0, log, "b") < 0.05
    await holder


async def test_a_cancelled_holder_releases_its_waiters() -> None:
    sharing, log = PrefixSharing(), list[str]()
    holder = asyncio.create_task(_run(sharing, _turn("q0"), 10.0, log, "a"))
    await asyncio.sleep(0)
    waiter = asyncio.create_task(_run(sharing, _turn("q1"), 0.0, log, "b"))
    await asyncio.sleep(0.1)
    holder.cancel()
    assert await asyncio.wait_for(waiter, 1.0) < 0.5
    assert log == ["a start", "b start", "b end"]


async def test_on_specproxys_build_requests_released_together_go_together() -> None:
    # specproxy's build loads cached prompts as copies: every waiter finds the shared start.
    sharing, log = PrefixSharing(), list[str]()
    holder = asyncio.create_task(_run(sharing, _turn("q0", copies=True), 0.1, log, "a"))
    await asyncio.sleep(0)
    waiters = [
        asyncio.create_task(_run(sharing, _turn(f"q{i}", copies=True), 0.1, log, n))
        for i, n in ((1, "b"), (2, "c"))
    ]
    await asyncio.gather(holder, *waiters)
    assert log[:2] == ["a start", "a end"]
    assert sorted(log[2:4]) == ["b start", "c start"]


async def test_on_specproxys_build_a_turn_that_found_the_start_cached_is_not_waited_for() -> None:
    # A session's later turn extends a prompt that was cached: specproxy's build keeps a copy
    # of it in the RAM cache while the turn runs, so a new session finds the shared start there.
    sharing, log = PrefixSharing(), list[str]()
    later_turn = _turn("q0 and its history", cached=len(SYSTEM) + 50, copies=True)
    holder = asyncio.create_task(_run(sharing, later_turn, 0.3, log, "a"))
    await asyncio.sleep(0)
    waited = await _run(sharing, _turn("q1", copies=True), 0.0, log, "b")
    assert waited < 0.05
    assert log[:3] == ["a start", "b start", "b end"]
    await holder
