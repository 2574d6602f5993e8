"""Tool calls Qwen2.5-Coder writes as text reach the official clients as calls, on every surface,
streamed and whole; every other answer, and every answer of a backend that turns repair off,
stays as the model wrote it.

Qwen2.5-Coder-0.5B at temperature 0 answers "Write hello.py, printing hello, with write_file."
with the call as a fenced ```json block (as the 1.5B and 7B do, vLLM #32926), which
llama-server b11434 leaves as text.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from typing import Any

import anthropic
import openai
import pytest

from tests.proxy_metrics import scrape
from tests.subprocess_proxy import RunningProxy, openai_client, proxy_on

CONFIG = """
backends:
  - {name: coder, kind: plain, model: qwen2.5-coder-0.5b, threads: 2, ctx_size: 2048,
     engine: qwen}
  # The same engine, its answers left as the model wrote them.
  - {name: as-written, kind: plain, model: qwen2.5-coder-0.5b, threads: 2, ctx_size: 2048,
     engine: qwen, repair_tool_calls: false}
"""
SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
WRITE = "Write hello.py, printing hello, with write_file."
# The model answers this one with a call of `greet`, a tool nobody declared.
UNDECLARED = (
    "Create a file hello.py containing a function greet(name) that returns 'Hello, ' + name."
)
CHAT_TOOLS: list[Any] = [
    {
        "type": "function",
        "function": {"name": "write_file", "description": "Write a file.", "parameters": SCHEMA},
    }
]
MESSAGES_TOOLS: list[Any] = [
    {"name": "write_file", "description": "Write a file.", "input_schema": SCHEMA}
]
RESPONSES_TOOLS: list[Any] = [
    {"type": "function", "name": "write_file", "description": "Write a file.", "parameters": SCHEMA}
]
SURFACES = ("chat", "messages", "responses")


@pytest.fixture(scope="module")
def coder(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """Qwen2.5-Coder-0.5B, repaired (`coder`) and as written (`as-written`), one engine."""
    with proxy_on(CONFIG, tmp_path_factory.mktemp("text-calls")) as running:
        yield running


def ask(
    proxy: RunningProxy, surface: str, stream: bool, model: str = "coder", prompt: str = WRITE
) -> tuple[list[tuple[str, dict[str, Any]]], str, str, str | None]:
    """One request through the surface's official client: the calls it got (name, arguments),
    its text, how it ended, and the repaired-calls header (whole answers only)."""
    if surface == "messages":
        return _messages(proxy, stream, model, prompt)
    with openai_client(proxy.url) as client:
        if surface == "chat":
            return _chat(client, stream, model, prompt)
        return _responses(client, stream, model, prompt)


def _chat(
    client: openai.OpenAI, stream: bool, model: str, prompt: str
) -> tuple[list[tuple[str, dict[str, Any]]], str, str, str | None]:
    args: dict[str, Any] = {
        "model": model,
        "messages": [{"role": "user", "content": prompt}],
        "tools": CHAT_TOOLS,
        "temperature": 0,
        "max_tokens": 120,
    }
    if not stream:
        raw = client.chat.completions.with_raw_response.create(**args)
        choice = raw.parse().choices[0]
        calls = [
            (c.function.name, json.loads(c.function.arguments))
            for c in choice.message.tool_calls or []
            if c.type == "function"
        ]
        header = raw.headers.get("x-specproxy-repaired-tool-calls")
        return calls, choice.message.content or "", str(choice.finish_reason), header
    text, finish = "", ""
    parts: dict[int, list[str]] = {}
    for chunk in client.chat.completions.create(**args, stream=True):
        if not chunk.choices:
            continue
        delta = chunk.choices[0].delta
        text += delta.content or ""
        for call in delta.tool_calls or []:
            fn = call.function
            assert fn is not None
            parts.setdefault(call.index, ["", ""])
            parts[call.index][0] += fn.name or ""
            parts[call.index][1] += fn.arguments or ""
        finish = chunk.choices[0].finish_reason or finish
    calls = [(name, json.loads(arguments)) for name, arguments in parts.values()]
    return calls, text, finish, None


def _messages(
    proxy: RunningProxy, stream: bool, model: str, prompt: str
) -> tuple[list[tuple[str, dict[str, Any]]], str, str, str | None]:
    args: dict[str, Any] = {
        "model": model,
        "max_tokens": 120,
        # This SDK's create() no longer takes temperature; the API still does.
        "extra_body": {"temperature": 0},
        "tools": MESSAGES_TOOLS,
        "messages": [{"role": "user", "content": prompt}],
    }
    header = None
    with anthropic.Anthropic(base_url=proxy.url, api_key="unused", max_retries=0) as claude:
        if stream:
            with claude.messages.stream(**args) as events:
                message = events.get_final_message()
        else:
            raw = claude.messages.with_raw_response.create(**args)
            message, header = raw.parse(), raw.headers.get("x-specproxy-repaired-tool-calls")
    calls = [(b.name, dict(b.input)) for b in message.content if b.type == "tool_use"]
    text = "".join(b.text for b in message.content if b.type == "text")
    return calls, text, str(message.stop_reason), header


def _responses(
    client: openai.OpenAI, stream: bool, model: str, prompt: str
) -> tuple[list[tuple[str, dict[str, Any]]], str, str, str | None]:
    args: dict[str, Any] = {
        "model": model,
        "input": prompt,
        "tools": RESPONSES_TOOLS,
        "temperature": 0,
        "max_output_tokens": 120,
    }
    header = None
    if stream:
        with client.responses.stream(**args) as events:
            response = events.get_final_response()
    else:
        raw = client.responses.with_raw_response.create(**args)
        response, header = raw.parse(), raw.headers.get("x-specproxy-repaired-tool-calls")
    calls = [
        (item.name, json.loads(item.arguments))
        for item in response.output
        if item.type == "function_call"
    ]
    return calls, response.output_text, str(response.status), header


CALL_ENDS = {"chat": "tool_calls", "messages": "tool_use", "responses": "completed"}
TEXT_ENDS = {"chat": "stop", "messages": "end_turn", "responses": "completed"}


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("surface", SURFACES)
def test_a_call_written_as_text_reaches_the_client_as_a_call(
    coder: RunningProxy, surface: str, stream: bool
) -> None:
    calls, text, end, header = ask(coder, surface, stream)
    assert text == "" and end == CALL_ENDS[surface], (calls, text, end)
    ((name, arguments),) = calls
    assert name == "write_file" and set(arguments) == {"path", "content"}
    assert all(isinstance(v, str) for v in arguments.values())
    assert header == (None if stream else "1")


@pytest.mark.parametrize("stream", [False, True], ids=["whole", "stream"])
@pytest.mark.parametrize("surface", SURFACES)
def test_with_repair_off_the_same_answer_is_the_models_text(
    coder: RunningProxy, surface: str, stream: bool
) -> None:
    calls, text, end, header = ask(coder, surface, stream, model="as-written")
    assert calls == [] and end == TEXT_ENDS[surface] and header is None
    assert text.startswith("```json") and '"name": "write_file"' in text, text


@pytest.mark.parametrize("surface", SURFACES)
def test_a_call_of_an_undeclared_tool_stays_text(coder: RunningProxy, surface: str) -> None:
    whole = ask(coder, surface, False, prompt=UNDECLARED)
    streamed = ask(coder, surface, True, prompt=UNDECLARED)
    for calls, text, end, header in (whole, streamed):
        assert calls == [] and end == TEXT_ENDS[surface] and header is None
        assert re.search(r'"name":\s*"greet"', text), text
    assert whole[1] == streamed[1], "the same text, whole or streamed"


def repaired_lines(proxy: RunningProxy) -> list[dict[str, Any]]:
    """The log lines of chat requests whose answer carried repaired calls."""
    lines = [json.loads(x) for x in proxy.log_path.read_text().splitlines() if x.startswith("{")]
    return [x for x in lines if x.get("endpoint") == "chat" and x.get("repaired_tool_calls")]


def test_repairs_are_counted_and_logged(coder: RunningProxy) -> None:
    key = "specproxy_repaired_tool_calls_total{endpoint=chat}"
    before, logged = scrape(coder).get(key, 0), len(repaired_lines(coder))
    ask(coder, "chat", False)
    ask(coder, "chat", False, model="as-written")
    assert scrape(coder).get(key, 0) - before == 1
    (line,) = repaired_lines(coder)[logged:]
    assert line["repaired_tool_calls"] == 1 and line["backend"] == "coder"
