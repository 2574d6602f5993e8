"""Fixtures that start the real thing: `specproxy serve` with real llama-server backends."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
import urllib.request
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest

from tests.helpers import clean_env, free_port, remove_specproxy_env, wait_for

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
        "recording_proxy",
    }
)


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark every test that uses a real backend or model as integration."""
    for item in items:
        if INTEGRATION_FIXTURES & set(getattr(item, "fixturenames", ())):
            item.add_marker(pytest.mark.integration)


@pytest.fixture(autouse=True)
def _no_callers_specproxy_env(
    request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The fast tier runs as if no SPECPROXY_* variable were set, whatever the caller's shell has:
    the in-process proxy's Settings read them, and so do the CLI runs that inherit os.environ.
    (Module-scoped fixtures start before this one: tests/inprocess.py removes them itself.)

    Integration tests keep the caller's environment, for the few knobs of the harness itself
    (SPECPROXY_IMAGE_BASE, the llama-server of tests/test_mtp_model.py); the proxies they spawn
    get `clean_env()`, without SPECPROXY_* unless the test sets them.
    """
    if request.node.get_closest_marker("integration") is None:
        remove_specproxy_env(monkeypatch)


def get_json(url: str, timeout: float = 5) -> tuple[int, dict[str, object]]:
    """GET a JSON document, returning status and body even for error statuses."""
    try:
        with urllib.request.urlopen(url, timeout=timeout) as resp:
            return resp.status, json.load(resp)
    except urllib.error.HTTPError as err:
        return err.code, json.load(err)


def calibration(url: str) -> dict[str, Any]:
    """What the proxy at `url` says of its start-up calibration (GET /health)."""
    progress = get_json(f"{url}/health")[1].get("calibration")
    assert isinstance(progress, dict), "the proxy's /health says nothing of calibration"
    return progress


def wait_calibrated(url: str, timeout: float) -> dict[str, Any]:
    """Wait until the proxy at `url` finished its start-up calibration; what /health says."""
    wait_for(lambda: calibration(url)["state"] == "done", timeout, "calibration", interval=0.5)
    return calibration(url)


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


def openai_client(url: str, **kw: object) -> openai.OpenAI:
    """The official OpenAI client for a proxy at `url`, without retries: use it in a `with`."""
    options: dict[str, object] = {"api_key": "unused", "max_retries": 0, "timeout": 120, **kw}
    return openai.OpenAI(base_url=f"{url}/v1", **options)  # type: ignore[arg-type]


@pytest.fixture(scope="session")
def client(proxy: RunningProxy) -> Iterator[openai.OpenAI]:
    """The official OpenAI client pointed at the proxy, closed at the end of the session."""
    with openai_client(proxy.url) as sdk:
        yield sdk


@pytest.fixture
async def async_client(proxy: RunningProxy) -> AsyncIterator[openai.AsyncOpenAI]:
    """The official async OpenAI client pointed at the proxy, closed after the test."""
    async with openai.AsyncOpenAI(
        base_url=f"{proxy.url}/v1", api_key="unused", max_retries=0, timeout=120
    ) as sdk:
        yield sdk


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
