"""The scripted model server's answers as the official SDKs read them, per wire (fast tier)."""

from __future__ import annotations

import json
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from loadtests.scripted_server import Answer, Recorder, ToolCall, scripted_app, serve

# A write's arguments with what JSON escaping and streaming in pieces could break.
ARGUMENTS = json.dumps({"file_path": "/w/calc.py", "content": 'a = "b\\\\c"\n\tx = 1\n' * 6})
TEXT = "Done."


def script(path: str, body: dict[str, Any]) -> Answer:
    """The answer each test asks for by its body's `metadata`: text, a function or custom call."""
    wanted = (body.get("metadata") or {}).get("answer")
    if wanted == "text":
        return TEXT
    return ToolCall("Write", ARGUMENTS, custom=wanted == "custom", call_id="call_1")


@pytest.fixture(scope="module")
def url() -> Iterator[str]:
    with serve(scripted_app(Recorder(), script)) as base:
        yield base


def test_chat_tool_calls_and_text_streamed_and_whole(url: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    messages: Any = [{"role": "user", "content": "hi"}]
    with client.chat.completions.stream(model="auto", messages=messages) as stream:
        final = stream.get_final_completion()
    assert final.choices[0].finish_reason == "tool_calls"
    call: Any = (final.choices[0].message.tool_calls or [])[0]
    assert (call.function.name, call.function.arguments) == ("Write", ARGUMENTS)
    whole = client.chat.completions.create(model="auto", messages=messages)
    whole_call: Any = (whole.choices[0].message.tool_calls or [])[0]
    assert whole_call.function.arguments == ARGUMENTS
    text = client.chat.completions.create(
        model="auto", messages=messages, metadata={"answer": "text"}
    )
    assert text.choices[0].message.content == TEXT


@pytest.mark.parametrize("answer", ["function", "custom", "text"])
def test_responses_items_streamed_and_whole(url: str, answer: str) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x")
    with client.responses.stream(model="auto", input="hi", metadata={"answer": answer}) as s:
        streamed = s.get_final_response()
    whole = client.responses.create(model="auto", input="hi", metadata={"answer": answer})
    for response in (streamed, whole):
        item: Any = response.output[0]
        if answer == "function":
            assert (item.type, item.name, item.arguments) == ("function_call", "Write", ARGUMENTS)
        elif answer == "custom":
            assert (item.type, item.input) == ("custom_tool_call", ARGUMENTS)
        else:
            assert response.output_text == TEXT


def test_messages_tool_use_streamed_and_whole(url: str) -> None:
    client = anthropic.Anthropic(base_url=url, api_key="x")
    messages: Any = [{"role": "user", "content": "hi"}]
    with client.messages.stream(model="auto", max_tokens=10, messages=messages) as stream:
        streamed = stream.get_final_message()
    whole = client.messages.create(model="auto", max_tokens=10, messages=messages)
    for message in (streamed, whole):
        block: Any = message.content[0]
        assert message.stop_reason == "tool_use"
        assert (block.type, block.name, block.input) == ("tool_use", "Write", json.loads(ARGUMENTS))
    with client.messages.stream(
        model="auto", max_tokens=10, messages=messages, extra_body={"metadata": {"answer": "text"}}
    ) as stream:
        text: Any = stream.get_final_message().content[0]
    assert (text.type, text.text) == ("text", TEXT)
