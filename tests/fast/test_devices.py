"""Device admission: capacity, arrival order, cancellation and the defaults each device gets."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from proxy.api.state import ROUTER
from proxy.backend_config import BackendConfig
from proxy.backends.devices import Device, build_devices
from proxy.config import DeviceConfig, Settings
from proxy.testing.llama_double import Behaviour
from tests.inprocess import fast_proxy


def cpu(*shares: tuple[str, int], capacity: int = 2) -> Device:
    device = Device("cpu", capacity)
    for name, share in shares:
        device.add(name, share)
    return device


async def test_a_backend_already_decoding_is_joined_and_another_waits_for_room() -> None:
    device = cpu(("plain", 2), ("ngram", 2))
    assert device.try_admit("plain") and device.try_admit("plain")
    assert not device.admits("ngram")
    waiter = asyncio.create_task(device.admit("ngram"))
    await asyncio.sleep(0.01)
    assert not waiter.done() and device.waiting == 1
    device.release("plain")
    await asyncio.sleep(0.01)
    assert not waiter.done()  # one plain request still decodes
    device.release("plain")
    assert await asyncio.wait_for(waiter, 1) > 0
    assert device.state().running == {"ngram": 1} and device.in_use == 2


async def test_partitioned_threads_run_side_by_side_within_the_cores() -> None:
    device = cpu(("plain", 1), ("ngram", 1), ("draft", 1))
    assert device.try_admit("plain") and device.try_admit("ngram")
    assert not device.admits("draft") and device.in_use == 2


async def test_nobody_passes_a_request_that_waits() -> None:
    device = cpu(("plain", 2), ("ngram", 2))
    assert device.try_admit("plain")
    waiter = asyncio.create_task(device.admit("ngram"))
    await asyncio.sleep(0.01)
    # plain is decoding, but a request for it now would starve the waiting ngram request.
    assert not device.admits("plain")
    late = asyncio.create_task(device.admit("plain"))
    await asyncio.sleep(0.01)
    device.release("plain")
    await asyncio.wait_for(waiter, 1)
    assert not late.done()
    device.release("ngram")
    await asyncio.wait_for(late, 1)
    assert device.state().running == {"plain": 1}


async def test_a_cancelled_waiter_leaves_the_line_and_unblocks_the_next() -> None:
    big = cpu(("a", 2), ("b", 2), ("c", 1), capacity=3)
    assert big.try_admit("a")
    first = asyncio.create_task(big.admit("b"))  # needs 2, only 1 free: waits
    second = asyncio.create_task(big.admit("c"))  # would fit, but waits behind b
    await asyncio.sleep(0.01)
    assert not second.done()
    first.cancel()
    await asyncio.wait_for(second, 1)
    assert big.state().running == {"a": 1, "c": 1} and big.waiting == 0


async def test_arrivals_in_one_instant_never_exceed_the_capacity() -> None:
    device = cpu(("plain", 2), ("ngram", 2), ("draft", 2))
    peak = 0

    async def request(backend: str) -> None:
        nonlocal peak
        await device.admit(backend)
        peak = max(peak, device.in_use)
        await asyncio.sleep(0.001)
        device.release(backend)

    await asyncio.gather(*(request(b) for b in ["plain", "ngram", "draft"] * 30))
    assert peak == 2 and device.in_use == 0 and device.waiting == 0
    state = device.state()
    assert state.waits > 0 and state.busy_s > 0


def test_devices_derive_from_where_backends_run() -> None:
    settings = Settings(
        backends=[
            BackendConfig(name="a", model="m.gguf", threads=2),
            BackendConfig(name="b", model="m.gguf"),
            BackendConfig(name="g", model="m.gguf", gpu_layers="all"),
            BackendConfig(name="x", url="http://10.0.0.2:8080"),
        ],
        devices={"cpu": DeviceConfig(capacity=4)},
    )
    devices = build_devices(settings)
    assert set(devices) == {"cpu", "cuda:0", "url:http://10.0.0.2:8080"}
    assert devices["cpu"].capacity == 4
    assert (devices["cpu"].share("a"), devices["cpu"].share("b")) == (2, 4)
    assert (devices["cuda:0"].capacity, devices["cuda:0"].share("g")) == (1, 1)


def test_spill_over_says_what_replaced_it() -> None:
    with pytest.raises(ValueError, match="per-backend `device`"):
        # As a config file gives it: spill_over is no field any more, so no keyword of Settings.
        Settings.model_validate(
            {"backends": [BackendConfig(name="a", model="m.gguf")], "spill_over": True}
        )


def test_a_requests_mean_load_counts_who_decoded_beside_it_and_for_how_long(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    now = [0.0]
    monkeypatch.setattr("proxy.backends.devices.time.monotonic", lambda: now[0])
    device = cpu(("plain", 2))
    first = device.start_decoding()
    now[0] = 1.0
    second = device.start_decoding()
    now[0] = 3.0
    assert device.stop_decoding(second) == pytest.approx(2.0)
    now[0] = 4.0
    # Alone for 1 s, beside the second for 2 s, alone again for 1 s.
    assert device.stop_decoding(first) == pytest.approx(1.5)


async def test_a_request_joined_by_others_is_filed_under_the_load_it_ran_at(
    tmp_path: Path,
) -> None:
    async with fast_proxy(tmp_path, {"plain": {"parallel": 4}}) as proxy:
        proxy.doubles["plain"].behaviour = Behaviour(tokens=16, token_delay_s=0.05)
        client = proxy.openai()

        async def ask() -> None:
            await client.chat.completions.create(
                model="plain", messages=[{"role": "user", "content": "Say hello."}]
            )

        first = asyncio.create_task(ask())
        await asyncio.sleep(0.1)  # it starts alone, then three more join it
        await asyncio.gather(first, *(ask() for _ in range(3)))
        board = proxy.http.app[ROUTER].scoreboard
        levels = {level for (_, _, level), _ in board.items()}
        assert levels == {4}, board.items()
