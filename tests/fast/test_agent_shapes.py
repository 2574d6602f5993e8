"""What coding agents send and expect, in the fast tier: their model names, shapes, stream ends
and prompt lengths (docs/agents.md). The real agents run in tests/integration/test_agents.py."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import aiohttp
import pytest

from proxy.api.anthropic import MessagesStreamFix
from proxy.api.openai_stream import OpenAIStreamEnd
from proxy.api.responses_stream import ResponsesStreamFix
from proxy.api.validation import check_messages, check_responses
from proxy.config import load_settings
from proxy.routing.aliases import ModelAliases
from proxy.testing.llama_double import Behaviour, start_double
from tests.agent_bodies import codex_responses_body
from tests.inprocess import proxy_in_front


@pytest.mark.parametrize(
    ("sent", "served_as"),
    [
        ("claude-opus-4-8", "auto"),  # Claude Code's default
        ("claude-haiku-4-5-20251001", "auto"),
        ("gpt-6.2-sol", "auto"),  # Codex CLI's default with a provider file and no model
        ("qwen3.5-plus", "auto"),  # Qwen Code's default with OpenAI auth and no -m
        ("gpt-4o", "auto"),  # what Continue's config examples name
        ("o4-mini", "auto"),
        ("gtp-4o", None),  # a typo still fails loudly (404 listing the ids)
        ("llama3", None),
    ],
)
def test_the_embedded_default_serves_the_names_agents_send(
    sent: str, served_as: str | None
) -> None:
    aliases = ModelAliases(load_settings().model_aliases)
    assert aliases.resolve(sent) == served_as


def test_claude_codes_body_shapes_are_accepted() -> None:
    body = {
        "model": "claude-opus-4-8",
        "max_tokens": 64000,
        "system": [
            {"type": "text", "text": "You are Claude Code.", "cache_control": {"type": "ephemeral"}}
        ],
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": "hi"}]},
            # Besides the top-level `system`, a system message inside `messages`.
            {"role": "system", "content": "Reminder: be brief."},
            {"role": "user", "content": "Create hello.py"},
        ],
        "thinking": {"type": "enabled", "budget_tokens": 1024},
        "context_management": {"edits": []},
        "output_config": {"format": {"type": "json_schema", "schema": {"type": "object"}}},
        "metadata": {"user_id": "u"},
        "stream": True,
    }
    assert check_messages(body) is body


def test_codexs_responses_body_is_accepted() -> None:
    body = codex_responses_body()
    assert check_responses(body) is body


def _events(raw: bytes) -> list[tuple[str | None, Any]]:
    """Each event's name and data: the data as JSON parsed (any shape), or "[DONE]"."""
    out: list[tuple[str | None, Any]] = []
    for event in raw.split(b"\n\n"):
        if not event.strip():
            continue
        name = None
        data: Any = None
        for line in event.split(b"\n"):
            if line.startswith(b"event: "):
                name = line[7:].decode()
            elif line.startswith(b"data: "):
                data = line[6:].decode()
                if data != "[DONE]":
                    data = json.loads(data)
        out.append((name, data))
    return out


def test_an_openai_stream_that_ends_with_an_error_gets_its_done() -> None:
    end = OpenAIStreamEnd()
    # llama-server's mid-stream error: the event, then the connection closes without [DONE].
    error = b'data: {"error":{"code":500,"message":"Context size has been exceeded."}}\n\n'
    assert end.feed(b'data: {"choices":[]}\n\n' + error) == b'data: {"choices":[]}\n\n' + error
    assert end.flush() == b"data: [DONE]\n\n"


def test_an_openai_stream_cut_short_gets_an_error_and_done() -> None:
    end = OpenAIStreamEnd()
    end.feed(b'data: {"choices":[{"delta":{"content":"he"}}]}\n\n')
    events = _events(end.flush())
    assert events[-1] == (None, "[DONE]")
    assert events[0][1]["error"]["code"] == "upstream_error"
    finished = OpenAIStreamEnd()
    finished.feed(b'data: {"choices":[]}\n\ndata: [DONE]\n\n')
    assert finished.flush() == b""


def test_a_responses_stream_that_fails_ends_with_response_failed() -> None:
    fix = ResponsesStreamFix()
    created = b'event: response.created\ndata: {"type":"response.created","response":{"id":"r1"}}'
    out = fix.feed(created + b"\n\n")
    # llama-server sends its error in chat's shape on the Responses path too.
    out += fix.feed(b'data: {"error":{"code":500,"message":"boom","type":"server_error"}}\n\n')
    out += fix.flush()
    events = _events(out)
    assert [name for name, _ in events] == ["response.created", "error", "response.failed"]
    failed = events[-1][1]
    assert isinstance(failed, dict) and failed["response"]["id"] == "r1"
    assert failed["response"]["error"]["message"] == "boom"
    assert [d["sequence_number"] for _, d in events] == [0, 1, 2]


