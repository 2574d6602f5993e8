"""The body shapes coding agents send (docs/agents.md), answered by real llama-server
backends through the proxy as a bare llama-server answers them: never a 400 for a shape the
upstream API allows. (A name that matches nothing, and HEAD /, are answered by the proxy alone:
tests/fast/test_validation.py and tests/fast/test_agent_shapes.py.)"""

from __future__ import annotations

import json
from typing import Any

import anthropic
import openai
import requests
from openai.types.chat import ChatCompletionFunctionToolParam, ChatCompletionMessageParam

from tests.agent_bodies import codex_responses_body
from tests.subprocess_proxy import RunningProxy

TOOL: ChatCompletionFunctionToolParam = {
    "type": "function",
    "function": {
        "name": "read_file",
        "description": "Read a file",
        "parameters": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
            "additionalProperties": False,
        },
    },
}


def _post(proxy: RunningProxy, path: str, body: dict[str, Any]) -> requests.Response:
    return requests.post(f"{proxy.url}{path}", json=body, timeout=120)


def test_claude_codes_messages_shapes_stream_to_message_stop(proxy: RunningProxy) -> None:
    events = []
    with (
        anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0) as client,
        client.messages.stream(
            model="claude-opus-4-8",  # an alias of the test config (claude-*)
            max_tokens=64000,  # beyond the 2,048-token context: clamped as llama-server does
            system=[
                {"type": "text", "text": "You are terse.", "cache_control": {"type": "ephemeral"}}
            ],
            messages=[
                {"role": "user", "content": [{"type": "text", "text": "Say hi."}]},
                {"role": "system", "content": "Answer in one word."},
                {"role": "user", "content": "Now."},
            ],
            extra_body={
                "thinking": {"type": "disabled"},
                "context_management": {"edits": []},
                "metadata": {"user_id": "user-1"},
            },
        ) as stream,
    ):
        events = [e.type for e in stream]
        final = stream.get_final_message()
    assert events[-1] == "message_stop"
    assert final.stop_reason in ("end_turn", "max_tokens")


def test_codexs_responses_shapes_complete(proxy: RunningProxy) -> None:
    # The test config has no alias for Codex's model name: asked for by `auto`.
    body = {**codex_responses_body(), "model": "auto", "max_output_tokens": 16}
    resp = _post(proxy, "/v1/responses", body)
    assert resp.status_code == 200, resp.text
    kinds = [
        json.loads(line[6:])["type"] for line in resp.text.splitlines() if line.startswith("data: ")
    ]
    assert kinds[-1] == "response.completed", kinds


def test_qwen_codes_part_arrays_and_opencodes_trailing_assistant(
    client: openai.OpenAI,
) -> None:
    messages: list[ChatCompletionMessageParam] = [
        {"role": "system", "content": "You are terse."},
        {"role": "user", "content": [{"type": "text", "text": "Read a.txt"}]},
        {
            "role": "assistant",
            "content": None,
            "tool_calls": [
                {
                    "id": "call_1",
                    "type": "function",
                    "function": {"name": "read_file", "arguments": '{"path": "a.txt"}'},
                }
            ],
        },
        # Qwen Code sends tool results as arrays of parts.
        {"role": "tool", "tool_call_id": "call_1", "content": [{"type": "text", "text": "hello"}]},
        {"role": "user", "content": "What did it say?"},
    ]
    answer = client.chat.completions.create(
        model="auto",
        messages=messages,
        tools=[TOOL],
        tool_choice="auto",
        max_tokens=16,
    )
    assert answer.choices[0].finish_reason in ("stop", "length", "tool_calls")
    # opencode at its step limit: a trailing assistant message, tools still listed.
    stream = client.chat.completions.create(
        model="auto",
        messages=[*messages, {"role": "assistant", "content": "It said"}],
        tools=[TOOL],
        max_tokens=8,
        stream=True,
        stream_options={"include_usage": True},
    )
    finishes = [c.choices[0].finish_reason for c in stream if c.choices]
    assert finishes[-1] in ("stop", "length")
