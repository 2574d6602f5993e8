"""Requests the proxy answers itself, in each API's own error shape: 400 for a bad body, 404 for an
unknown model or path, 413 for an oversize body (fast tier).

None of these reaches a backend, so they run against the proxy in-process in front of
llama-server stubs named as the integration tier's backends (tests/configs/test.yaml), with the
official SDKs where a client would see them.
"""

from __future__ import annotations

import io
import json
from collections.abc import AsyncIterator
from typing import Any

import anthropic
import openai
import pytest

from tests.inprocess import FastProxy, fast_proxy
from tests.messages import anthropic_messages, openai_messages

HELLO = openai_messages("Say hello in five words.")
# The test config's backends and aliases (tests/configs/test.yaml).
BACKENDS: dict[str, dict[str, Any]] = {"plain": {}, "draft": {}, "ngram": {"kind": "ngram"}}
ALIASES: dict[str, str | None] = {
    "gpt-4o-mini": "plain",
    "claude-*": "auto",
    "qwen2.5-coder:*": "auto-code",
    "gpt-*": None,
}


@pytest.fixture(scope="module")
async def stubbed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FastProxy]:
    async with fast_proxy(
        tmp_path_factory.mktemp("validation"), BACKENDS, model_aliases=ALIASES
    ) as running:
        yield running


def sent(proxy: FastProxy) -> int:
    """How many requests the stubs have been sent: a refused request adds none."""
    return sum(len(stub.received) for stub in proxy.doubles.values())


async def post(proxy: FastProxy, path: str, data: bytes | io.BytesIO) -> tuple[int, dict[str, Any]]:
    resp = await proxy.http.post(path, data=data, headers={"Content-Type": "application/json"})
    body: dict[str, Any] = await resp.json(content_type=None)
    return resp.status, body


# ------------------------------------------------------------------------------- OpenAI API


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"messages": []}, "messages"),
        ({"messages": "hi"}, "messages"),
        ({"messages": [{"role": "wizard", "content": "x"}]}, "messages[0].role"),
        ({"messages": HELLO, "max_tokens": -5}, "max_tokens"),
        ({"messages": HELLO, "max_tokens": "ten"}, "max_tokens"),
        ({"messages": HELLO, "stream": "yes"}, "stream"),
        ({"messages": HELLO, "model": 7}, "model"),
        # Shapes llama-server answers with a 500 (the real-backend fuzz found them).
        ({"messages": HELLO, "tools": [{"type": "function", "function": 3}]}, "tools[0].function"),
        ({"messages": HELLO, "tools": [{"type": "function", "function": {}}]}, "tools[0].function"),
        (
            {"messages": [*HELLO, {"role": "assistant", "tool_calls": [{"function": {}}]}]},
            "messages[1].tool_calls[0].function",
        ),
    ],
)
async def test_bad_requests_are_400_in_openai_format(
    stubbed: FastProxy, body: dict[str, object], param: str
) -> None:
    before = sent(stubbed)
    with pytest.raises(openai.BadRequestError) as exc:
        await stubbed.openai().post("/chat/completions", body=body, cast_to=object)
    assert exc.value.status_code == 400
    error = exc.value.body
    assert isinstance(error, dict) and error["param"] == param and error["message"]
    assert sent(stubbed) == before


async def test_n_greater_than_one_is_refused(stubbed: FastProxy) -> None:
    with pytest.raises(openai.BadRequestError) as exc:
        await stubbed.openai().chat.completions.create(model="plain", messages=HELLO, n=2)
    assert exc.value.code == "unsupported"


async def test_malformed_json_and_bad_utf8(stubbed: FastProxy) -> None:
    status, body = await post(stubbed, "/v1/chat/completions", b'{"messages": [')
    assert status == 400 and body["error"]["code"] == "invalid_json"
    status, body = await post(stubbed, "/v1/chat/completions", b'{"messages": "\xff\xfe"}')
    assert status == 400 and body["error"]["code"] == "invalid_encoding"


@pytest.mark.parametrize("model", ["gpt-9", "gtp-4o"])
async def test_unknown_model_is_404_in_openai_format_listing_the_ids(
    stubbed: FastProxy, model: str
) -> None:
    with pytest.raises(openai.NotFoundError) as exc:
        await stubbed.openai().chat.completions.create(model=model, messages=HELLO, max_tokens=4)
    assert exc.value.code == "model_not_found"
    assert "auto" in exc.value.message and "plain" in exc.value.message


async def test_unknown_path_is_404_in_openai_format(stubbed: FastProxy) -> None:
    resp = await stubbed.http.get("/v1/engines")
    assert resp.status == 404 and "error" in await resp.json()


async def test_oversize_body_is_413_in_openai_format(stubbed: FastProxy) -> None:
    # Beyond the default max_body_bytes (8 MiB): answered, not a dropped connection.
    big = json.dumps({"messages": [{"role": "user", "content": "x" * (9 * 1024 * 1024)}]})
    status, body = await post(stubbed, "/v1/chat/completions", io.BytesIO(big.encode()))
    assert status == 413
    assert body["error"]["type"] == "invalid_request_error"


async def test_responses_errors_are_openai_errors(stubbed: FastProxy) -> None:
    client = stubbed.openai()
    with pytest.raises(openai.NotFoundError) as exc:
        await client.responses.create(model="gpt-9", input="hi")
    assert exc.value.code == "model_not_found"
    with pytest.raises(openai.BadRequestError) as bad:
        await client.responses.create(model="auto", input="hi", previous_response_id="resp_1")
    assert "whole conversation" in bad.value.message


