"""External backends with replicas, against llama-server doubles (fast tier): balancing, a failing
replica taken out, host names resolved again, and load levels from what each server reports."""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import pytest

from proxy.api.state import POOL, ROUTER
from proxy.backend_config import BackendConfig
from proxy.backends.discovery import SystemResolver, discover, names_a_host, with_address
from proxy.routing.scoreboard import Outcome
from proxy.testing.llama_double import Behaviour, start_double
from tests.helpers import accepting_nothing, eventually, free_port
from tests.inprocess import FastProxy, proxy_in_front
from tests.messages import openai_messages

HELLO = openai_messages("Say hello.")
FAST: dict[str, Any] = {"health_interval_s": 0.1, "load_interval_s": 0.05}  # Settings fields


class StaticResolver:
    """Resolver test double: answers from a table the test edits, or fails when told to."""

    def __init__(self, table: dict[str, list[str]]) -> None:
        self.table = table
        self.failing = False
        self.asked = 0

    async def addresses(self, host: str, port: int) -> list[str]:
        self.asked += 1
        if self.failing:
            raise OSError(f"double: {host} does not resolve")
        return list(self.table[host])


async def health(proxy: FastProxy) -> dict[str, Any]:
    result: dict[str, Any] = await (await proxy.http.get("/health")).json()
    return result


async def ask(proxy: FastProxy, model: str = "plain", **extra: Any) -> dict[str, str]:
    """One non-streamed chat request through the proxy; its response headers."""
    resp = await proxy.http.post(
        "/v1/chat/completions", json={"model": model, "messages": HELLO, **extra}
    )
    assert resp.status == 200, await resp.text()
    await resp.read()
    return dict(resp.headers)


def measure(proxy: FastProxy, backend: str, tokens_per_s: float) -> None:
    """Seed the proxy's scoreboard as if `backend` had been measured alone on prose."""
    board = proxy.http.app[ROUTER].scoreboard
    for _ in range(3):
        board.record(Outcome(backend, "prose", 1, tokens_per_s, 0.1, 64, 0, 0))


def test_urls_are_checked_like_url() -> None:
    with pytest.raises(ValueError, match=r"either `url` .* or `urls`"):
        BackendConfig(name="a", url="http://h:1", urls=["http://h:2"])
    with pytest.raises(ValueError, match="repeated: http://h:1"):
        BackendConfig(name="a", urls=["http://h:1", "http://h:1/"])
    with pytest.raises(ValueError, match="must look like http://host:port"):
        BackendConfig(name="a", urls=["h:1"])
    with pytest.raises(ValueError, match="either `model` or `url` / `urls`"):
        BackendConfig(name="a", urls=["http://h:1"], model="m.gguf")
    cfg = BackendConfig(name="a", urls=["http://h:1/", "http://g:2"])
    assert cfg.replica_urls == ["http://h:1", "http://g:2"] and not cfg.supervised


async def test_names_stand_for_their_addresses_and_addresses_for_themselves() -> None:
    assert names_a_host("http://llama.ns.svc:8080") and not names_a_host("http://10.0.0.1:8080")
    assert not names_a_host("http://[::1]:8080") and not names_a_host("https://llama.example:443")
    assert with_address("http://llama:8080/v", "10.0.0.7") == "http://10.0.0.7:8080/v"
    assert with_address("http://llama", "fd00::7") == "http://[fd00::7]:80"
    # The system resolver reads /etc/hosts here: localhost is one server, not 127.0.0.1 and ::1.
    assert await SystemResolver().addresses("localhost", 8080) == ["127.0.0.1"]
    resolver = StaticResolver({"llama": ["10.0.0.2", "10.0.0.1"]})
    found = await discover(["http://llama:8080", "http://10.0.0.9:8080"], resolver)
    assert found == {
        "http://llama:8080": ["http://10.0.0.2:8080", "http://10.0.0.1:8080"],
        "http://10.0.0.9:8080": ["http://10.0.0.9:8080"],
    }
    resolver.failing = True
    found = await discover(["http://llama:8080"], resolver)
    assert found["http://llama:8080"] == "cannot resolve llama: double: llama does not resolve"


