"""Waits on a backend end on a stall, not on the clock (proxy/api/progress.py): a prompt that
progresses is never cut, whatever surface and however long; a backend whose slots stand still is,
within its stall window; a cap, where set, still ends a wait. Stub backends: the double's /slots
says a prompt advanced at each look, or that it stands still."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest
from structlog.testing import capture_logs

from tests.inprocess import fast_proxy

STALL = 0.3
SLOW = 1.5  # the double's prompt: five stall windows
CHAT = {"model": "plain", "messages": [{"role": "user", "content": "Say hello."}]}
REQUESTS = [
    ("/v1/chat/completions", CHAT),  # assembled from a stream upstream
    ("/v1/chat/completions", {**CHAT, "stream": True}),
    ("/v1/messages", {**CHAT, "max_tokens": 8}),  # relayed whole
    ("/v1/responses", {"model": "plain", "input": "Say hello.", "stream": True}),
]
IDS = ["chat", "chat-stream", "messages", "responses-stream"]


@pytest.mark.parametrize(("path", "body"), REQUESTS, ids=IDS)
async def test_a_slow_prompt_that_progresses_is_never_cut(
    tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    async with fast_proxy(tmp_path, stall_timeout_s=STALL, calibration_requests=0) as proxy:
        double = proxy.doubles["plain"]
        double.behaviour.first_token_delay_s = SLOW
        double.behaviour.progressing = True
        resp = await proxy.http.post(path, json=body)
        text = await resp.text()
    assert resp.status == 200 and "upstream_timeout" not in text, text
    assert double.looks >= 2, "the proxy looked at the backend's progress"


@pytest.mark.parametrize(("path", "body"), REQUESTS, ids=IDS)
async def test_a_backend_that_stands_still_is_cut_within_its_stall_window(
    tmp_path: Path, path: str, body: dict[str, Any]
) -> None:
    async with fast_proxy(tmp_path, stall_timeout_s=STALL, calibration_requests=0) as proxy:
        proxy.doubles["plain"].behaviour.first_token_delay_s = 30
        started = time.monotonic()
        with capture_logs() as logs:
            resp = await proxy.http.post(path, json=body)
            text = await resp.text()
        took = time.monotonic() - started
    # No header came: a 504 in the API's own shape, streamed or not.
    assert resp.status == 504 and "made no progress for 0.3 s" in text, text
    assert took < 5, "a stall window and the looks, not the 30 s prompt"
    (line,) = [x for x in logs if x.get("event") == "request"]
    # The request's real duration, also for one that failed before any answer came.
    assert line["duration_s"] >= STALL and line["status"] == resp.status


async def test_a_cap_still_ends_a_progressing_wait(tmp_path: Path) -> None:
    async with fast_proxy(
        tmp_path, stall_timeout_s=STALL, request_timeout_s=0.5, calibration_requests=0
    ) as proxy:
        double = proxy.doubles["plain"]
        double.behaviour.first_token_delay_s = 5
        double.behaviour.progressing = True
        resp = await proxy.http.post("/v1/chat/completions", json=CHAT)
        text = await resp.text()
    assert resp.status == 504 and "did not finish within 0.5 s" in text, text
