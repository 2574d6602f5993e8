"""Hypothesis fuzzes the running proxy's API: no 5xx, the proxy stays up, no slot stays busy."""

from __future__ import annotations

import http.client
import json
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.conftest import RunningProxy, get_json

pytestmark = pytest.mark.integration

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20),
    lambda inner: (
        st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=10), inner, max_size=4)
    ),
    max_leaves=12,
)
content = st.one_of(
    st.text(max_size=40),
    st.none(),
    st.integers(),
    st.lists(
        st.fixed_dictionaries({"type": st.just("text"), "text": st.text(max_size=20)}), max_size=2
    ),
    json_values,
)
message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "system", "assistant", "tool", "robot", "", 3]),
        "content": content,
        "name": st.text(max_size=8),
    },
)
# Near-valid bodies reach the backends, so they must stay tiny: max_tokens at most 2.
chat_body = st.fixed_dictionaries(
    {"max_tokens": st.one_of(st.integers(-3, 2), st.sampled_from([0, 10**9, "2", 2.5]))},
    optional={
        "model": st.sampled_from(
            ["auto", "auto-code", "plain", "draft", "ngram", "gpt-4", "", 7, None]
        ),
        "messages": st.one_of(st.lists(message, max_size=3), json_values),
        "stream": st.one_of(st.booleans(), st.just("true"), st.none()),
        "temperature": st.one_of(st.floats(-1, 3), st.text(max_size=3), st.none()),
        "stream_options": st.one_of(st.just({"include_usage": True}), json_values),
        "n": st.sampled_from([1, 2, None]),
        "top_p": st.one_of(st.floats(0, 1), st.none()),
        "stop": st.one_of(st.text(max_size=5), st.lists(st.text(max_size=5), max_size=2)),
    },
)
completion_body = st.fixed_dictionaries(
    {"max_tokens": st.integers(1, 2)},
    optional={
        "prompt": st.one_of(st.text(max_size=30), json_values),
        "model": st.sampled_from(["auto", "plain", 5]),
    },
)


def post(proxy: RunningProxy, path: str, data: bytes) -> int:
    conn = http.client.HTTPConnection("127.0.0.1", proxy.port, timeout=60)
    try:
        conn.request("POST", path, data, {"Content-Type": "application/json"})
        resp = conn.getresponse()
        body = resp.read()
        if resp.status >= 400:
            assert "error" in json.loads(body), body[:200]
        return resp.status
    finally:
        conn.close()


def assert_idle(proxy: RunningProxy) -> None:
    status, health = get_json(f"{proxy.url}/health")
    assert status == 200 and health["status"] == "ok"
    for backend in health["backends"].values():  # type: ignore[union-attr]
        assert backend["in_flight"] == 0
        _, slots = get_json(f"{backend['url']}/slots")
        assert not any(s["is_processing"] for s in slots)  # type: ignore[union-attr]


FUZZ = settings(max_examples=1500, deadline=None, suppress_health_check=list(HealthCheck))


@FUZZ
@given(body=chat_body)
def test_fuzzed_chat_bodies_never_5xx(proxy: RunningProxy, body: dict[str, Any]) -> None:
    assert post(proxy, "/v1/chat/completions", json.dumps(body).encode()) < 500


@settings(max_examples=500, deadline=None, suppress_health_check=list(HealthCheck))
@given(raw=st.one_of(st.binary(max_size=200), json_values.map(lambda v: json.dumps(v).encode())))
def test_fuzzed_raw_bytes_never_5xx(proxy: RunningProxy, raw: bytes) -> None:
    assert post(proxy, "/v1/chat/completions", raw) < 500


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck))
@given(body=completion_body)
def test_fuzzed_completion_bodies_never_5xx(proxy: RunningProxy, body: dict[str, Any]) -> None:
    assert post(proxy, "/v1/completions", json.dumps(body).encode()) < 500


small = st.integers(1, 2)
anthropic_message = st.fixed_dictionaries(
    {},
    optional={
        "role": st.sampled_from(["user", "assistant", "system", "", 3]),
        "content": st.one_of(
            st.text(max_size=30),
            st.lists(
                st.fixed_dictionaries(
                    {"type": st.sampled_from(["text", "image", "tool_result", "bogus"])},
                    optional={"text": st.text(max_size=20), "content": json_values},
                ),
                max_size=2,
            ),
            json_values,
        ),
    },
)
maybe_model = st.sampled_from(["auto", "plain", "claude-x", "gpt-9", 5])
# Every body that could generate carries a tiny token limit, so none runs long on a backend.
SURFACE_BODIES = {
    "/v1/responses": st.fixed_dictionaries(
        {"max_output_tokens": small},
        optional={
            "input": st.one_of(st.text(max_size=30), st.lists(message, max_size=2), json_values),
            "instructions": st.one_of(st.text(max_size=10), json_values),
            "model": maybe_model,
            "stream": st.booleans(),
            "previous_response_id": st.text(max_size=4),
        },
    ),
    "/v1/messages": st.fixed_dictionaries(
        {"max_tokens": small},
        optional={
            "messages": st.one_of(st.lists(anthropic_message, max_size=3), json_values),
            "system": st.one_of(st.text(max_size=10), json_values),
            "model": maybe_model,
            "stream": st.booleans(),
        },
    ),
    "/completion": st.fixed_dictionaries(
        {"n_predict": small},
        optional={"prompt": st.one_of(st.text(max_size=30), json_values), "stream": st.booleans()},
    ),
    "/infill": st.fixed_dictionaries(
        {"n_predict": small},
        optional={
            "input_prefix": st.one_of(st.text(max_size=20), json_values),
            "input_suffix": st.one_of(st.text(max_size=20), json_values),
            "input_extra": json_values,
        },
    ),
    "/tokenize": st.fixed_dictionaries({}, optional={"content": json_values, "model": maybe_model}),
    "/detokenize": st.fixed_dictionaries({}, optional={"tokens": json_values}),
    "/apply-template": st.fixed_dictionaries(
        {}, optional={"messages": st.one_of(st.lists(message, max_size=2), json_values)}
    ),
    "/v1/embeddings": st.fixed_dictionaries({}, optional={"input": json_values}),
    "/v1/chat/completions/input_tokens": st.fixed_dictionaries(
        {}, optional={"messages": st.one_of(st.lists(message, max_size=2), json_values)}
    ),
    "/v1/responses/input_tokens": st.fixed_dictionaries(
        {}, optional={"input": st.one_of(st.text(max_size=10), json_values)}
    ),
    "/v1/messages/count_tokens": st.fixed_dictionaries(
        {}, optional={"messages": st.one_of(st.lists(anthropic_message, max_size=2), json_values)}
    ),
}
# What the test backends answer for a well-formed request: SmolLM2 has no FIM tokens, and they
# run without --embeddings (llama-server's own 501s, relayed).
NOT_SUPPORTED = {"/infill", "/v1/embeddings"}


@settings(max_examples=1200, deadline=None, suppress_health_check=list(HealthCheck))
@given(data=st.data())
def test_fuzzed_bodies_on_every_other_surface_never_5xx(
    proxy: RunningProxy, data: st.DataObject
) -> None:
    path = data.draw(st.sampled_from(sorted(SURFACE_BODIES)))
    body = data.draw(st.one_of(SURFACE_BODIES[path], json_values))
    status = post(proxy, path, json.dumps(body).encode())
    assert status < 500 or (status == 501 and path in NOT_SUPPORTED), (path, body, status)


def test_after_fuzzing_the_proxy_is_up_and_no_backend_is_busy(proxy: RunningProxy) -> None:
    assert_idle(proxy)
