"""The container image: built from the Dockerfile, run with podman, used via the OpenAI client."""

from __future__ import annotations

import json
import os
import textwrap
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.config import default_cache_dir
from proxy.provision.models import CATALOG, ensure_catalog_model
from tests.containers import BUILD_TIMEOUT_S, podman
from tests.helpers import free_port, get_json, wait_for
from tests.subprocess_proxy import openai_client

pytestmark = [pytest.mark.image, pytest.mark.timeout(BUILD_TIMEOUT_S + 900)]

MODEL = CATALOG["smollm2-135m"]


def container_config(path: Path) -> Path:
    """One plain backend on the mounted SmolLM2 file: a local path needs no network at start."""
    path.write_text(
        textwrap.dedent(f"""\
            backends:
              - name: solo
                kind: plain
                model: /models/{MODEL.filename}
                threads: 1
                ctx_size: 2048
            """)
    )
    return path


class Container:
    """A running specproxy container on the host network."""

    def __init__(self, name: str, port: int) -> None:
        self.name = name
        self.port = port
        self.url = f"http://127.0.0.1:{port}"

    def state(self) -> dict[str, object]:
        out = podman("inspect", "--format", "{{json .State}}", self.name).stdout
        state: dict[str, object] = json.loads(out)
        return state

    def logs(self) -> str:
        result = podman("logs", self.name, check=False)
        return result.stdout + result.stderr

    def wait_ready(self, timeout: float = 300) -> None:
        def ready() -> bool:
            if not self.state().get("Running"):
                raise AssertionError(f"container exited:\n{self.logs()[-3000:]}")
            return get_json(f"{self.url}/health", timeout=2)[0] == 200

        wait_for(ready, timeout, lambda: f"the container:\n{self.logs()[-3000:]}", 0.5, (OSError,))

    def host_pids(self) -> list[int]:
        """Host pids of every process in the container (specproxy, tini, llama-server)."""
        out = podman("top", self.name, "hpid").stdout.split()[1:]
        return [int(p) for p in out if p.isdigit()]


@pytest.fixture(scope="module")
def container(
    specproxy_image: str, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Container]:
    """The image serving one SmolLM2 backend, models mounted read-only from the host cache."""
    models = ensure_catalog_model(
        MODEL.name, default_cache_dir() / "models", "https://pypi.org/simple"
    )
    config = container_config(tmp_path_factory.mktemp("container") / "config.yaml")
    running = Container(f"specproxy-test-{os.getpid()}", free_port())
    podman("rm", "-f", running.name, check=False)
    podman(
        "run", "-d", "--name", running.name, "--network", "host",
        "-v", f"{models.parent}:/models:ro", "-v", f"{config}:/etc/specproxy.yaml:ro",
        "-e", "SPECPROXY_CONFIG=/etc/specproxy.yaml",
        "-e", "SPECPROXY_HOST=127.0.0.1", "-e", f"SPECPROXY_PORT={running.port}",
        "-e", "SPECPROXY_LOG_FORMAT=json", "-e", "SPECPROXY_CALIBRATION_REQUESTS=0",
        specproxy_image,
    )  # fmt: skip
    try:
        running.wait_ready()
        yield running
    finally:
        podman("rm", "-f", "-t", "5", running.name, check=False)


def test_image_is_lean_and_runs_as_a_user(specproxy_image: str) -> None:
    inspect = json.loads(podman("image", "inspect", specproxy_image).stdout)[0]
    assert inspect["Config"]["User"] == "specproxy"
    assert "/health" in " ".join(inspect["Healthcheck"]["Test"])
    probe = (
        "import importlib.util as u, shutil; "
        "print([m for m in ('locust', 'gevent', 'matplotlib') if u.find_spec(m)], "
        "[t for t in ('cc', 'gcc', 'g++', 'cmake') if shutil.which(t)])"
    )
    out = podman(
        "run", "--rm", "--network", "host", "--entrypoint", "python", specproxy_image, "-c", probe
    ).stdout.strip()
    assert out == "[] []", f"serve-time image ships load-test packages or compilers: {out}"
    print(f"\nimage size: {inspect['Size'] / 1e6:.0f} MB")


def test_healthcheck_streams_and_metrics_through_the_container(container: Container) -> None:
    assert podman("healthcheck", "run", container.name, check=False).returncode == 0
    with openai_client(container.url) as client:
        stream = client.chat.completions.create(
            model="auto", messages=[{"role": "user", "content": "Say hello."}],
            max_tokens=16, stream=True,
        )  # fmt: skip
        pieces = [c.choices[0].delta.content or "" for c in stream if c.choices]
    assert "".join(pieces).strip(), "the stream carried text"
    with urllib.request.urlopen(f"{container.url}/metrics", timeout=10) as resp:
        metrics = resp.read().decode()
    assert "specproxy_requests_total" in metrics
    assert "llamacpp_" in metrics and 'backend="solo"' in metrics


def test_podman_stop_drains_the_stream_and_leaves_no_process(container: Container) -> None:
    pids = container.host_pids()
    assert len(pids) >= 3, "tini, specproxy and llama-server"
    client = openai_client(container.url)
    finish: list[str | None] = []

    def consume() -> None:
        stream = client.chat.completions.create(
            model="solo", messages=[{"role": "user", "content": "Count to 300."}],
            max_tokens=200, stream=True,
        )  # fmt: skip
        for chunk in stream:
            if chunk.choices:
                finish.append(chunk.choices[0].finish_reason)

    reader = threading.Thread(target=consume)
    with client:
        reader.start()
        started = lambda: len(finish) >= 3 or not reader.is_alive()  # noqa: E731
        wait_for(started, 120, "the stream's first chunks", interval=0.01)
        # -t 60: podman would SIGKILL after that; a clean exit (0, not 137) shows SIGTERM sufficed.
        podman("stop", "-t", "60", container.name, timeout=90)
        reader.join(60)
    assert finish and finish[-1] in ("length", "stop"), "the in-flight stream finished normally"
    state = container.state()
    assert state["ExitCode"] == 0, container.logs()[-3000:]
    alive = [p for p in pids if Path(f"/proc/{p}").exists()]
    assert not alive, f"processes left after podman stop: {alive}"
    events = [json.loads(x) for x in container.logs().splitlines() if x.startswith("{")]
    assert any(e.get("event") == "shutting down" for e in events)