async def test_restarting_an_unknown_backend_is_404_naming_the_backends(
    stubbed: FastProxy,
) -> None:
    status, body = await post(stubbed, "/admin/backends/nope/restart", b"")
    assert status == 404 and "the backends are" in body["error"]["message"]


# ------------------------------------------------------------------- Anthropic Messages API


async def test_messages_errors_are_in_anthropics_shape(stubbed: FastProxy) -> None:
    claude = stubbed.anthropic()
    with pytest.raises(anthropic.NotFoundError) as missing:
        await claude.messages.create(
            model="gpt-9", max_tokens=8, messages=anthropic_messages("Say hello in five words.")
        )
    body = missing.value.body
    assert isinstance(body, dict) and body["type"] == "error"
    assert body["error"]["type"] == "not_found_error"
    assert "model_aliases" in body["error"]["message"]
    with pytest.raises(anthropic.BadRequestError) as bad:
        await claude.messages.create(model="claude-x", max_tokens=8, messages=[])
    body = bad.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
    for path in ("/v1/messages", "/v1/messages/count_tokens"):
        status, error = await post(stubbed, path, b'{"messages": [')
        assert status == 400 and error["type"] == "error", error
        assert error["error"]["type"] == "invalid_request_error" and error["error"]["message"]


# ------------------------------------------------------------- llama.cpp's own surfaces


async def test_infill_needs_prefix_and_suffix(stubbed: FastProxy) -> None:
    status, error = await post(stubbed, "/infill", b'{"input_prefix": "x = "}')
    assert status == 400 and error["error"]["param"] == "input_suffix"


async def test_passthrough_bad_input_and_unknown_model(stubbed: FastProxy) -> None:
    status, error = await post(stubbed, "/detokenize", b'{"tokens": ["a"]}')
    assert status == 400 and error["error"]["param"] == "tokens"
    status, error = await post(stubbed, "/tokenize", b'{"content": "x", "model": "gpt-9"}')
    assert status == 404 and error["error"]["code"] == "model_not_found"


@pytest.mark.parametrize(
    ("body", "param"),
    [
        ({"input": "hi", "tools": [{"type": "function", "parameters": {}}]}, "tools[0].name"),
        (
            {"input": [{"role": "user", "content": [{"type": "input_text", "text": 5}]}]},
            "input[0].content[0].text",
        ),
    ],
)
async def test_responses_shapes_llama_server_fails_on_are_400(
    stubbed: FastProxy, body: dict[str, object], param: str
) -> None:
    before = sent(stubbed)
    resp = await stubbed.http.post("/v1/responses", json={"model": "plain", **body})
    error = (await resp.json())["error"]
    assert resp.status == 400 and error["param"] == param, error
    assert sent(stubbed) == before


async def test_tools_real_agents_send_still_pass(stubbed: FastProxy) -> None:
    tool = {"type": "function", "function": {"name": "read", "parameters": {"type": "object"}}}
    call = {"id": "c1", "type": "function", "function": {"name": "read", "arguments": "{}"}}
    messages = [
        *HELLO,
        {"role": "assistant", "content": None, "tool_calls": [call]},
        {"role": "tool", "tool_call_id": "c1", "content": "text"},
    ]
    chat = await stubbed.http.post(
        "/v1/chat/completions",
        json={"model": "plain", "messages": messages, "tools": [tool], "max_tokens": 4},
    )
    assert chat.status == 200, await chat.text()
    responses = await stubbed.http.post(
        "/v1/responses",
        json={
            "model": "plain",
            "input": [{"role": "user", "content": [{"type": "input_text", "text": "hi"}]}],
            "tools": [
                {"type": "function", "name": "shell", "parameters": {}},
                {"type": "web_search"},
            ],
        },
    )
    assert responses.status == 200, await responses.text()


# ------------------------------------------------------------------ a client's speculation


@pytest.mark.parametrize(
    ("model", "fields", "param", "says"),
    [
        ("auto", {"speculative.n_max": 0}, "speculative.n_max", "with auto the proxy chooses"),
        ("claude-haiku", {"speculative.types": ["ngram-mod"]}, "speculative.types", "pin"),
        ("plain", {"speculative.p_min": 0.5}, "speculative.p_min", "not supported"),
        # The stubs stand where a llama-server of another build would: it ignores the fields.
        ("draft", {"speculative.n_max": 2}, "speculative.n_max", "did not build"),
    ],
)
async def test_a_clients_speculation_settings_are_refused_where_they_cannot_hold(
    stubbed: FastProxy, model: str, fields: dict[str, object], param: str, says: str
) -> None:
    before = sent(stubbed)
    body = {"model": model, "messages": HELLO, **fields}
    status, error = await post(stubbed, "/v1/chat/completions", json.dumps(body).encode())
    assert status == 400
    assert error["error"]["param"] == param and says in error["error"]["message"]
    assert sent(stubbed) == before


async def test_a_clients_speculation_on_auto_is_an_anthropic_error_on_messages(
    stubbed: FastProxy,
) -> None:
    with pytest.raises(anthropic.BadRequestError) as exc:
        await stubbed.anthropic().messages.create(
            model="claude-sonnet-4",
            max_tokens=8,
            messages=[{"role": "user", "content": "hi"}],
            extra_body={"speculative.n_max": 0},
        )
    body = exc.value.body
    assert isinstance(body, dict) and body["error"]["type"] == "invalid_request_error"
    assert "speculative.n_max" in exc.value.message


async def test_no_speculation_field_travels_unless_a_client_set_one(stubbed: FastProxy) -> None:
    await stubbed.openai().chat.completions.create(model="plain", messages=HELLO, max_tokens=4)
    received = stubbed.doubles["plain"].received[-1]
    assert not [k for k in received if k.startswith("speculative.")]
