"""A running proxy's /metrics as numbers: sums by sample name, and waiting for idle backends."""

from __future__ import annotations

import time
import urllib.request

from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import wait_for
from tests.subprocess_proxy import RunningProxy


def scrape(proxy: RunningProxy) -> dict[str, float]:
    """The proxy's /metrics as {sample name: sum over its label sets} plus `name{k=v}` sums."""
    with urllib.request.urlopen(f"{proxy.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    sums: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for s in family.samples:
            for key in [s.name, *(f"{s.name}{{{k}={v}}}" for k, v in s.labels.items())]:
                sums[key] = sums.get(key, 0.0) + s.value
    return sums


def wait_quiet(proxy: RunningProxy, timeout: float = 240) -> None:
    """Until nothing runs on any backend for 2 s (start-up calibration included)."""
    quiet_since = [time.monotonic()]

    def settled() -> bool:
        now = scrape(proxy)
        busy = now.get("specproxy_in_flight_requests", 0) + now.get(
            "llamacpp_requests_processing", 0
        )
        if busy:
            quiet_since[0] = time.monotonic()
        return time.monotonic() - quiet_since[0] >= 2

    wait_for(settled, timeout, "the backends to go quiet", interval=0.2)
