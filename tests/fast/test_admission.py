"""Admission: seats, KV room in a shared cache, the queue bound and the device, for any backend."""

from __future__ import annotations

import asyncio

import pytest

from proxy.backends.admission import AdmissionQueue, Seats
from proxy.backends.devices import Device
from proxy.backends.engine import BackendSaturatedError, Placement


def _server(url: str = "http://a", limit: int = 4, n_ctx: int | None = 1000) -> Seats:
    device = Device(f"dev-{url}", 4)
    device.add("b", 4)
    seats = Seats(url, device, limit, kv_shared=True)
    seats.n_ctx = n_ctx
    return seats


async def test_a_request_waits_for_room_in_a_shared_cache_and_goes_when_it_frees() -> None:
    server = _server()
    admission = AdmissionQueue("b", max_queue=8, servers=lambda: [server])
    order: list[str] = []
    first_in = asyncio.Event()
    release_first = asyncio.Event()

    async def first() -> None:
        async with admission.hold("full", tokens=800):
            order.append("first in")
            first_in.set()
            await release_first.wait()
        order.append("first out")

    async def second() -> None:
        await first_in.wait()
        async with admission.hold("full", tokens=500):
            order.append("second in")

    tasks = [asyncio.create_task(first()), asyncio.create_task(second())]
    await first_in.wait()
    await asyncio.sleep(0.05)
    # 800 + 500 held would not fit 1,000 tokens: the second waits, queued.
    assert order == ["first in"] and admission.queued == 1 and server.held_tokens == 800
    release_first.set()
    await asyncio.wait_for(asyncio.gather(*tasks), 1.0)
    assert order == ["first in", "first out", "second in"]
    assert server.held_tokens == 0 and server.seated == 0 and server.in_flight == 0


async def test_a_prompt_as_long_as_the_context_goes_on_an_empty_server() -> None:
    server = _server(n_ctx=1000)
    admission = AdmissionQueue("b", max_queue=8, servers=lambda: [server])
    async with admission.hold("full", tokens=5000) as (seats, use):
        assert seats is server and use.base_url == "http://a"


async def test_a_full_queue_refuses_with_the_backends_message() -> None:
    server = _server(limit=1)
    admission = AdmissionQueue("b", max_queue=1, servers=lambda: [server])
    held = asyncio.Event()
    done = asyncio.Event()

    async def occupy() -> None:
        async with admission.hold("full"):
            held.set()
            await done.wait()

    occupant = asyncio.create_task(occupy())
    await held.wait()
    waiter = asyncio.create_task(admission.hold("full").__aenter__())
    await asyncio.sleep(0.01)
    assert admission.queue_full
    with pytest.raises(BackendSaturatedError, match="backend b is full"):
        async with admission.hold("backend b is full"):
            pass
    done.set()
    await occupant
    await waiter


async def test_the_preferred_server_is_taken_when_it_has_a_seat() -> None:
    a, b = _server("http://a"), _server("http://b")
    admission = AdmissionQueue("b", max_queue=8, servers=lambda: [a, b])
    async with admission.hold("full", prefer=Placement("http://b")) as (seats, _):
        assert seats is b
    a.in_flight = 0
    async with admission.hold("full") as (seats, _):
        # Least loaded, then least recently used: b was just used.
        assert seats is a


async def test_a_cancelled_waiter_leaves_the_queue_and_holds_nothing() -> None:
    server = _server(limit=1)
    admission = AdmissionQueue("b", max_queue=8, servers=lambda: [server])
    async with admission.hold("full"):
        waiter = asyncio.create_task(admission.hold("full").__aenter__())
        await asyncio.sleep(0.01)
        assert admission.queued == 1
        waiter.cancel()
        with pytest.raises(asyncio.CancelledError):
            await waiter
        assert admission.queued == 0 and server.seated == 1
    assert server.seated == 0


async def test_release_device_decides_when_the_device_is_given_back() -> None:
    server = _server()
    released: list[bool] = []

    def release(seats: Seats, abandoned: bool) -> None:
        released.append(abandoned)
        seats.device.release("b")

    admission = AdmissionQueue("b", max_queue=8, servers=lambda: [server], release_device=release)
    async with admission.hold("full", settled=lambda: True):
        pass
    async with admission.hold("full", settled=lambda: False):
        pass
    assert released == [False, True]
