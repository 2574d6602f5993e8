"""Many streams at once: connections to a backend are opened a bounded number at a time, so a
burst queues instead of failing on connect timeouts; beyond the configured concurrency and queue
the answer is a 429 with Retry-After, never a 502 (fast tier, stub backends)."""

from __future__ import annotations

import asyncio
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import aiohttp
from aiohttp import web

from proxy.api.relay import BoundedConnector
from tests.inprocess import fast_proxy
from tests.messages import openai_messages

HELLO = openai_messages("Say hello.")


class _Counting(aiohttp.TCPConnector):
    """Counts the connections being opened at once (below any bound a subclass puts on top)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.opening = self.peak = 0

    async def _create_connection(self, req: Any, traces: Any, timeout: Any) -> Any:
        self.opening += 1
        self.peak = max(self.peak, self.opening)
        try:
            await asyncio.sleep(0.01)  # a connect that takes a moment, as under load
            return await super()._create_connection(req, traces, timeout)
        finally:
            self.opening -= 1


class _BoundedCounting(BoundedConnector, _Counting):
    """The bound on top of the count."""


async def _peak_connects(connector: _Counting, requests: int) -> tuple[int, int]:
    """The most connections being opened at once for `requests` concurrent GETs, and the
    number that succeeded."""

    async def slow(_: web.Request) -> web.Response:
        await asyncio.sleep(0.2)
        return web.Response(text="ok")

    app = web.Application()
    app.router.add_get("/", slow)
    runner = web.AppRunner(app)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    port = runner.addresses[0][1]
    try:
        async with aiohttp.ClientSession(connector=connector) as session:

            async def get() -> int:
                async with session.get(f"http://127.0.0.1:{port}/") as resp:
                    await resp.read()
                    return resp.status

            statuses = await asyncio.gather(*(get() for _ in range(requests)))
    finally:
        await runner.cleanup()
    return connector.peak, statuses.count(200)


async def test_connections_are_opened_a_bounded_number_at_a_time() -> None:
    peak, ok = await _peak_connects(_BoundedCounting(4, limit=0), 200)
    assert ok == 200 and peak <= 4
    # Unbounded, a burst opens them all at once: the bound is what makes the difference.
    peak, ok = await _peak_connects(_Counting(limit=0), 200)
    assert ok == 200 and peak > 4


async def test_a_burst_of_streams_all_complete_and_the_rest_get_429(tmp_path: Path) -> None:
    async with fast_proxy(
        tmp_path,
        backends={"plain": {"max_concurrency": 150}},
        max_queue=50,
        upstream_connects=8,
    ) as proxy:
        double = proxy.doubles["plain"]
        double.behaviour.tokens, double.behaviour.token_delay_s = 8, 0.25

        async def stream(session: aiohttp.ClientSession) -> SimpleNamespace:
            async with session.post(
                f"{proxy.url}/v1/chat/completions",
                json={"model": "plain", "messages": HELLO, "stream": True},
            ) as resp:
                text = await resp.text()
                return SimpleNamespace(
                    status=resp.status, done=text.rstrip().endswith("[DONE]"), headers=resp.headers
                )

        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(connector=connector) as session:
            results = await asyncio.gather(*(stream(session) for _ in range(260)))
        statuses = sorted({r.status for r in results})
        assert statuses == [200, 429], statuses
        served = [r for r in results if r.status == 200]
        # Every stream admitted finished whole; the slots and the queue took 200 of them.
        assert all(r.done for r in served) and len(served) >= 200
        assert all(r.headers["Retry-After"] for r in results if r.status == 429)
