"""Start-up calibration says how far it is: requests done of those planned and the time left, on
/health and on the status page (fast tier, stub backends)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path
from typing import Any

from tests.inprocess import SHORT_CALIBRATION, fast_proxy

# Each stub answer takes 5 x 0.05 s, so the proxy is seen mid-calibration more than once.
TOKENS, DELAY_S = 5, 0.05


async def test_health_and_the_status_page_show_calibration_progress(tmp_path: Path) -> None:
    seen: list[dict[str, Any]] = []
    pages: list[str] = []
    async with fast_proxy(
        tmp_path,
        **SHORT_CALIBRATION,
    ) as proxy:
        for double in proxy.doubles.values():
            double.behaviour.tokens, double.behaviour.token_delay_s = TOKENS, DELAY_S
        deadline = time.monotonic() + 60
        while not seen or seen[-1]["state"] != "done":
            assert time.monotonic() < deadline, f"calibration did not end: {seen[-1:]}"
            seen.append((await (await proxy.http.get("/health")).json())["calibration"])
            pages.append(await (await proxy.http.get("/ui/live")).text())
            await asyncio.sleep(0.05)
        sent = sum(len(d.received) for d in proxy.doubles.values())

    running = [s for s in seen if s["state"] == "running"]
    before = [s for s in running if s["done"] == 0]
    assert all(s["eta_s"] is None for s in before), "no time left before a first measurement"
    midway = [s for s in running if 0 < s["done"] < s["planned"]]
    assert midway, seen
    for s in midway:
        # The mean pace so far (about TOKENS x DELAY_S a request) times the requests left; loose
        # above, as a busy machine slows the stubs' answers.
        left = s["planned"] - s["done"]
        assert 0 < s["eta_s"] < 10 * TOKENS * DELAY_S * left, s
    end = seen[-1]
    assert end["done"] == end["planned"] == end["requests"] == sent > 2
    assert end["eta_s"] == 0
    # The page, fetched just after each /health, says the same.
    shown = [
        f": {s['done']} of {s['planned']} requests · about" in page
        for s, page in zip(seen, pages, strict=True)
    ]
    assert any(shown), pages
    assert f"calibration done: {sent} of {sent} requests" in pages[-1]
