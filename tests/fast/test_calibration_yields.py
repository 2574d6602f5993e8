"""Users before calibration: a user's request waits at most for the calibration request already
decoding, and the next calibration request waits for the user's to end (fast tier, stub
backends)."""

from __future__ import annotations

import asyncio
import time
from pathlib import Path

from structlog.testing import capture_logs

from proxy.testing.llama_double import Behaviour, start_double
from tests.inprocess import SHORT_CALIBRATION, fast_proxy, proxy_in_front
from tests.messages import openai_messages

HELLO = openai_messages("Say hello.")
# Each stub answer takes 10 x 0.15 s: a calibration request holds the device for 1.5 s.
TOKENS, DELAY_S = 10, 0.15


async def test_a_users_request_waits_at_most_for_the_calibration_request_decoding(
    tmp_path: Path,
) -> None:
    shared = {"device": "cpu0"}
    with capture_logs() as logs:
        async with fast_proxy(
            tmp_path,
            backends={"plain": shared, "ngram": {"kind": "ngram", **shared}},
            devices={"cpu0": {"capacity": 1}},
            **SHORT_CALIBRATION,
        ) as proxy:
            for double in proxy.doubles.values():
                double.behaviour.tokens, double.behaviour.token_delay_s = TOKENS, DELAY_S
            # Wait for a calibration request to be decoding on one backend.
            deadline = time.monotonic() + 10
            while not any(d.processing for d in proxy.doubles.values()):
                assert time.monotonic() < deadline, "calibration sent nothing"
                await asyncio.sleep(0.02)
            health = await (await proxy.http.get("/health")).json()
            assert health["calibration"]["state"] == "running"
            (busy,) = [n for n, d in proxy.doubles.items() if d.processing]
            other = "plain" if busy == "ngram" else "ngram"
            start = time.monotonic()
            raw = await proxy.openai().chat.completions.with_raw_response.create(
                model=other,
                messages=HELLO,
            )
            ended = time.monotonic()
            # It waited for the calibration request decoding, not for a second one.
            device_wait = float(raw.headers["X-Specproxy-Device-Wait"])
            assert device_wait < TOKENS * DELAY_S, device_wait
            assert ended - start < 2 * TOKENS * DELAY_S + 1
            # Nothing but the user's own request started while it waited or ran.
            started_meanwhile = [
                s for d in proxy.doubles.values() for s, _ in d.busy if start < s < ended
            ]
            assert len(started_meanwhile) == 1, "calibration went on beside a user's request"
            # /health says when calibration is over.
            await proxy.wait_calibrated(60)
    assert any(e["event"] == "calibration waits for users' requests" for e in logs)


async def test_a_frozen_backend_times_out_and_calibration_goes_on(tmp_path: Path) -> None:
    # Calibration's requests take the users' path: the same timeouts end a request to a backend
    # that accepted it and never answers, and the other backend is still measured.
    frozen = await start_double(Behaviour(tokens=16, first_token_delay_s=3600.0))
    alive = await start_double(Behaviour(tokens=16))
    doubles = {"frozen": frozen, "alive": alive}
    backends = [{"name": n, "url": d.url} for n, d in doubles.items()]
    try:
        with capture_logs() as logs:
            async with proxy_in_front(
                tmp_path,
                backends,
                doubles,
                **SHORT_CALIBRATION,
                # Each request to the frozen backend waits this long: the stubs answer in ms.
                request_timeout_s=1.0,
            ) as proxy:
                await proxy.wait_calibrated(60)
                board = await (await proxy.http.get("/scoreboard")).json()
    finally:
        for double in doubles.values():
            await double.stop()
    measured = {row["backend"] for row in board["estimates"]}
    assert "alive" in measured and "frozen" not in measured, measured
    failed = [e for e in logs if e["event"] == "calibration request failed"]
    assert failed and {e["backend"] for e in failed} == {"frozen"}
    assert {e["status"] for e in failed} == {504}