def test_a_responses_stream_cut_short_ends_with_response_failed() -> None:
    fix = ResponsesStreamFix()
    out = fix.feed(b'event: response.created\ndata: {"type":"response.created","response":{}}\n\n')
    events = _events(out + fix.flush())
    assert events[-1][0] == "response.failed"
    done = ResponsesStreamFix()
    done.feed(b'event: response.completed\ndata: {"type":"response.completed","response":{}}\n\n')
    assert done.flush() == b""


def test_a_messages_stream_cut_short_ends_with_an_anthropic_error() -> None:
    fix = MessagesStreamFix("m")
    fix.feed(b'event: message_start\ndata: {"type":"message_start","message":{}}\n\n')
    events = _events(fix.flush())
    assert events == [
        (
            "error",
            {
                "type": "error",
                "error": {
                    "type": "api_error",
                    "message": "the backend ended the stream before message_stop",
                },
            },
        )
    ]


async def test_a_prompt_no_backend_holds_gets_one_clear_error_before_any_slot(
    tmp_path: Path,
) -> None:
    small, large = (
        await start_double(Behaviour(n_ctx=2048)),
        await start_double(Behaviour(n_ctx=8192)),
    )
    backends = [{"name": "small", "url": small.url}, {"name": "large", "url": large.url}]
    try:
        async with proxy_in_front(tmp_path, backends) as proxy:
            models = await (await proxy.http.get("/v1/models")).json()
            contexts = {m["id"]: m.get("context_length") for m in models["data"]}
            assert contexts["small"] == 2048 and contexts["auto"] == 8192
            health = await (await proxy.http.get("/health")).json()
            assert health["backends"]["small"]["n_ctx"] == 2048

            # 4,000 tokens by the doubles' count: fits only the large backend.
            medium = [{"role": "user", "content": "x" * 16_000}]
            for _ in range(3):
                resp = await proxy.http.post(
                    "/v1/chat/completions", json={"model": "auto", "messages": medium}
                )
                assert resp.status == 200 and resp.headers["X-Specproxy-Backend"] == "large"
            pinned = await proxy.http.post(
                "/v1/chat/completions", json={"model": "small", "messages": medium}
            )
            assert pinned.status == 400
            assert (await pinned.json())["error"]["code"] == "context_length_exceeded"

            # 10,000 tokens: fits nothing; one 400 with the counts, in the API's own shape.
            huge = [{"role": "user", "content": "x" * 40_000}]
            sent = len(small.received) + len(large.received)
            resp = await proxy.http.post(
                "/v1/chat/completions", json={"model": "auto", "messages": huge, "stream": True}
            )
            error = (await resp.json())["error"]
            assert resp.status == 400 and error["code"] == "context_length_exceeded"
            assert "10000 tokens > 8192" in error["message"]
            assert len(small.received) + len(large.received) == sent, "a slot was taken"

            # A short request is never counted.
            counted = len(large.counted) + len(small.counted)
            short = [{"role": "user", "content": "hi"}]
            resp = await proxy.http.post(
                "/v1/chat/completions", json={"model": "auto", "messages": short}
            )
            assert resp.status == 200 and len(large.counted) + len(small.counted) == counted
    finally:
        await small.stop()
        await large.stop()


async def test_head_slash_answers_without_a_key(tmp_path: Path) -> None:
    double = await start_double(Behaviour())
    try:
        async with proxy_in_front(
            tmp_path, [{"name": "plain", "url": double.url}], api_keys=["secret"]
        ) as proxy:
            resp = await proxy.http.head("/")
            assert resp.status == 200
            index = await (await proxy.http.get("/")).json()
            assert index["service"] == "specproxy" and "/v1/messages" in index["apis"]
            resp = await proxy.http.post("/v1/chat/completions", json={})
            assert resp.status == 401
    finally:
        await double.stop()


async def test_a_stream_the_backend_cuts_ends_with_done(tmp_path: Path) -> None:
    double = await start_double(Behaviour(reset_after=2))
    try:
        async with proxy_in_front(tmp_path, [{"name": "plain", "url": double.url}]) as proxy:
            async with aiohttp.ClientSession() as session:
                body = {"messages": [{"role": "user", "content": "hi"}], "stream": True}
                async with session.post(f"{proxy.url}/v1/chat/completions", json=body) as resp:
                    text = await resp.text()
            assert text.rstrip().endswith("data: [DONE]")
    finally:
        await double.stop()