async def test_requests_go_to_the_replica_with_the_fewest(tmp_path: Path) -> None:
    doubles = [await start_double(Behaviour(token_delay_s=0.02)) for _ in range(3)]
    backend = {"name": "plain", "urls": [d.url for d in doubles], "parallel": 2}
    try:
        async with proxy_in_front(tmp_path, [backend], **FAST) as proxy:
            await asyncio.gather(*(ask(proxy) for _ in range(6)))
            # Six at once over three replicas of two slots: two each, none queued behind another.
            assert [d.peak_processing for d in doubles] == [2, 2, 2]
            for _ in range(6):
                await ask(proxy)
            # One at a time: ties go to the replica used least recently, so all take turns.
            assert [len(d.received) for d in doubles] == [4, 4, 4]
            shown = (await health(proxy))["backends"]["plain"]
            assert shown["state"] == "ready" and shown["limit"] == 2
            assert [r["url"] for r in shown["replicas"]] == [d.url for d in doubles]
            assert all(r["state"] == "ready" for r in shown["replicas"])
            devices = (await health(proxy))["devices"]
            # Replicas are on other machines: each is a device of its own.
            assert {f"url:{d.url}" for d in doubles} <= set(devices)
    finally:
        for d in doubles:
            await d.stop()


async def test_when_every_replica_is_full_requests_queue_then_get_429(tmp_path: Path) -> None:
    doubles = [await start_double(Behaviour(token_delay_s=0.05, tokens=10)) for _ in range(2)]
    backend = {"name": "plain", "urls": [d.url for d in doubles], "parallel": 1}
    try:
        async with proxy_in_front(tmp_path, [backend], max_queue=1, **FAST) as proxy:
            running = [asyncio.create_task(ask(proxy)) for _ in range(3)]

            async def queued() -> bool:
                return bool((await health(proxy))["backends"]["plain"]["queued"] == 1)

            await eventually(queued)
            resp = await proxy.http.post(
                "/v1/chat/completions", json={"model": "plain", "messages": HELLO}
            )
            assert resp.status == 429
            assert "on each of 2 ready replicas" in (await resp.json())["error"]["message"]
            await asyncio.gather(*running)  # the queued one ran once a replica was free
            assert sorted(len(d.received) for d in doubles) == [1, 2]
            assert [d.peak_processing for d in doubles] == [1, 1]
    finally:
        for d in doubles:
            await d.stop()


async def test_a_replica_that_dies_is_taken_out_and_the_backend_serves_on(
    tmp_path: Path,
) -> None:
    doubles = [await start_double() for _ in range(2)]
    dead, alive = doubles
    port = dead.server.port if dead.server else 0
    dead_url = dead.url
    backend = {"name": "plain", "urls": [d.url for d in doubles]}
    try:
        async with proxy_in_front(tmp_path, [backend], **FAST) as proxy:
            await dead.stop()
            # Pinned requests too: the one that meets the dead replica retries on the other.
            for _ in range(4):
                await ask(proxy, "plain")
            assert len(alive.received) >= 3
            state = await health(proxy)
            replicas = {r["url"]: r for r in state["backends"]["plain"]["replicas"]}
            assert replicas[dead_url]["state"] == "unhealthy"
            assert state["backends"]["plain"]["state"] == "ready"
            assert state["status"] == "degraded"
            text = await (await proxy.http.get("/metrics")).text()
            assert f'specproxy_replica_up{{backend="plain",replica="{dead_url}"}} 0.0' in text
            assert 'specproxy_backend_up{backend="plain",spec_type="none"} 1.0' in text

            await dead.listen(port=port)  # back on the same address: its health check passes

            async def back() -> bool:
                return bool((await health(proxy))["status"] == "ok")

            await eventually(back)
            before = len(dead.received)
            await asyncio.gather(*(ask(proxy) for _ in range(4)))
            assert len(dead.received) > before
    finally:
        for d in doubles:
            await d.stop()


async def test_a_replica_failing_its_health_checks_gets_no_requests(tmp_path: Path) -> None:
    doubles = [await start_double() for _ in range(2)]
    sick, well = doubles
    backend = {"name": "plain", "urls": [d.url for d in doubles]}
    try:
        async with proxy_in_front(tmp_path, [backend], **FAST) as proxy:
            sick.behaviour.healthy = False

            async def out() -> bool:
                replicas = (await health(proxy))["backends"]["plain"]["replicas"]
                return bool(replicas[0]["state"] == "unhealthy")

            await eventually(out)
            before = len(sick.received)
            for _ in range(4):
                await ask(proxy)
            assert len(sick.received) == before and len(well.received) >= 4
            shown = (await health(proxy))["backends"]["plain"]["replicas"][0]
            assert shown["failed_health_checks"] >= 3
    finally:
        for d in doubles:
            await d.stop()


