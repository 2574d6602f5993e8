"""`specproxy serve` in a subprocess, as a user runs it: started on a free port, waited for until
ready or calibrated, stopped. Shared by the integration tests and the scripts that start a proxy."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.backends.launch import free_port

ROOT = Path(__file__).resolve().parents[2]
ENV_PREFIX = "SPECPROXY_"


def clean_env(**env: str) -> dict[str, str]:
    """os.environ without the caller's SPECPROXY_* variables, plus `env`: for a spawned proxy."""
    kept = {k: v for k, v in os.environ.items() if not k.startswith(ENV_PREFIX)}
    return {**kept, **env}


def get_json(url: str, timeout: float = 5) -> tuple[int, Any]:
    """GET a JSON document, returning status and body even for error statuses (the body as
    parsed: an object, or a list such as llama-server's /slots)."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def calibration(url: str) -> dict[str, Any]:
    """What the proxy at `url` says of its start-up calibration (GET /health)."""
    progress = get_json(f"{url}/health")[1].get("calibration")
    if not isinstance(progress, dict):
        raise RuntimeError(f"{url}/health says nothing of calibration")
    return progress


@dataclass
class RunningProxy:
    """A `specproxy serve` subprocess and how to reach it."""

    process: subprocess.Popen[str]
    port: int
    log_path: Path

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def health(self) -> dict[str, Any]:
        body: dict[str, Any] = get_json(f"{self.url}/health")[1]
        return body

    def backend_pids(self) -> dict[str, int]:
        backends = self.health()["backends"]
        return {name: b["pid"] for name, b in backends.items() if b["pid"]}

    def log_tail(self) -> str:
        return self.log_path.read_text()[-3000:]

    def wait_ready(self, timeout: float = 300, calibrated: bool = False) -> None:
        """Until /health says every backend is ready (and, if asked, calibration is done).

        Raises RuntimeError with the log's tail if the proxy exits, TimeoutError if never ready.
        """
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"proxy exited:\n{self.log_tail()}")
            try:
                status, body = get_json(f"{self.url}/health", timeout=2)
            except (OSError, ValueError):
                status, body = 0, {}  # not listening yet
            done = body.get("calibration", {}).get("state") in ("done", "off")
            if status == 200 and body.get("status") == "ok" and (done or not calibrated):
                return
            time.sleep(0.3)
        what = "calibrated" if calibrated else "ready"
        raise TimeoutError(f"proxy not {what} in {timeout:g} s:\n{self.log_tail()}")

    def stop(self) -> None:
        """SIGTERM, and SIGKILL if it has not exited within 30 s."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_proxy(
    config: Path | None,
    log_path: Path,
    *,
    port: int | None = None,
    inherit_env: bool = False,
    **env: str,
) -> RunningProxy:
    """Start `python -m proxy serve` with this config (None: the embedded default); no wait.

    Its SPECPROXY_* variables are only `env`'s unless `inherit_env` (a script run by a user who
    set some); its scoreboard and its prompts kept across restarts are beside the log unless
    `env` names others, so each proxy measures afresh and starts cold.
    """
    port = port or free_port("127.0.0.1")
    settings = {
        "SPECPROXY_PORT": str(port),
        "SPECPROXY_LOG_FORMAT": "json",
        "SPECPROXY_SCOREBOARD_FILE": str(log_path.with_suffix(".scoreboard.json")),
        "SPECPROXY_PROMPT_ARCHIVE_DIR": str(log_path.with_suffix(".prompts")),
        **env,
    }
    environ = {**os.environ, **settings} if inherit_env else clean_env(**settings)
    argv = [sys.executable, "-m", "proxy", *(["--config", str(config)] if config else []), "serve"]
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            argv, cwd=ROOT, env=environ, stdout=log_file, stderr=subprocess.STDOUT, text=True
        )
    return RunningProxy(process, port, log_path)


@contextmanager
def running_proxy(
    config: Path | None,
    log_path: Path,
    ready_timeout: float = 300,
    *,
    calibrated: bool = False,
    port: int | None = None,
    inherit_env: bool = False,
    **env: str,
) -> Iterator[RunningProxy]:
    """start_proxy, ready (or calibrated) for the block within `ready_timeout` s, then stopped."""
    running = start_proxy(config, log_path, port=port, inherit_env=inherit_env, **env)
    try:
        running.wait_ready(ready_timeout, calibrated=calibrated)
        yield running
    finally:
        running.stop()
