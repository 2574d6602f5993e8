"""API keys, safe binding defaults and graceful shutdown, on a real proxy: what only a process
shows (its log, its bind address, its signals). The 401s of every surface and SDK are in
tests/fast/test_auth.py."""

from __future__ import annotations

import json
import signal
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.helpers import get_json, wait_for
from tests.messages import openai_messages
from tests.subprocess_proxy import RunningProxy, openai_client, running_proxy

SOLO = """
backends:
  - {name: solo, kind: plain, model: smollm2-135m, threads: 1, ctx_size: 1024}
"""
KEY = "sk-test-4f0c2b"
HI = openai_messages("hi")


@pytest.fixture
def config(tmp_path: Path) -> Path:
    path = tmp_path / "solo.yaml"
    path.write_text(SOLO)
    return path


@pytest.fixture
def keyed(config: Path, tmp_path: Path) -> Iterator[RunningProxy]:
    keyfile = tmp_path / "keys"
    keyfile.write_text("sk-other\n" + KEY + "\n")
    with running_proxy(
        config, tmp_path / "proxy.log", SPECPROXY_API_KEYS_FILE=str(keyfile),
        SPECPROXY_CALIBRATION_REQUESTS="0",
    ) as running:  # fmt: skip
        yield running


def test_the_key_works_and_is_never_logged(keyed: RunningProxy) -> None:
    with openai_client(keyed.url, api_key=KEY) as client:
        reply = client.chat.completions.create(model="solo", messages=HI, max_tokens=2)
    assert reply.choices
    assert get_json(f"{keyed.url}/health")[0] == 200, "health stays open for load balancers"
    assert KEY not in keyed.log_path.read_text()


def test_prompts_are_not_logged_by_default(keyed: RunningProxy) -> None:
    secret = "my bank password is hunter2"
    with openai_client(keyed.url, api_key=KEY) as client:
        client.chat.completions.create(
            model="solo", messages=[{"role": "user", "content": secret}], max_tokens=2
        )
    log = keyed.log_path.read_text()
    assert '"event": "request"' in log and secret not in log


def test_default_bind_is_loopback_and_wide_bind_without_keys_warns(
    config: Path, tmp_path: Path
) -> None:
    with running_proxy(config, tmp_path / "wide.log", SPECPROXY_HOST="0.0.0.0") as wide:
        log = wide.log_path.read_text()
        assert "LISTENING BEYOND LOOPBACK WITHOUT API KEYS" in log
        # Backends stay on loopback whatever the proxy binds.
        backend = wide.health()["backends"]["solo"]
        assert str(backend["url"]).startswith("http://127.0.0.1:")


def test_sigterm_drains_a_running_stream_then_stops_backends(config: Path, tmp_path: Path) -> None:
    log_path = tmp_path / "proxy.log"
    # It stops at its own SIGTERM; the block's end stops it only if a step failed first.
    with running_proxy(config, log_path, SPECPROXY_CALIBRATION_REQUESTS="0") as proxy:
        pid = proxy.backend_pids()["solo"]
        client = openai_client(proxy.url, timeout=60)
        pieces: list[str] = []
        finish: list[str | None] = []

        def consume() -> None:
            stream = client.chat.completions.create(
                model="solo", messages=[{"role": "user", "content": "Count to 300."}],
                max_tokens=300, stream=True,
            )  # fmt: skip
            for chunk in stream:
                if chunk.choices:
                    pieces.append(chunk.choices[0].delta.content or "")
                    finish.append(chunk.choices[0].finish_reason)

        reader = threading.Thread(target=consume)
        with client:
            reader.start()
            wait_for(lambda: len(pieces) >= 3, 60, "the stream's first chunks", interval=0.01)
            proxy.process.send_signal(signal.SIGTERM)
            reader.join(60)
        assert finish[-1] in ("length", "stop"), "the in-flight stream finished normally"
        assert proxy.process.wait(60) == 0
    assert (
        not Path(f"/proc/{pid}").exists() or "State:\tZ" in Path(f"/proc/{pid}/status").read_text()
    )
    lines = [json.loads(x) for x in proxy.log_path.read_text().splitlines() if x.startswith("{")]
    assert any(x.get("event") == "shutting down" for x in lines)