async def test_a_host_name_is_resolved_again_and_its_replicas_follow(tmp_path: Path) -> None:
    hosts = ["127.0.0.2", "127.0.0.3", "127.0.0.4"]
    port = free_port(*hosts)
    doubles = {h: await start_double(host=h, port=port) for h in hosts}
    resolver = StaticResolver({"llama.test": hosts[:2]})
    backend = {"name": "plain", "urls": [f"http://llama.test:{port}"]}
    try:
        async with proxy_in_front(
            tmp_path, [backend], resolver=resolver, resolve_interval_s=0.05, **FAST
        ) as proxy:

            async def replicas() -> list[str]:
                shown = (await health(proxy))["backends"]["plain"]
                return [r["url"] for r in shown["replicas"] if r["state"] == "ready"]

            assert await replicas() == [f"http://{h}:{port}" for h in hosts[:2]]
            for _ in range(4):
                await ask(proxy)
            assert [len(doubles[h].received) for h in hosts] == [2, 2, 0]

            resolver.table["llama.test"] = hosts[1:]  # a pod replaced by another

            async def moved() -> bool:
                return await replicas() == [f"http://{h}:{port}" for h in hosts[1:]]

            await eventually(moved)
            for _ in range(4):
                await ask(proxy)
            assert [len(doubles[h].received) for h in hosts] == [2, 4, 2]

            resolver.failing = True  # DNS trouble is not an outage: the replicas stay
            asked = resolver.asked
            await eventually(lambda: resolver.asked > asked + 2)
            state = await health(proxy)
            assert len(state["backends"]["plain"]["replicas"]) == 2
            assert "does not resolve" in str(state["backends"]["plain"]["resolve_errors"])
            await ask(proxy)
    finally:
        for d in doubles.values():
            await d.stop()


async def test_the_load_level_counts_what_the_server_reports(tmp_path: Path) -> None:
    double = await start_double()
    backend = {"name": "plain", "url": double.url, "parallel": 8}
    try:
        async with proxy_in_front(tmp_path, [backend], **FAST) as proxy:
            assert (await ask(proxy))["X-Specproxy-Load-Level"] == "1"
            double.behaviour.others = 3  # another proxy's requests

            async def seen() -> bool:
                return bool((await health(proxy))["backends"]["plain"]["load"] == 3)

            await eventually(seen)
            # Three there already, this one the fourth: level 4.
            assert (await ask(proxy))["X-Specproxy-Load-Level"] == "4"
            text = await (await proxy.http.get("/metrics")).text()
            replica = f'backend="plain",replica="{double.url}"'
            assert f"specproxy_replica_load{{{replica}}} 3.0" in text
            assert f"specproxy_replica_reported_requests{{{replica}}} 3.0" in text
            assert "llamacpp_requests_processing{" in text and replica in text

            # Started without --metrics: /slots (on by default) still tells.
            double.behaviour.metrics = False
            double.behaviour.others = 1

            async def from_slots() -> bool:
                shown = (await health(proxy))["backends"]["plain"]["replicas"][0]
                return bool(shown["load_source"] == "slots" and shown["load"] == 1)

            await eventually(from_slots)
            assert (await ask(proxy))["X-Specproxy-Load-Level"] == "2"
    finally:
        await double.stop()


async def test_own_requests_are_not_counted_twice(tmp_path: Path) -> None:
    double = await start_double(Behaviour(token_delay_s=0.05, tokens=20))
    backend = {"name": "plain", "url": double.url, "parallel": 4}
    try:
        async with proxy_in_front(tmp_path, [backend], **FAST) as proxy:
            running = asyncio.gather(*(ask(proxy) for _ in range(2)))
            loads = []
            for _ in range(10):
                await asyncio.sleep(0.05)
                loads.append((await health(proxy))["backends"]["plain"]["load"])
            await running
            # The server reports the proxy's own two requests: still two, not four.
            assert max(loads) == 2
    finally:
        await double.stop()


