"""Users before calibration: a user's request waits at most for the calibration request already
decoding, which is cancelled and sent again once users are gone (fast tier, stub backends)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from structlog.testing import capture_logs

from tests.inprocess import fast_proxy

HELLO = [{"role": "user", "content": "Say hello."}]
# Each stub answer takes 10 x 0.3 s: a calibration request holds the device for 3 s.
TOKENS, DELAY_S = 10, 0.3


async def test_a_users_request_waits_at_most_for_the_calibration_request_decoding(
    tmp_path: Path,
) -> None:
    shared = {"device": "cpu0"}
    with capture_logs() as logs:
        async with fast_proxy(
            tmp_path,
            backends={"plain": shared, "ngram": {"kind": "ngram", **shared}},
            devices={"cpu0": {"capacity": 1}},
            calibration_requests=1,
            calibration_prompts=1,
            calibration_max_tokens=8,
            calibration_echo_tokens=8,
        ) as proxy:
            for double in proxy.doubles.values():
                double.behaviour.tokens, double.behaviour.token_delay_s = TOKENS, DELAY_S
            # Wait for a calibration request to be decoding on one backend.
            deadline = time.monotonic() + 10
            while not any(d.processing for d in proxy.doubles.values()):
                assert time.monotonic() < deadline, "calibration sent nothing"
                await asyncio.sleep(0.02)
            (busy,) = [n for n, d in proxy.doubles.items() if d.processing]
            calibrating = proxy.doubles[busy]
            sent_before = len(calibrating.received)
            other = "plain" if busy == "ngram" else "ngram"
            start = time.monotonic()
            raw = await proxy.openai().chat.completions.with_raw_response.create(
                model=other,
                messages=HELLO,  # type: ignore[arg-type]
            )
            took = time.monotonic() - start
            # Its own answer takes 3 s; the wait before it, less than one calibration request.
            device_wait = float(raw.headers["X-Specproxy-Device-Wait"])
            assert device_wait < TOKENS * DELAY_S, device_wait
            assert took < 2 * TOKENS * DELAY_S
            # The calibration request was cancelled, not finished beside the user's...
            assert calibrating.processing == 0
            # ...and is sent again once the user's request is done.
            yielded = calibrating.received[sent_before - 1]["messages"]
            deadline = time.monotonic() + 60
            while [r.get("messages") for r in calibrating.received].count(yielded) < 2:
                assert time.monotonic() < deadline, (
                    "the yielded calibration request never came back"
                )
                await asyncio.sleep(0.05)
            # /health says when it is over.
            while (await (await proxy.http.get("/health")).json())["calibration"][
                "state"
            ] != "done":
                assert time.monotonic() < deadline, "calibration never finished"
                await asyncio.sleep(0.2)
    assert any(e["event"] == "calibration yields to a user's request" for e in logs)
