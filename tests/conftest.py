"""Fixtures that start the real thing: `specproxy serve` with real llama-server backends."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import openai
import pytest

ROOT = Path(__file__).resolve().parent.parent
TEST_CONFIG = ROOT / "tests" / "configs" / "test.yaml"


# Fixtures that need a llama-server build or the provisioned models: their tests are the
# integration tier (`pytest -m integration`); the rest run in seconds (`make test-fast`).
INTEGRATION_FIXTURES = frozenset(
    {
        "proxy",
        "client",
        "async_client",
        "models_dir",
        "tokenizer_source",
        "llama_server",
        "specproxy_image",
        "agent_proxy",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a real backend or model as integration."""
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


def wait_until(condition, timeout: float) -> bool:  # type: ignore[no-untyped-def]
    """Poll condition every 50 ms until it holds (True) or timeout passes (False)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if condition():
            return True
        time.sleep(0.05)
    return False


def free_port() -> int:
    """A loopback port nobody listens on right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def get_json(url: str, timeout: float = 5) -> tuple[int, dict[str, object]]:
    """GET a JSON document, returning status and body even for error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


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

    def wait_ready(self, timeout: float = 300) -> None:
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"proxy exited:\n{self.log_path.read_text()[-3000:]}")
            try:
                status, body = get_json(f"{self.url}/health", timeout=2)
                if status == 200 and body.get("status") == "ok":
                    return
            except OSError:
                pass
            time.sleep(0.3)
        raise TimeoutError(f"proxy not ready in {timeout}s:\n{self.log_path.read_text()[-3000:]}")

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


def start_proxy(config: Path, log_path: Path, **env: str) -> RunningProxy:
    """Start `python -m proxy serve` on a free port with this config; does not wait."""
    port = free_port()
    environ = {
        **os.environ,
        "SPECPROXY_PORT": str(port),
        "SPECPROXY_LOG_FORMAT": "json",
        # Each proxy measures afresh unless a test shares a file on purpose.
        "SPECPROXY_SCOREBOARD_FILE": str(log_path.with_suffix(".scoreboard.json")),
        **env,
    }
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


@pytest.fixture(scope="session")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The proxy on the test config (SmolLM2 plain, self-drafting and n-gram), ready."""
    log_path = tmp_path_factory.mktemp("proxy") / "proxy.log"
    # No calibration: shared-proxy tests see only their own traffic on the backends.
    running = start_proxy(TEST_CONFIG, log_path, SPECPROXY_CALIBRATION_REQUESTS="0")
    try:
        running.wait_ready()
        yield running
    finally:
        running.stop()


@pytest.fixture(scope="session")
def client(proxy: RunningProxy) -> openai.OpenAI:
    """The official OpenAI client pointed at the proxy."""
    return openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=120)


@pytest.fixture
def async_client(proxy: RunningProxy) -> openai.AsyncOpenAI:
    """The official async OpenAI client pointed at the proxy."""
    return openai.AsyncOpenAI(
        base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=120
    )


@pytest.fixture(scope="session")
def specproxy_image(tmp_path_factory: pytest.TempPathFactory) -> str:
    """The repository's Dockerfile built with podman on the test base (see tests/containers.py)."""
    from tests import containers

    containers.require_podman()
    base = containers.ensure_base_image()
    log = tmp_path_factory.mktemp("image") / "build.log"
    seconds = containers.build(
        containers.IMAGE,
        ROOT / "Dockerfile",
        "--build-arg",
        f"BASE={base}",
        *containers.reuse_host_build(),
        log=log,
        stages=("build",),
    )
    how = "host's llama-server build" if containers.reuse_host_build() else "compiled"
    print(f"\nimage {containers.IMAGE} built in {seconds:.0f} s ({how}; log: {log})")
    return containers.IMAGE
