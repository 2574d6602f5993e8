"""Samples taken while other programs used the cores do not decide once the machine is quiet:
the busy-machine estimate is re-measured first. In a module of its own, so that no other
proxy's backends (a module-scoped fixture's) share the cores with the test's busy loops."""

from __future__ import annotations

import os
import subprocess
import sys
import time

import pytest
import requests

from tests.helpers import ROOT, get_json
from tests.subprocess_proxy import running_proxy

THREADS_CONFIG = ROOT / "tests" / "configs" / "threads.yaml"


def hogs() -> list[subprocess.Popen[bytes]]:
    """As many busy loops as the machine has cores: another program taking every CPU."""
    return [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(os.cpu_count() or 2)
    ]


def test_samples_from_a_busy_machine_do_not_decide_once_it_is_quiet(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    log = tmp_path_factory.mktemp("busy") / "proxy.log"
    with running_proxy(
        THREADS_CONFIG, log, SPECPROXY_EXPLORE_SHARE="0", SPECPROXY_CALIBRATION_REQUESTS="0"
    ) as proxy:
        poem = [{"role": "user", "content": "Write a short poem about the sea."}]
        ask = {"messages": poem, "max_tokens": 48}

        def send(model: str) -> requests.Response:
            resp = requests.post(
                f"{proxy.url}/v1/chat/completions", json={"model": model, **ask}, timeout=300
            )
            assert resp.status_code == 200, resp.text
            return resp

        # Two threads measured while every core is taken; one thread measured on a quiet
        # machine. Taken at face value, one thread now looks the faster.
        busy = hogs()
        try:
            time.sleep(1.0)
            for _ in range(3):
                send("two")
        finally:
            for hog in busy:
                hog.kill()
                hog.wait()
        time.sleep(1.5)
        for _ in range(3):
            send("one")
        board = {r["backend"]: r for r in get_json(f"{proxy.url}/scoreboard")[1]["estimates"]}
        assert board["two"]["contended"] and not board["one"]["contended"], board
        assert board["two"]["tokens_per_s"] < board["one"]["tokens_per_s"], board
        routes = [
            (r.headers["X-Specproxy-Backend"], r.headers["X-Specproxy-Route"])
            for r in (send("auto") for _ in range(4))
        ]
        # Quiet again: the busy-machine estimate is re-measured at once, and then decides.
        assert routes[0] == ("two", "recheck"), routes
        assert [b for b, _ in routes[1:]] == ["two"] * 3, routes
        # Its estimate is now a quiet machine's. (Which thread count decodes faster is the
        # hardware's to say: on 2026-12-07 this machine ran one thread at 173 t/s, two at 122.)
        quiet = {r["backend"]: r for r in get_json(f"{proxy.url}/scoreboard")[1]["estimates"]}
        assert not quiet["two"]["contended"], quiet
