"""Strategies sharing one engine: one llama-server serves plain, draft and n-gram decoding per
request, and a conversation that changes strategy between turns finds its prompt cached."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
import requests

from proxy.llamacpp import metric_values
from tests.helpers import ROOT
from tests.subprocess_proxy import RunningProxy, running_proxy

ENGINE_CONFIG = ROOT / "tests" / "configs" / "engine.yaml"
SOURCE = "\n".join(
    f"def step_{i}(state, value):\n    state.total += value * {i}\n    return state.total"
    for i in range(8)
)


@pytest.fixture(scope="module")
def engine_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """specproxy on the one-engine config, calibration off: only the test's requests run."""
    log = tmp_path_factory.mktemp("engine") / "proxy.log"
    with running_proxy(ENGINE_CONFIG, log, SPECPROXY_CALIBRATION_REQUESTS="0") as running:
        yield running


def chat(
    proxy: RunningProxy, model: str, messages: list[dict[str, str]], n: int = 48
) -> dict[str, Any]:
    body = {"model": model, "messages": messages, "max_tokens": n, "temperature": 0}
    resp = requests.post(f"{proxy.url}/v1/chat/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    assert resp.headers["X-Specproxy-Backend"] == model
    answer: dict[str, Any] = resp.json()
    return answer


def test_one_process_serves_every_strategy(engine_proxy: RunningProxy) -> None:
    backends = engine_proxy.health()["backends"]
    assert isinstance(backends, dict)
    assert {b["engine"] for b in backends.values()} == {"smollm2"}
    pids = {b["pid"] for b in backends.values()}
    assert len(pids) == 1 and None not in pids


def test_each_strategy_decodes_its_own_way(engine_proxy: RunningProxy) -> None:
    echo = [{"role": "user", "content": f"Repeat this code exactly:\n\n{SOURCE}\n"}]
    plain = chat(engine_proxy, "plain", echo)
    draft = chat(engine_proxy, "draft", echo)
    # ngram-mod learns from the requests it may draft for, and proposes 48 tokens or none: on
    # a second long answer it finds the first.
    chat(engine_proxy, "ngram", echo, n=128)
    ngram = chat(engine_proxy, "ngram", echo, n=128)
    assert not plain["timings"].get("draft_n")
    assert draft["timings"]["draft_n"] > 0
    assert ngram["timings"]["draft_n"] > 0
    # The same weights decode the same answer, drafted or not (temperature 0).
    assert plain["choices"][0]["message"]["content"] == draft["choices"][0]["message"]["content"]


def test_a_conversation_changing_strategy_keeps_its_prompt(engine_proxy: RunningProxy) -> None:
    rules = "\n".join(f"Rule {i}: keep change {i} minimal and run the tests." for i in range(100))
    messages = [{"role": "system", "content": f"You are a coding agent.\n{rules}"}]
    previous = 0
    for turn, model in enumerate(("plain", "ngram", "draft", "plain")):
        messages.append({"role": "user", "content": f"Question {turn}: what does step_{turn} do?"})
        timings = chat(engine_proxy, model, messages, n=8)["timings"]
        if turn:
            # Everything the previous turn processed is still there for this one.
            assert timings["cache_n"] >= 0.9 * previous, (model, timings)
        previous = timings["prompt_n"] + timings["cache_n"]
        messages.append({"role": "assistant", "content": f"Answer {turn}."})
    assert previous > 1000


def test_the_engines_own_counters_are_exported_once_under_its_name(
    engine_proxy: RunningProxy,
) -> None:
    text = requests.get(f"{engine_proxy.url}/metrics", timeout=30).text
    engine_series = metric_values(text, "llamacpp_tokens_predicted_total")
    assert [labels.get("engine") for labels, _ in engine_series] == ["smollm2"]
    assert all("backend" not in labels for labels, _ in engine_series)
    scraped = metric_values(text, "specproxy_backend_metrics_scrape_ok")
    assert {labels["backend"]: value for labels, value in scraped} == {
        "plain": 1.0,
        "draft": 1.0,
        "ngram": 1.0,
    }
    page = requests.get(f"{engine_proxy.url}/ui", timeout=30).text
    assert page.count("<td>smollm2</td>") == 3
