"""What the load-test and session-benchmark tests share: locust's command line, a run's summary."""

from __future__ import annotations

import sys

from loadtests.measure import RunSummary

# Locust monkey-patches with gevent on import, so it only ever runs in a subprocess here.
LOCUST = [sys.executable, "-m", "locust", "-f", "loadtests/locustfile.py", "--headless"]


def run_summary(aggregate: float) -> RunSummary:
    """A clean run of 4 requests at `aggregate` tokens/s (per stream too)."""
    return RunSummary(
        requests=4,
        failures=0,
        cut=0,
        tokens=100,
        wall_s=1.0,
        aggregate_tps=aggregate,
        per_stream_tps=aggregate,
        ttft_p50_s=None,
        acceptance=None,
    )
