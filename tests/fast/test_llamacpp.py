"""llama.cpp's timings and metrics, parsed in one place."""

from __future__ import annotations

import pytest

from proxy.backend_config import BackendConfig
from proxy.llamacpp import Timings, metric_value

REAL = {  # a llama-server b11434 answer's timings, with drafts
    "cache_n": 3,
    "prompt_n": 41,
    "prompt_ms": 120.5,
    "prompt_per_token_ms": 2.9,
    "prompt_per_second": 340.2,
    "predicted_n": 64,
    "predicted_ms": 1600.0,
    "predicted_per_token_ms": 25.0,
    "predicted_per_second": 40.0,
    "draft_n": 30,
    "draft_n_accepted": 24,
}


def test_timings_are_parsed_once_with_their_derived_values() -> None:
    t = Timings.parse(REAL)
    assert (t.predicted_n, t.tokens_per_s, t.prompt_n, t.cache_n) == (64, 40.0, 41, 3)
    assert t.acceptance == pytest.approx(0.8) and t.prompt_s == pytest.approx(0.1205)
    assert t.measured


@pytest.mark.parametrize(
    "raw", [None, [], "x", {}, {"predicted_per_second": "fast"}, {"predicted_n": float("nan")}]
)
def test_missing_or_malformed_timings_read_as_nothing_measured(raw: object) -> None:
    t = Timings.parse(raw)
    assert not t.measured and t.acceptance is None and t.predicted_n == 0


def test_no_drafts_means_no_acceptance() -> None:
    plain = {k: v for k, v in REAL.items() if not k.startswith("draft")}
    assert Timings.parse(plain).acceptance is None


def test_metric_values_come_from_the_prometheus_parser() -> None:
    text = (
        "# TYPE llamacpp:spec_decode_num_draft_tokens_total counter\n"
        "llamacpp:spec_decode_num_draft_tokens_total 87\n"
        "# TYPE llamacpp_requests_processing gauge\n"
        'llamacpp_requests_processing{backend="plain"} 0\n'
        'llamacpp_requests_processing{backend="ngram"} 2\n'
    )
    assert metric_value(text, "llamacpp:spec_decode_num_draft_tokens_total") == 87
    assert metric_value(text, "llamacpp_requests_processing") == 2
    assert metric_value(text, "llamacpp_requests_processing", backend="plain") == 0
    assert metric_value(text, "absent") == 0


@pytest.mark.parametrize("name", ["auto", "auto-code", "auto-fim", "auto-anything"])
def test_routing_ids_cannot_name_a_backend(name: str) -> None:
    with pytest.raises(ValueError, match="reserved for routing"):
        BackendConfig(name=name, model="m.gguf")
