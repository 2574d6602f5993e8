"""Two real proxies in front of one real llama-server: what one sends, the other sees."""

from __future__ import annotations

import json
import subprocess
import threading
import urllib.request
from collections.abc import Iterator

import pytest

from proxy.backends.launch import prepare_backends
from proxy.config import Settings
from tests.helpers import free_port, get_json, wait_for, wait_until, without_specproxy_env
from tests.messages import openai_messages
from tests.subprocess_proxy import RunningProxy, openai_client, running_proxy

LONG = openai_messages("Count from 1 to 1000, one number per line.")


@pytest.fixture(scope="module")
def shared_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    """A llama-server (SmolLM2, one thread, two slots) that no proxy owns: its URL."""
    backend = {"name": "plain", "model": "smollm2-135m", "threads": 1, "ctx_size": 2048,
               "parallel": 2}  # fmt: skip
    with without_specproxy_env():  # as for the proxies: nothing of the caller's SPECPROXY_*
        (spec,) = prepare_backends(Settings(backends=[backend]))
    port = free_port()
    log_path = tmp_path_factory.mktemp("server") / "llama-server.log"
    with log_path.open("w") as log:
        process = subprocess.Popen(
            spec.argv("127.0.0.1", port), stdout=log, stderr=subprocess.STDOUT
        )
    url = f"http://127.0.0.1:{port}"

    def healthy() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"llama-server exited:\n{log_path.read_text()[-2000:]}")
        return get_json(f"{url}/health", timeout=2)[0] == 200

    try:
        wait_for(healthy, 120, "llama-server to start", interval=0.2, ignore=(OSError,))
        yield url
    finally:
        process.terminate()
        process.wait(10)


@pytest.fixture(scope="module")
def two_proxies(
    shared_server: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[tuple[RunningProxy, RunningProxy]]:
    """Proxies A and B, started with `specproxy serve`, both with the server as a `url` backend."""
    tmp = tmp_path_factory.mktemp("proxies")
    config = tmp / "shared.yaml"
    config.write_text(
        "calibration_requests: 0\n"
        "explore_share: 0\n"
        "load_interval_s: 0.1\n"
        "health_interval_s: 0.5\n"
        f"backends:\n  - {{name: plain, url: '{shared_server}', parallel: 2}}\n"
    )
    with (
        running_proxy(config, tmp / "a.log", ready_timeout=60) as a,
        running_proxy(config, tmp / "b.log", ready_timeout=60) as b,
    ):
        yield a, b


def replica(proxy: RunningProxy) -> dict[str, object]:
    backends = proxy.health()["backends"]
    assert isinstance(backends, dict)
    (shown,) = backends["plain"]["replicas"]
    assert isinstance(shown, dict)
    return shown


def level_of_one_request(proxy: RunningProxy) -> str:
    """The load level a short pinned request through `proxy` ran at (response header)."""
    body = {"model": "plain", "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 4}
    request = urllib.request.Request(
        f"{proxy.url}/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(request, timeout=60) as resp:
        assert resp.status == 200
        return str(resp.headers["X-Specproxy-Load-Level"])


def test_traffic_through_one_proxy_is_load_the_other_routes_by(
    two_proxies: tuple[RunningProxy, RunningProxy],
) -> None:
    a, b = two_proxies
    assert wait_until(lambda: replica(b)["reported"] == 0, 10), replica(b)
    assert level_of_one_request(b) == "1"

    client = openai_client(a.url)
    started, done = threading.Event(), threading.Event()

    def long_stream_through_a() -> None:
        stream = client.chat.completions.create(
            model="plain",
            messages=LONG,
            max_tokens=600,
            stream=True,
            extra_body={"ignore_eos": True},  # llama-server: generate all of max_tokens
        )
        for _ in stream:
            started.set()
        done.set()

    thread = threading.Thread(target=long_stream_through_a, daemon=True)
    thread.start()
    try:
        assert started.wait(60), "proxy A's stream never started"
        # B has nothing in flight, yet sees the request A sent: llama-server reports it.
        assert wait_until(lambda: replica(b)["load"] == 1 and not done.is_set(), 10), replica(b)
        shown = replica(b)
        assert shown["in_flight"] == 0 and shown["reported"] == 1
        assert shown["load_source"] == "metrics"
        # A, which sent it, counts it once: its own request is the one the server reports.
        sender = replica(a)
        assert sender["in_flight"] == 1 and sender["load"] == 1, sender
        assert not done.is_set(), "A's stream ended before B's request: lengthen it"
        # So B's own request is the second on the server: load level 2, as through one proxy.
        assert level_of_one_request(b) == "2"
        assert not done.is_set(), "A's stream ended during B's request: lengthen it"
        lines = b.log_path.read_text().splitlines()
        log_lines = [json.loads(line) for line in lines if line.startswith("{")]
        requests = [line for line in log_lines if line.get("event") == "request"]
        assert requests[-1]["load_level"] == 2
    finally:
        thread.join(120)
        client.close()
    assert done.is_set()
    assert wait_until(lambda: replica(b)["load"] == 0, 10), replica(b)
    assert level_of_one_request(b) == "1"
    assert wait_until(lambda: replica(a)["load"] == 0, 10), replica(a)
