"""Fixtures that start the real thing: `specproxy serve` on real llama-server backends, and the
container image. Only tests under tests/integration/ can use them."""

from __future__ import annotations

from collections.abc import AsyncIterator, Iterator

import openai
import pytest

from tests.helpers import ROOT, TEST_CONFIG
from tests.subprocess_proxy import RunningProxy, openai_client, running_proxy


@pytest.fixture(scope="session")
def proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """The proxy on the test config (SmolLM2 plain, self-drafting and n-gram), ready."""
    log_path = tmp_path_factory.mktemp("proxy") / "proxy.log"
    # No calibration: shared-proxy tests see only their own traffic on the backends.
    with running_proxy(TEST_CONFIG, log_path, SPECPROXY_CALIBRATION_REQUESTS="0") as running:
        yield running


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
