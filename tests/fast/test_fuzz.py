"""The proxy's API fuzzed in-process, in front of llama-server stubs: 10,000 cases of
tests/fuzz_cases.py, no 5xx, an error body with each 4xx, the proxy up and nothing busy after."""

from __future__ import annotations

import logging
import os
from collections import Counter
from collections.abc import AsyncIterator, Iterator
from contextlib import contextmanager
from typing import Any

import pytest
import structlog

from tests.fuzz_cases import JSON, PATHS, case, failure, judged, verdict
from tests.inprocess import FastProxy, fast_proxy

# 10,000 cases over every surface, chat's path twice as often as the others. The run is CPU
# (two aiohttp round trips for a case the proxy accepts, one for a refused one) and in one
# process: worker processes, each with its own proxy, were no faster on the 2-core machines.
IN_PROCESS_CASES = int(os.environ.get("FUZZ_CASES", "10010"))
BACKENDS: dict[str, dict[str, Any]] = {"plain": {}, "draft": {}, "ngram": {"kind": "ngram"}}
ALIASES: dict[str, str | None] = {
    "gpt-4o-mini": "plain",
    "claude-*": "auto",
    "qwen2.5-coder:*": "auto-code",
    "gpt-*": None,
}


@contextmanager
def request_logs_dropped() -> Iterator[None]:
    """structlog below warnings dropped for the block: 10,000 request lines cost more than the
    requests, and the fuzz reads none of them."""
    before = structlog.get_config()
    structlog.configure(wrapper_class=structlog.make_filtering_bound_logger(logging.WARNING))
    try:
        yield
    finally:
        structlog.configure(**before)


@pytest.fixture(scope="module")
async def stubbed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FastProxy]:
    """The proxy in front of stubs named as the session proxy's backends, with its aliases;
    health and load polled seldom, as they are not what is fuzzed."""
    async with fast_proxy(
        tmp_path_factory.mktemp("fuzz"), BACKENDS, model_aliases=ALIASES,
        health_interval_s=5, load_interval_s=5,
    ) as running:  # fmt: skip
        yield running


async def test_fuzzed_requests_never_5xx_in_process(stubbed: FastProxy) -> None:
    statuses: Counter[str] = Counter()
    failures: list[str] = []
    paths = [*PATHS, "/v1/chat/completions"]
    with request_logs_dropped():
        for i in range(IN_PROCESS_CASES):
            c = case(i, paths=paths)
            resp = await stubbed.http.post(c.path, data=c.data, headers=JSON)
            body = await resp.read()
            statuses[f"{c.path} {resp.status}"] += 1
            if problem := judged(c, resp.status, body):
                failures.append(failure(c, problem, body))
    verdict(statuses, failures, IN_PROCESS_CASES)
    served = sum(n for key, n in statuses.items() if key.endswith(" 200"))
    assert served > IN_PROCESS_CASES // 5, f"only {served} cases were served: fuzz nearer"


async def test_after_fuzzing_in_process_the_proxy_is_up_and_nothing_is_busy(
    stubbed: FastProxy,
) -> None:
    health = await (await stubbed.http.get("/health")).json()
    assert health["status"] == "ok"
    assert all(b["in_flight"] == 0 for b in health["backends"].values()), health
    assert all(stub.processing == 0 for stub in stubbed.doubles.values())
