"""deploy/compose.yaml with podman-compose: the proxy image and Prometheus scraping it.

Grafana has no image source on the CI machines (no registry, no Debian package), so its service is
checked only as configuration, in tests/fast/test_compose.py.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import urllib.parse
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import yaml

from proxy.config import default_cache_dir
from proxy.provision.models import CATALOG, ensure_catalog_model
from tests.containers import BUILD_TIMEOUT_S, build, podman_env
from tests.helpers import ROOT, free_port, get_json, wait_for

DEPLOY = ROOT / "deploy"
PROMETHEUS_IMAGE = "localhost/prometheus:debian"
MODEL = CATALOG["smollm2-135m"]


class Stack:
    """A podman-compose project made of deploy/compose.yaml and a test override."""

    def __init__(self, project: str, files: list[Path], env: dict[str, str]) -> None:
        self.project = project
        self.files = files
        self.env = env

    def compose(self, *args: str, timeout: float = 300) -> subprocess.CompletedProcess[str]:
        argv = [self.executable(), "-p", self.project]
        for f in self.files:
            argv += ["-f", str(f)]
        result = subprocess.run(
            [*argv, *args], env=self.env, capture_output=True, text=True, timeout=timeout
        )
        assert result.returncode == 0, f"{args}:\n{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        return result

    @staticmethod
    def executable() -> str:
        # The venv's script first: `.venv/bin/pytest` runs without the venv on PATH.
        beside = Path(sys.executable).parent / "podman-compose"
        found = str(beside) if beside.is_file() else shutil.which("podman-compose")
        if found is None:
            pytest.skip("podman-compose not installed: pip install -e '.[dev]'")
        return found


@pytest.fixture(scope="module")
def stack(specproxy_image: str, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Stack]:
    """proxy + prometheus from deploy/compose.yaml: test ports, SmolLM2, Debian's Prometheus."""
    tmp = tmp_path_factory.mktemp("compose")
    base = os.environ.get("SPECPROXY_IMAGE_BASE", "localhost/debian:bookworm")
    build(
        PROMETHEUS_IMAGE, DEPLOY / "prometheus.Containerfile", "--build-arg", f"BASE={base}",
        log=tmp / "prometheus-build.log",
    )  # fmt: skip
    models = ensure_catalog_model(
        MODEL.name, default_cache_dir() / "models", "https://pypi.org/simple"
    )
    proxy_port, prom_port = free_port(), free_port()
    (tmp / "config").mkdir()
    (tmp / "config" / "config.yaml").write_text(
        f"backends:\n  - {{name: solo, kind: plain, model: /models/{MODEL.filename}, "
        "threads: 1, ctx_size: 2048}\n"
    )
    prometheus = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    prometheus["global"]["scrape_interval"] = "1s"
    prometheus["global"]["scrape_timeout"] = "1s"
    prometheus["scrape_configs"][0]["static_configs"][0]["targets"] = [f"127.0.0.1:{proxy_port}"]
    (tmp / "prometheus.yml").write_text(yaml.safe_dump(prometheus))
    # Additions only (new mounts, more environment): the override merges into compose.yaml.
    (tmp / "override.yaml").write_text(
        textwrap.dedent(f"""\
            services:
              proxy:
                environment:
                  SPECPROXY_CONFIG: /etc/specproxy/config.yaml
                  SPECPROXY_CALIBRATION_REQUESTS: "0"
                volumes:
                  - {models.parent}:/models:ro
                  - {tmp / "config"}:/etc/specproxy:ro
            """)
    )
    env = {
        **podman_env(),
        "SPECPROXY_IMAGE": specproxy_image,
        "SPECPROXY_PORT": str(proxy_port),
        "PROMETHEUS_IMAGE": PROMETHEUS_IMAGE,
        "PROMETHEUS_PORT": str(prom_port),
        "PROMETHEUS_CONFIG": str(tmp / "prometheus.yml"),
    }
    running = Stack(
        f"specproxy-test-{os.getpid()}", [DEPLOY / "compose.yaml", tmp / "override.yaml"], env
    )
    running.compose("down", "-v", "-t", "5")
    running.compose("up", "-d", "--no-build", "proxy", "prometheus")
    running.env["proxy_url"] = f"http://127.0.0.1:{proxy_port}"
    running.env["prometheus_url"] = f"http://127.0.0.1:{prom_port}"
    try:
        yield running
    finally:
        running.compose("down", "-v", "-t", "30")


def poll(what: str, probe: Callable[[], object]) -> object:
    """probe()'s first truthy answer, asked every second for up to 5 minutes."""
    return wait_for(probe, 300, what, interval=1, ignore=(OSError,))


def query(prometheus_url: str, promql: str) -> list[dict[str, object]]:
    """An instant PromQL query's result vector."""
    status, body = get_json(
        f"{prometheus_url}/api/v1/query?query={urllib.parse.quote(promql)}", timeout=5
    )
    assert status == 200, body
    data = body["data"]
    assert isinstance(data, dict)
    result: list[dict[str, object]] = data["result"]
    return result


@pytest.mark.image
@pytest.mark.timeout(BUILD_TIMEOUT_S + 900)
def test_one_up_serves_and_prometheus_scrapes_the_proxy_and_its_backends(stack: Stack) -> None:
    proxy_url, prometheus_url = stack.env["proxy_url"], stack.env["prometheus_url"]
    poll("the proxy's /health", lambda: get_json(f"{proxy_url}/health", timeout=2)[0] == 200)
    up = poll(
        "Prometheus to scrape the proxy", lambda: query(prometheus_url, 'up{job="specproxy"} == 1')
    )
    print(f"\nup: {json.dumps(up)}")
    backends = poll(
        "llama-server metrics re-exported through the proxy",
        lambda: query(prometheus_url, 'count by (backend) ({__name__=~"llamacpp_.+"})'),
    )
    assert isinstance(backends, list) and backends[0]["metric"] == {"backend": "solo"}
    ps = subprocess.run(
        ["podman", "ps", "--filter", f"label=io.podman.compose.project={stack.project}",
         "--format", "{{.Names}} {{.Status}}"],
        env=podman_env(), capture_output=True, text=True, check=True,
    )  # fmt: skip
    print(ps.stdout)
    assert len(ps.stdout.splitlines()) == 2
