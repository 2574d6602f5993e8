"""Agent sessions on real backends: turns stay where their prompt is cached (a busy machine's
samples: tests/integration/test_contended_samples.py)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import pytest
import requests

from tests.helpers import ROOT, get_json
from tests.subprocess_proxy import RunningProxy, running_proxy, wait_calibrated

TEST_CONFIG = ROOT / "tests" / "configs" / "test.yaml"
# An agent's system prompt, in the shape docs/agents.md shows (rules, then tools), cut to fit the
# test model's 2 k context with room for three turns.
SYSTEM = "\n".join(
    [
        "You are a coding agent working in the user's repository.",
        "Read a file before you change it. Keep changes minimal and in the existing style.",
        "Use the tools to read, search and edit files; never guess a file's contents.",
        "When a command fails, read its output and fix the cause before trying again.",
        "Answer briefly; show code only through the edit tools.",
    ]
    * 8
)
TOOLS = [
    {
        "type": "function",
        "function": {
            "name": name,
            "description": description,
            "parameters": {
                "type": "object",
                "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
                "required": ["path"],
            },
        },
    }
    for name, description in (
        ("read_file", "Read a file of the repository and return its contents."),
        ("write_file", "Replace a file's whole contents."),
    )
]
FILE = "\n".join(f"def step_{i}(x):\n    return x + {i}\n" for i in range(12))


def chat(
    proxy: RunningProxy, messages: list[dict[str, object]], **extra: object
) -> requests.Response:
    body = {"model": "auto", "messages": messages, "tools": TOOLS, "max_tokens": 24, **extra}
    body["temperature"] = 0
    resp = requests.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=120)
    assert resp.status_code == 200, resp.text
    return resp


def log_lines(proxy: RunningProxy) -> list[dict[str, Any]]:
    lines = [json.loads(x) for x in proxy.log_path.read_text().splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("event") == "request" and x.get("endpoint") == "chat"]


@pytest.fixture(scope="module")
def calibrated(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    log = tmp_path_factory.mktemp("sessions") / "proxy.log"
    with running_proxy(
        TEST_CONFIG,
        log,
        SPECPROXY_EXPLORE_SHARE="0",
        SPECPROXY_CALIBRATION_REQUESTS="1",
        SPECPROXY_CALIBRATION_PROMPTS="1",
        # A speed to route by needs a few tokens, not the default's 96 and 256 per request.
        SPECPROXY_CALIBRATION_MAX_TOKENS="16",
        SPECPROXY_CALIBRATION_ECHO_TOKENS="16",
    ) as running:
        wait_calibrated(running.url, 300)
        yield running


def test_a_sessions_turns_stay_on_the_backend_that_caches_their_prompt(
    calibrated: RunningProxy,
) -> None:
    messages: list[dict[str, object]] = [
        {"role": "system", "content": SYSTEM},
        {"role": "user", "content": "Rename step_3 to advance in steps.py."},
    ]
    backends, cached = [], []
    for turn in range(3):
        resp = chat(calibrated, messages)
        backends.append(resp.headers["X-Specproxy-Backend"])
        answer = resp.json()
        cached.append(answer["timings"]["cache_n"])
        reply = answer["choices"][0]["message"]
        messages.append({k: v for k, v in reply.items() if v is not None})
        # The tool result the agent sends back: the file for the first call, then "ok".
        messages.append({"role": "tool", "tool_call_id": f"call_{turn}", "content": FILE})
        if not reply.get("tool_calls"):
            messages[-1] = {"role": "user", "content": f"Go on (turn {turn})."}
    assert len(set(backends)) == 1, backends
    # Every later turn found its whole earlier prompt in the slot: most of it.
    lines = log_lines(calibrated)[-3:]
    # `affinity` where the held prompt decided; where the backend holding it would be the best
    # with nothing cached too, the rule that made it best names it.
    assert {x["route"] for x in lines[1:]} <= {"affinity", "fastest", "within_margin"}, lines
    for line in lines[1:]:
        prompt = line["prompt_tokens"]
        assert isinstance(prompt, int) and cached[lines.index(line)] >= prompt * 0.6, lines
        # The router's expectation of the cache, beside what llama-server reported.
        assert line["expected_cached_tokens"] <= line["cached_tokens"] + 64
    status, _ = get_json(f"{calibrated.url}/health")
    assert status == 200
    metrics = requests.get(f"{calibrated.url}/metrics", timeout=10).text
    saved = [
        float(x.split()[-1])
        for x in metrics.splitlines()
        if x.startswith("specproxy_cached_prompt_tokens_total") and f'backend="{backends[0]}"' in x
    ]
    assert sum(saved) >= sum(cached[1:])