async def test_two_proxies_in_front_of_the_same_servers_route_as_one(tmp_path: Path) -> None:
    """Proxy A keeps the fastest backend busy; proxy B sees it and spills, as A itself does."""
    doubles = {
        "fast": await start_double(Behaviour(token_delay_s=0.05, tokens=40)),
        "slow": await start_double(),
    }
    backends = [{"name": n, "url": d.url, "parallel": 1} for n, d in doubles.items()]
    try:
        async with (
            proxy_in_front(tmp_path, backends, doubles, explore_share=0, **FAST) as a,
            proxy_in_front(tmp_path, backends, doubles, explore_share=0, **FAST) as b,
        ):
            for proxy in (a, b):
                measure(proxy, "fast", 60.0)
                measure(proxy, "slow", 40.0)
            assert (await ask(b, "auto", max_tokens=4))["X-Specproxy-Backend"] == "fast"
            busy = asyncio.create_task(ask(a, "fast"))

            async def b_sees_it() -> bool:
                return bool((await health(b))["backends"]["fast"]["load"] == 1)

            await eventually(b_sees_it)
            assert not busy.done()
            from_b = await ask(b, "auto", max_tokens=4)
            from_a = await ask(a, "auto", max_tokens=4)
            for headers in (from_a, from_b):
                assert headers["X-Specproxy-Backend"] == "slow"
                assert headers["X-Specproxy-Route"] == "spill"
            await busy

            async def b_sees_it_free() -> bool:
                return bool((await health(b))["backends"]["fast"]["load"] == 0)

            await eventually(b_sees_it_free)
            assert (await ask(b, "auto", max_tokens=4))["X-Specproxy-Backend"] == "fast"
    finally:
        for d in doubles.values():
            await d.stop()


async def test_a_replicated_backend_on_a_named_device_shares_it(tmp_path: Path) -> None:
    doubles = [await start_double(Behaviour(token_delay_s=0.01)) for _ in range(2)]
    other = await start_double(Behaviour(token_delay_s=0.01))
    backends: list[dict[str, Any]] = [
        {"name": "r", "urls": [d.url for d in doubles], "device": "box"},
        {"name": "o", "url": other.url, "device": "box"},
    ]
    try:
        async with proxy_in_front(
            tmp_path, backends, devices={"box": {"capacity": 1}}, **FAST
        ) as proxy:
            await asyncio.gather(*(ask(proxy, m) for m in ["r", "o"] * 3))
            replica_busy = [span for d in doubles for span in d.busy]
            overlap = [
                (x, y) for x in replica_busy for y in other.busy if x[0] < y[1] and y[0] < x[1]
            ]
            # `device` still applies: r (either replica) and o take turns on "box" ...
            assert not overlap
            pool = proxy.http.app[POOL]
            assert set(pool.devices) == {"box"}
    finally:
        for d in [*doubles, other]:
            await d.stop()


async def test_a_backend_whose_name_never_resolves_says_why(tmp_path: Path) -> None:
    resolver = StaticResolver({})
    resolver.failing = True
    backend = {"name": "plain", "urls": ["http://nowhere.test:8080"]}
    async with proxy_in_front(
        tmp_path, [backend], resolver=resolver, wait_ready=False, resolve_interval_s=0.05, **FAST
    ) as proxy:
        await eventually(lambda: resolver.asked >= 2)
        resp = await proxy.http.get("/health")
        assert resp.status == 503
        shown = (await resp.json())["backends"]["plain"]
        assert shown["state"] == "starting" and shown["replicas"] == []
        assert "cannot resolve nowhere.test" in shown["resolve_errors"]["http://nowhere.test:8080"]
        resp = await proxy.http.post(
            "/v1/chat/completions", json={"model": "plain", "messages": HELLO}
        )
        assert resp.status == 503


@pytest.mark.parametrize("model", ["plain", "auto"])
async def test_a_retry_never_returns_to_a_replica_that_accepted_no_connection(
    tmp_path: Path, model: str
) -> None:
    # Replica `a` is the emptier one, so it is chosen first; then it stops accepting
    # connections (a server too busy to accept). The request must be retried on `b`, never on
    # `a` again, and `a` must be out of routing until its health check says otherwise.
    a = await start_double()
    b = await start_double(Behaviour(others=1))
    backend = {"name": "plain", "urls": [a.url, b.url]}
    slow_health: dict[str, Any] = {
        "health_interval_s": 60.0,
        "load_interval_s": 0.05,
        "connect_timeout_s": 0.3,
    }
    try:
        async with proxy_in_front(tmp_path, [backend], {"a": a, "b": b}, **slow_health) as proxy:

            async def b_reported() -> bool | None:
                replicas = (await health(proxy))["backends"]["plain"]["replicas"]
                return any(r["url"] == b.url and r["reported"] == 1 for r in replicas) or None

            await eventually(b_reported, 10, "b's report of another proxy's request")
            a_url = a.url
            await a.stop()
            with accepting_nothing(port=int(a_url.rsplit(":", 1)[1])):
                for _ in range(3):
                    headers = await ask(proxy, model)
                    assert headers["X-Specproxy-Backend"] == "plain"
                replicas = (await health(proxy))["backends"]["plain"]["replicas"]
            states = {r["url"]: r["state"] for r in replicas}
            assert states == {a_url: "unhealthy", b.url: "ready"}, states
            assert len(b.received) == 3
    finally:
        await b.stop()
