"""API keys: every surface refuses a request without a right key with a 401 in its API's shape,
and accepts the official SDKs' ways of sending one (fast tier).

The proxy runs in-process in front of llama-server stubs, its keys read from a key file as
`api_keys_file` does in production. What only a real process shows (the key never in its log,
the wide-bind warning) is in tests/integration/test_security.py.
"""

from __future__ import annotations

from collections.abc import AsyncIterator

import anthropic
import openai
import pytest

from tests.inprocess import FastProxy, fast_proxy
from tests.messages import anthropic_messages, openai_messages

KEY = "sk-test-4f0c2b"
HI = openai_messages("hi")
CLAUDE_HI = anthropic_messages("hi")
SURFACES = ("/v1/responses", "/infill", "/completion", "/tokenize", "/apply-template")


@pytest.fixture(scope="module")
async def keyed(tmp_path_factory: pytest.TempPathFactory) -> AsyncIterator[FastProxy]:
    tmp = tmp_path_factory.mktemp("keys")
    keyfile = tmp / "keys"
    keyfile.write_text("sk-other\n" + KEY + "\n")
    async with fast_proxy(tmp, {"solo": {}}, api_keys_file=keyfile) as running:
        yield running


@pytest.mark.parametrize("key", ["none", "sk-wrong", KEY[:-1]])
async def test_requests_without_the_key_get_401(keyed: FastProxy, key: str) -> None:
    client = keyed.openai(api_key=key)
    before = len(keyed.doubles["solo"].received)
    with pytest.raises(openai.AuthenticationError) as exc:
        await client.chat.completions.create(model="solo", messages=HI, max_tokens=2)
    assert exc.value.code == "invalid_api_key"
    with pytest.raises(openai.AuthenticationError):
        await client.models.list()
    assert len(keyed.doubles["solo"].received) == before, "a refused request reached a backend"


async def test_requests_with_no_authorization_header_get_401(keyed: FastProxy) -> None:
    resp = await keyed.http.post("/v1/chat/completions", json={"messages": HI})
    assert resp.status == 401
    assert (await resp.json())["error"]["code"] == "invalid_api_key"


async def test_the_key_works_with_either_of_the_files_keys(keyed: FastProxy) -> None:
    for key in (KEY, "sk-other"):
        reply = await keyed.openai(api_key=key).chat.completions.create(
            model="solo",
            messages=HI,
            max_tokens=2,
        )
        assert reply.choices
    resp = await keyed.http.get("/health")
    assert resp.status == 200, "health stays open for load balancers"


async def test_anthropic_clients_send_the_key_as_x_api_key(keyed: FastProxy) -> None:
    good = keyed.anthropic(api_key=KEY)
    reply = await good.messages.create(model="solo", max_tokens=2, messages=CLAUDE_HI)
    assert reply.content and reply.usage.output_tokens > 0
    count = await good.messages.count_tokens(model="solo", messages=CLAUDE_HI)
    assert count.input_tokens > 0
    for key in ("sk-wrong", KEY[:-1]):
        with pytest.raises(anthropic.AuthenticationError) as exc:
            await keyed.anthropic(api_key=key).messages.create(
                model="solo",
                max_tokens=2,
                messages=CLAUDE_HI,
            )
        body = exc.value.body
        assert isinstance(body, dict) and body["type"] == "error"
        assert body["error"]["type"] == "authentication_error"
        assert "x-api-key" in body["error"]["message"]


@pytest.mark.parametrize("path", SURFACES)
async def test_every_surface_needs_the_key(keyed: FastProxy, path: str) -> None:
    resp = await keyed.http.post(path, data=b"{}")
    assert resp.status == 401, path
    assert (await resp.json())["error"]["code"] == "invalid_api_key"


async def test_the_key_opens_the_other_surfaces_too(keyed: FastProxy) -> None:
    client = keyed.openai(api_key=KEY)
    answer = await client.responses.create(model="solo", input="hi", max_output_tokens=2)
    assert answer.output
    resp = await keyed.http.post(
        "/tokenize", json={"content": "hello world"}, headers={"Authorization": f"Bearer {KEY}"}
    )
    assert resp.status == 200 and (await resp.json())["tokens"]