def test_a_long_prompt_keeps_a_messages_stream_alive_with_real_events() -> None:
    fix = MessagesStreamFix("m")
    ping = b":\n\n"
    out = fix.feed(ping) + fix.feed(ping) + fix.feed(ping)
    upstream = [
        b'event: message_start\ndata: {"type":"message_start","message":{"id":"x",'
        b'"usage":{"input_tokens":18000,"output_tokens":0}}}',
        b'event: content_block_start\ndata: {"type":"content_block_start","index":0,'
        b'"content_block":{"type":"tool_use","id":"t","name":"Write","input":{}}}',
        b'event: content_block_delta\ndata: {"type":"content_block_delta","index":0,'
        b'"delta":{"type":"input_json_delta","partial_json":"{}"}}',
        b'event: content_block_stop\ndata: {"type":"content_block_stop","index":0}',
        b'event: message_delta\ndata: {"type":"message_delta","delta":{"stop_reason":"tool_use"}}',
        b'event: message_stop\ndata: {"type":"message_stop"}',
    ]
    for event in upstream:
        out += fix.feed(event + b"\n\n")
    out += fix.flush()
    events = [(name, data) for name, data in _events(out) if name is not None]
    names = [name for name, _ in events]
    # Each comment became an event; one message_start; the keep-alive block closed first.
    assert names == [
        "message_start",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "content_block_start",
        "content_block_delta",
        "content_block_stop",
        "message_delta",
        "message_stop",
    ]
    indices = [d["index"] for n, d in events if n.startswith("content_block")]
    assert indices == [0, 0, 0, 1, 1, 1]
    assert events[4][1]["content_block"]["name"] == "Write"
    # The prompt's token count of the message_start the client did not get.
    assert events[7][1]["usage"]["input_tokens"] == 18000


def test_codexs_own_models_tool_items_are_left_out_for_llama_server() -> None:
    from proxy.api.surfaces import shape_responses

    body: dict[str, Any] = {
        "model": "gpt-6.2-sol",
        "input": [
            {"type": "additional_tools", "role": "developer", "tools": [{"type": "namespace"}]},
            {"type": "message", "role": "user", "content": "hi"},
        ],
    }
    sent = shape_responses(body)
    assert sent["input"] == [{"type": "message", "role": "user", "content": "hi"}]
    assert body["input"][0]["type"] == "additional_tools", "the client's body is not changed"
    plain = {"input": "hi"}
    assert shape_responses(plain) is plain


async def test_long_prompts_on_a_shared_kv_cache_are_counted_against_it() -> None:
    from proxy.backend_config import BackendConfig
    from proxy.backends.devices import Device
    from proxy.backends.launch import LaunchSpec
    from proxy.backends.supervisor import SupervisedEngine
    from proxy.config import Settings

    def supervisor(unified: bool, session: aiohttp.ClientSession) -> SupervisedEngine:
        cfg = BackendConfig(
            name="b", model="m.gguf", ctx_size=32768, parallel=4, kv_unified=unified
        )
        settings = Settings(backends=[cfg])
        device = Device("cpu", 2)
        device.add("b", 2)
        sup = SupervisedEngine(LaunchSpec(config=cfg), settings.supervision(), session, device)
        sup.n_ctx = 32768  # what /props says of both
        return sup

    # The session is never used: nothing here asks the (absent) server anything.
    async with aiohttp.ClientSession() as session:
        shared, own = supervisor(True, session), supervisor(False, session)
        async with shared.slot(19_000), own.slot(19_000):
            # A second 19 k-token prompt does not fit beside the first in one 32 k cache...
            assert shared.context_free == 32768 - 19_000
            # ...but does where each slot has a cache of its own.
            assert own.context_free == 32768
        assert shared.context_free == 32768


async def test_a_request_that_fits_an_empty_backend_never_waits_for_room(tmp_path: Path) -> None:
    double = await start_double(Behaviour(n_ctx=2048))
    try:
        async with proxy_in_front(tmp_path, [{"name": "plain", "url": double.url}]) as proxy:
            # 1,900 tokens by the double's count: fits 2,048, though not with an answer's
            # reserve beside it.
            body = {"messages": [{"role": "user", "content": "x" * 7_600}], "max_tokens": 8}
            resp = await proxy.http.post("/v1/chat/completions", json=body)
            assert resp.status == 200
    finally:
        await double.stop()
