"""The proxy as a user runs it, `specproxy serve` in a subprocess: started, waited for until ready
or calibrated, reached with the official clients, stopped. The integration tier's harness (the
fast tier's is tests/inprocess.py)."""

from __future__ import annotations

import signal
import subprocess
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai

from tests.helpers import ROOT, clean_env, free_port, get_json, wait_for


@dataclass
class RunningProxy:
    """A `specproxy serve` subprocess and how to reach it."""

    process: subprocess.Popen[str]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> dict[str, object]:
        return get_json(f"{self.url}/health")[1]

    def backend_pids(self) -> dict[str, int]:
        backends = self.health()["backends"]
        assert isinstance(backends, dict)
        return {name: b["pid"] for name, b in backends.items() if b["pid"]}

    def log_tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def wait_ready(self, timeout: float = 300) -> None:
        def ready() -> bool:
            if self.process.poll() is not None:
                raise RuntimeError(f"proxy exited:\n{self.log_tail()}")
            status, body = get_json(f"{self.url}/health", timeout=2)
            return status == 200 and body.get("status") == "ok"

        wait_for(
            ready, timeout, lambda: f"the proxy to be ready:\n{self.log_tail()}", 0.3, (OSError,)
        )

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_proxy(config: Path, log_path: Path, **env: str) -> RunningProxy:
    """Start `python -m proxy serve` on a free port with this config; does not wait.

    Its environment has no SPECPROXY_* variable of the caller's: only these and `env`.
    """
    port = free_port()
    defaults = {
        "SPECPROXY_PORT": str(port),
        "SPECPROXY_LOG_FORMAT": "json",
        # Each proxy measures afresh unless a test shares a file on purpose.
        "SPECPROXY_SCOREBOARD_FILE": str(log_path.with_suffix(".scoreboard.json")),
    }
    environ = clean_env(**{**defaults, **env})
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [sys.executable, "-m", "proxy", "--config", str(config), "serve"],
            cwd=ROOT,
            env=environ,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            text=True,
        )
    return RunningProxy(process, port, log_path)


@contextmanager
def running_proxy(
    config: Path, log_path: Path, ready_timeout: float = 300, **env: str
) -> Iterator[RunningProxy]:
    """start_proxy, ready for the block (within `ready_timeout` s), stopped however it ends."""
    running = start_proxy(config, log_path, **env)
    try:
        running.wait_ready(ready_timeout)
        yield running
    finally:
        running.stop()


def calibration(url: str) -> dict[str, Any]:
    """What the proxy at `url` says of its start-up calibration (GET /health)."""
    progress = get_json(f"{url}/health")[1].get("calibration")
    assert isinstance(progress, dict), "the proxy's /health says nothing of calibration"
    return progress


def wait_calibrated(url: str, timeout: float) -> dict[str, Any]:
    """Wait until the proxy at `url` finished its start-up calibration; what /health says."""
    wait_for(lambda: calibration(url)["state"] == "done", timeout, "calibration", interval=0.5)
    return calibration(url)


def openai_client(url: str, **kw: object) -> openai.OpenAI:
    """The official OpenAI client for a proxy at `url`, without retries: use it in a `with`."""
    options: dict[str, object] = {"api_key": "unused", "max_retries": 0, "timeout": 120, **kw}
    return openai.OpenAI(base_url=f"{url}/v1", **options)  # type: ignore[arg-type]
