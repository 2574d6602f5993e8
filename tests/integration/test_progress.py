"""Waits end on a stall, not the clock, against a real llama-server: a prompt many stall windows
long completes, whole and streamed; a server frozen mid-prompt (SIGSTOP) is given up on within
a few stall windows, with the API's error; the log's duration is the request's own."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.helpers import get_json, wait_for, wait_until
from tests.subprocess_proxy import RunningProxy, proxy_on

STALL_S = 2.0
CONFIG = f"""
stall_timeout_s: {STALL_S}
backends:
  - {{name: plain, kind: plain, model: smollm2-135m, threads: 1, ctx_size: 8192, batch_size: 64}}
"""
# About 5 k tokens of prompt: many prompt steps of 64 tokens, on one thread.
LONG = " ".join(f"item{i} costs {i % 97} coins;" for i in range(500))


@pytest.fixture(scope="module")
def slow(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """SmolLM2-135M on one thread behind a proxy whose stall window is STALL_S."""
    with proxy_on(CONFIG, tmp_path_factory.mktemp("progress")) as running:
        yield running


def chat(proxy: RunningProxy, stream: bool, salt: str) -> tuple[int, str, float]:
    """The long prompt (made new by `salt`, so nothing is cached): status, body, seconds."""
    body: dict[str, Any] = {
        "model": "plain",
        "messages": [{"role": "user", "content": f"{salt} {LONG}\nWhich item costs 5 coins?"}],
        "max_tokens": 4,
        "stream": stream,
    }
    started = time.monotonic()
    resp = requests.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=600)
    return resp.status_code, resp.text, time.monotonic() - started


def request_lines(proxy: RunningProxy) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in proxy.log_path.read_text().splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("event") == "request"]


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
def test_a_prompt_many_stall_windows_long_completes(slow: RunningProxy, stream: bool) -> None:
    status, text, took = chat(slow, stream, f"run-{stream}")
    assert status == 200 and "upstream_timeout" not in text, text
    # Its first token came after several stall windows: a fixed limit of one window would have
    # cut it; progress kept it.
    line = request_lines(slow)[-1]
    assert line["ttft_s"] is None or line["ttft_s"] > 3 * STALL_S, line
    assert took > 3 * STALL_S and line["prompt_tokens"] > 4000, line


def test_a_server_frozen_mid_prompt_is_given_up_on(slow: RunningProxy) -> None:
    backend = slow.health()["backends"]["plain"]
    pid, url = int(backend["pid"]), str(backend["url"])
    result: dict[str, Any] = {}

    def send() -> None:
        result["answer"] = chat(slow, True, "frozen")

    sender = threading.Thread(target=send)
    sender.start()

    def processing() -> bool:
        slots = get_json(f"{url}/slots")[1]
        return any(s.get("n_prompt_tokens_processed") for s in slots if s.get("is_processing"))

    assert wait_until(processing, 60, ignore=(OSError, ValueError)), "the prompt never started"
    os.kill(pid, signal.SIGSTOP)
    frozen = time.monotonic()
    try:
        sender.join(timeout=60)
        given_up_s = time.monotonic() - frozen
    finally:
        # Unless the supervisor restarted it meanwhile (its health checks fail too).
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGCONT)
    assert not sender.is_alive(), "the request was never given up on"
    status, text, _ = result["answer"]
    assert "made no progress" in text, (status, text)
    # A stall window to notice, then two looks at the slots, each up to a window.
    assert given_up_s < 4 * STALL_S + 2, given_up_s
    # Logged once the proxy is done with it, which may be just after the client is.
    line = wait_for(
        lambda: next(
            (x for x in request_lines(slow) if "made no progress" in str(x.get("error"))), None
        ),
        10,
        "the frozen request's log line",
    )
    assert line["status"] in (200, 504) and line["duration_s"] >= STALL_S, line
