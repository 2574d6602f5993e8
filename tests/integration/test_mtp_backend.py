"""A real draft-mtp backend under the supervisor, answering through the proxy."""

from __future__ import annotations

import json
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest

from proxy.llamacpp import metric_value
from tests.helpers import ROOT, get_json
from tests.messages import openai_messages
from tests.subprocess_proxy import RunningProxy, openai_client, running_proxy

PROMPT = openai_messages("Tell me a long story.")


@pytest.fixture(scope="module")
def mtp_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    log = tmp_path_factory.mktemp("mtp") / "proxy.log"
    config = ROOT / "tests" / "configs" / "mtp.yaml"
    with running_proxy(config, log, SPECPROXY_CALIBRATION_REQUESTS="0") as running:
        yield running


def _timings(proxy: RunningProxy, model: str, stream: bool = False) -> dict[str, float]:
    with openai_client(proxy.url) as client:
        if not stream:
            raw = client.chat.completions.with_raw_response.create(
                model=model, messages=PROMPT, max_tokens=48, temperature=0
            )
            assert raw.headers["x-specproxy-backend"] == model
            return dict(json.loads(raw.text)["timings"])
        with client.chat.completions.with_streaming_response.create(
            model=model, messages=PROMPT, max_tokens=48, temperature=0, stream=True
        ) as resp:
            events = [json.loads(e[6:]) for e in resp.iter_lines() if e.startswith("data: {")]
    return dict(next(e["timings"] for e in reversed(events) if "timings" in e))


def test_mtp_backend_is_supervised_and_detected(mtp_proxy: RunningProxy) -> None:
    backends = mtp_proxy.health()["backends"]
    assert isinstance(backends, dict)
    assert backends["mtp"]["spec_type"] == "draft-mtp" and backends["mtp"]["pid"]
    log = Path(mtp_proxy.log_path).read_text()
    assert "--spec-type" in log and "draft-mtp" in log


@pytest.mark.parametrize("stream", [False, True])
def test_mtp_head_drafts_and_its_tokens_are_accepted(mtp_proxy: RunningProxy, stream: bool) -> None:
    timings = _timings(mtp_proxy, "mtp", stream)
    assert timings["draft_n"] > 0
    assert timings["draft_n_accepted"] / timings["draft_n"] > 0.9


def test_a_noisy_mtp_head_is_accepted_less(mtp_proxy: RunningProxy) -> None:
    timings = _timings(mtp_proxy, "mtp-noisy")
    assert timings["draft_n"] > 0
    assert timings["draft_n_accepted"] / timings["draft_n"] < 0.5


def test_plain_backend_on_the_same_model_does_not_draft(mtp_proxy: RunningProxy) -> None:
    assert "draft_n" not in _timings(mtp_proxy, "tiny-plain")


def _metric(text: str, name: str, backend: str) -> float:
    return metric_value(text, name, backend=backend)


def test_mtp_drafts_reach_the_scoreboard_and_metrics(mtp_proxy: RunningProxy) -> None:
    _timings(mtp_proxy, "mtp")
    rows = get_json(f"{mtp_proxy.url}/scoreboard")[1]["estimates"]
    mtp_rows = [r for r in rows if r["backend"] == "mtp"]
    assert mtp_rows and all(r["acceptance"] > 0.9 for r in mtp_rows)
    with urllib.request.urlopen(f"{mtp_proxy.url}/metrics", timeout=10) as resp:
        text = resp.read().decode()
    drafted = _metric(text, "specproxy_draft_tokens_total", "mtp")
    accepted = _metric(text, "specproxy_draft_tokens_accepted_total", "mtp")
    assert drafted > 0 and accepted / drafted > 0.9
    assert _metric(text, "llamacpp_spec_decode_num_draft_tokens_total", "mtp") == drafted
