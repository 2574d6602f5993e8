"""The proxy's API fuzzed on real backends (the session proxy on SmolLM2): a few hundred cases of
tests/fuzz_cases.py, for what a stub cannot show, that nothing the proxy lets through makes
llama-server fail."""

from __future__ import annotations

import http.client
from collections import Counter

from tests.fuzz_cases import capped, case, failure, judged, verdict
from tests.helpers import get_json
from tests.subprocess_proxy import RunningProxy

REAL_CASES = 390  # 30 of each surface, at most 2 tokens each


# Bodies the proxy lets through and llama-server b11434 answers with a 500, found by this
# smoke: to be refused with a 400 by proxy/api/validation.py. Each is an expected failure
# (XFAIL, with the cases) until then; any other 5xx fails the test.
def post(proxy: RunningProxy, path: str, data: bytes) -> tuple[int, bytes]:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
    try:
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        return resp.status, resp.read()
    finally:
        conn.close()


def test_fuzzed_requests_never_5xx_on_llama_server(proxy: RunningProxy) -> None:
    statuses: Counter[str] = Counter()
    failures: list[str] = []
    for i in range(REAL_CASES):
        c = case(i)
        status, body = post(proxy, c.path, capped(c.data, c.path))
        statuses[f"{c.path} {status}"] += 1
        if problem := judged(c, status, body):
            failures.append(failure(c, problem, body))
    verdict(statuses, failures, REAL_CASES)


def test_after_fuzzing_llama_server_the_proxy_is_up_and_no_slot_is_busy(
    proxy: RunningProxy,
) -> None:
    status, health = get_json(f"{proxy.url}/health")
    assert status == 200 and health["status"] == "ok"
    for backend in health["backends"].values():
        assert backend["in_flight"] == 0
        _, slots = get_json(f"{backend['url']}/slots")
        assert not any(s["is_processing"] for s in slots)
