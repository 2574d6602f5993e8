"""Backend supervision with real llama-server processes: restarts, shutdown, no orphans.

Start-up refusals that need no llama-server (a bad config, a missing binary, a taken port) are
in tests/fast/test_preflight.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import urllib.error
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.gguf_files import vocab_file
from tests.helpers import ROOT, clean_env, wait_for
from tests.subprocess_proxy import (
    RunningProxy,
    openai_client,
    running_proxy,
    wait_calibrated,
)

ONE_BACKEND = """
restart_backoff_initial_s: 0.2
health_interval_s: 0.5
backends:
  - {name: solo, kind: plain, model: smollm2-135m, threads: 1, ctx_size: 1024}
"""


def alive(pid: int) -> bool:
    """Whether pid is a running (not zombie) process."""
    try:
        status = Path(f"/proc/{pid}/status").read_text()
    except FileNotFoundError:
        return False
    return "\nState:\tZ" not in status


@pytest.fixture
def solo(tmp_path: Path) -> Iterator[RunningProxy]:
    config = tmp_path / "solo.yaml"
    config.write_text(ONE_BACKEND)
    with running_proxy(config, tmp_path / "proxy.log") as running:
        yield running


@pytest.fixture
def solo_client(solo: RunningProxy) -> Iterator[openai.OpenAI]:
    with openai_client(solo.url) as sdk:
        yield sdk


def test_killed_backend_is_restarted_and_pinned_requests_get_503(
    solo: RunningProxy, solo_client: openai.OpenAI
) -> None:
    pid = solo.backend_pids()["solo"]
    os.kill(pid, signal.SIGKILL)
    wait_for(lambda: solo.health()["backends"]["solo"]["state"] != "ready", 5, "backend down")
    with pytest.raises(openai.APIStatusError) as exc:
        solo_client.chat.completions.create(
            model="solo", messages=[{"role": "user", "content": "hi"}], max_tokens=4
        )
    assert exc.value.status_code == 503
    assert exc.value.response.headers["retry-after"]
    wait_for(lambda: solo.health()["status"] == "ok", 60, "backend restarted")
    backend = solo.health()["backends"]["solo"]
    assert backend["restarts"] == 1 and backend["pid"] != pid
    reply = solo_client.chat.completions.create(
        model="solo", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None


def _restart(proxy: RunningProxy, name: str) -> tuple[int, dict[str, Any]]:
    request = urllib.request.Request(
        f"{proxy.url}/admin/backends/{name}/restart", b"", method="POST"
    )
    try:
        with urllib.request.urlopen(request, timeout=120) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def test_restart_on_request_gives_a_fresh_process_and_refuses_while_busy(
    solo: RunningProxy, solo_client: openai.OpenAI
) -> None:
    pid = solo.backend_pids()["solo"]
    wait_calibrated(solo.url, 60)
    status, body = _restart(solo, "solo")
    assert status == 200 and body["state"] == "ready" and body["pid"] != pid
    assert not alive(pid)
    backend = solo.health()["backends"]["solo"]
    # Asked for, not a crash: the crash counter that alerts watch stays at zero.
    assert backend["pid"] == body["pid"] and backend["restarts"] == 0
    reply = solo_client.chat.completions.create(
        model="solo", messages=[{"role": "user", "content": "hi"}], max_tokens=4
    )
    assert reply.choices[0].message.content is not None

    stream = solo_client.chat.completions.create(
        model="solo",
        messages=[{"role": "user", "content": "Count from 1 to 500, one number per line."}],
        max_tokens=400,
        stream=True,
        # The model may end a count early: only its full length tells a cut answer apart.
        extra_body={"ignore_eos": True},
    )
    next(iter(stream))  # the request is in flight
    status, body = _restart(solo, "solo")
    assert status == 409 and body["error"]["code"] == "backend_busy"
    assert "retry once it is idle" in body["error"]["message"]
    rest = list(stream)
    assert rest[-1].choices[0].finish_reason == "length", "the answer in flight was cut"
    assert solo.health()["backends"]["solo"]["pid"] == backend["pid"]

    status, body = _restart(solo, "nope")
    assert status == 404 and "the backends are solo" in body["error"]["message"]


def test_no_llama_server_outlives_a_sigkilled_proxy(solo: RunningProxy) -> None:
    pid = solo.backend_pids()["solo"]
    assert alive(pid)
    solo.process.kill()
    solo.process.wait()
    wait_for(lambda: not alive(pid), 5, f"llama-server {pid} to die with the proxy")


def test_sigterm_stops_backends_and_exits_cleanly(solo: RunningProxy) -> None:
    pid = solo.backend_pids()["solo"]
    solo.process.send_signal(signal.SIGTERM)
    assert solo.process.wait(30) == 0
    assert not alive(pid)


def _serve_fails(tmp_path: Path, config_text: str, **env: str) -> str:
    config = tmp_path / "bad.yaml"
    config.write_text(config_text)
    result = subprocess.run(
        [sys.executable, "-m", "proxy", "--config", str(config), "serve"],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 2, result.stderr
    return result.stderr


def test_mismatched_draft_pair_refuses_to_start(tmp_path: Path) -> None:
    other = vocab_file(tmp_path / "other-vocab.gguf")
    stderr = _serve_fails(
        tmp_path,
        "backends:\n  - {name: d, kind: draft-simple, model: smollm2-135m,"
        f" draft_model: {other}}}\n",
    )
    assert "cannot draft for target" in stderr
    assert "other-vocab.gguf" in stderr
    assert "smollm2-135m-instruct-q4_1.gguf" in stderr
