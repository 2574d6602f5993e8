"""Which answers are tool calls written as text (proxy/api/text_calls.py): every form small models
write is one, only of a declared tool with arguments its schema accepts; prose never is."""

from __future__ import annotations

import json
from typing import Any

import pytest

from proxy.api.text_calls import ToolCatalog, could_be_calls

SCHEMA = {
    "type": "object",
    "properties": {"path": {"type": "string"}, "content": {"type": "string"}},
    "required": ["path", "content"],
}
CHAT = {"tools": [{"type": "function", "function": {"name": "write_file", "parameters": SCHEMA}}]}
CALL = '{"name": "write_file", "arguments": {"path": "a.py", "content": "x = 1\\n"}}'
WANTED = {"path": "a.py", "content": "x = 1\n"}


def catalog(body: dict[str, Any] = CHAT) -> ToolCatalog:
    found = ToolCatalog.of("chat", body)
    assert found is not None
    return found


@pytest.mark.parametrize(
    "text",
    [
        f"```json\n{CALL}\n```",  # Qwen2.5-Coder's usual answer (vLLM #32926: 100 %)
        f"```tool_call\n{CALL}\n```",
        f"```\n{CALL}\n```\n",
        CALL,
        f"  {CALL}\n",
        f"[{CALL}]",
        f"<tools>\n{CALL}\n</tools>",
        f"<tool_call>\n{CALL}\n</tool_call>",
        '{"name": "write_file", "parameters": {"path": "a.py", "content": "x = 1\\n"}}',
        '{"function": "write_file", "input": {"path": "a.py", "content": "x = 1\\n"}}',
        # arguments as a JSON string, the way OpenAI's own calls carry them
        json.dumps({"tool": "write_file", "arguments": json.dumps(WANTED)}),
        '{"type": "function", "function": {"name": "write_file", "arguments": '
        '{"path": "a.py", "content": "x = 1\\n"}}}',
    ],
)
def test_each_form_such_models_write_is_one_call(text: str) -> None:
    calls = catalog().calls_in(text)
    assert calls is not None and len(calls) == 1, text
    assert calls[0].name == "write_file" and calls[0].arguments == WANTED


def test_several_calls_in_one_answer_are_all_kept_each_with_its_own_id() -> None:
    for text in (
        f"```json\n{CALL}\n```\n\n```json\n{CALL}\n```",
        f"<tool_call>{CALL}</tool_call>\n<tool_call>{CALL}</tool_call>",
        f"[{CALL}, {CALL}]",
        f"{CALL}\n{CALL}",
    ):
        calls = catalog().calls_in(text)
        assert calls is not None and len(calls) == 2, text
        assert calls[0].id != calls[1].id


@pytest.mark.parametrize(
    "text",
    [
        "Use write_file to make a.py.",  # the name in prose
        f"Here is the call:\n```json\n{CALL}\n```",  # prose around the call
        f"```json\n{CALL}\n```\nThen run it.",
        '{"name": "read_file", "arguments": {"path": "a.py"}}',  # not declared
        '{"name": "write_file", "arguments": {"path": "a.py"}}',  # content is required
        '{"name": "write_file", "arguments": {"path": 3, "content": ""}}',  # wrong type
        '{"name": "write_file", "arguments": "not json"}',
        CALL[:-5],  # cut by max_tokens
        f"```python\n{CALL}\n```",  # code, not a call
        '{"answer": 42}',
        f"{CALL} and more",
        "",
    ],
)
def test_anything_else_stays_text(text: str) -> None:
    assert catalog().calls_in(text) is None


def test_a_schema_that_cannot_be_checked_turns_nothing_into_a_call() -> None:
    broken = {"type": "function", "function": {"name": "write_file", "parameters": {"type": 7}}}
    assert catalog({"tools": [broken]}).calls_in(CALL) is None


def test_tool_choice_none_or_no_function_tool_means_no_catalog() -> None:
    assert ToolCatalog.of("chat", {**CHAT, "tool_choice": "none"}) is None
    assert ToolCatalog.of("chat", {"messages": []}) is None
    assert ToolCatalog.of("messages", {"tools": [{"type": "web_search_20250305"}]}) is None
    custom = {"type": "custom", "name": "apply_patch"}  # Codex's free-text tool
    assert ToolCatalog.of("responses", {"tools": [custom]}) is None
    assert ToolCatalog.of("messages", {"tools": [], "tool_choice": {"type": "none"}}) is None


def test_a_named_tool_choice_allows_that_tool_alone() -> None:
    read = {"type": "function", "function": {"name": "read_file", "parameters": {}}}
    body = {
        "tools": [*CHAT["tools"], read],
        "tool_choice": {"type": "function", "function": {"name": "read_file"}},
    }
    assert catalog(body).calls_in(CALL) is None
    assert catalog(body).calls_in('{"name": "read_file", "arguments": {}}') is not None


def test_each_api_declares_its_tools_in_its_own_shape() -> None:
    messages = ToolCatalog.of("messages", {"tools": [{"name": "Write", "input_schema": SCHEMA}]})
    responses = ToolCatalog.of(
        "responses", {"tools": [{"type": "function", "name": "Write", "parameters": SCHEMA}]}
    )
    text = CALL.replace("write_file", "Write")
    for found in (messages, responses):
        assert found is not None
        calls = found.calls_in(text)
        assert calls is not None and calls[0].name == "Write"


@pytest.mark.parametrize(
    ("text", "could"),
    [
        ("", True),
        ("  \n", True),
        ("`", True),
        ("``", True),
        ("```js", True),  # json, not yet known
        ("```python", False),
        ("```json\n", True),
        ("```json\n{", True),
        ("```json\ndef", False),
        ("{", True),
        ('{"na', True),
        ('{"name"', True),
        ('{"answer"', False),
        ("{x", False),
        ("[", True),
        ("[1", False),
        ("<", True),
        ("<tool", True),
        ("<tools>", True),
        ("<div>", False),
        ("A Python list", False),
        ("Sure", False),
        ("I", False),
    ],
)
def test_a_stream_holds_only_an_answer_whose_start_could_be_a_call(text: str, could: bool) -> None:
    assert could_be_calls(text) is could
