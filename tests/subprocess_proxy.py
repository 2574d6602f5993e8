"""The integration tier's harness: the proxy as a user runs it (proxy/testing/running_proxy.py,
shared with the scripts), waited for with the test's failure messages, reached with the official
clients. The fast tier's is tests/inprocess.py."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import openai

from proxy.testing import running_proxy as started
from proxy.testing.running_proxy import RunningProxy, calibration, start_proxy
from tests.helpers import patience, wait_for

__all__ = [
    "RunningProxy",
    "calibration",
    "openai_client",
    "proxy_on",
    "running_proxy",
    "start_proxy",
    "wait_calibrated",
]


@contextmanager
def running_proxy(
    config: Path | None, log_path: Path, ready_timeout: float = 300, **kw: Any
) -> Iterator[RunningProxy]:
    """proxy.testing.running_proxy.running_proxy, its ceiling on start-up stretched by
    patience() on a slow day."""
    with started.running_proxy(config, log_path, patience(ready_timeout), **kw) as running:
        yield running


@contextmanager
def proxy_on(config: str, workdir: Path) -> Iterator[RunningProxy]:
    """A proxy on a config given as YAML text, written into `workdir`, with no start-up
    calibration (the test sees its own requests alone)."""
    (workdir / "config.yaml").write_text(config)
    with running_proxy(
        workdir / "config.yaml", workdir / "proxy.log", SPECPROXY_CALIBRATION_REQUESTS="0"
    ) as running:
        yield running


def wait_calibrated(url: str, timeout: float) -> dict[str, Any]:
    """Wait until the proxy at `url` finished its start-up calibration; what /health says."""
    wait_for(lambda: calibration(url)["state"] == "done", timeout, "calibration", interval=0.5)
    return calibration(url)


def openai_client(url: str, api_key: str = "unused", timeout: float = 120) -> openai.OpenAI:
    """The official OpenAI client for a proxy at `url`, without retries: use it in a `with`."""
    return openai.OpenAI(base_url=f"{url}/v1", api_key=api_key, max_retries=0, timeout=timeout)
