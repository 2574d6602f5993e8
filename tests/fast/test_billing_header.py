"""Claude Code's per-task billing line is taken out before llama-server, and nothing else is."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

from proxy.api.billing_header import (
    chat_without_billing,
    messages_without_billing,
    responses_without_billing,
)
from proxy.routing.prefixes import PromptPrefix
from tests.inprocess import fast_proxy

# The shape Claude Code 2.1.197 sends (docs/agents.md): the billing block first, then its
# system prompt in blocks with cache_control, 25 tools, the task, a `system` message after it.
TOOLS = [
    {
        "name": f"Tool{i}",
        "description": f"Tool number {i}. " * 4,
        "input_schema": {
            "$schema": "https://json-schema.org/draft/2020-12/schema",
            "type": "object",
            "properties": {"path": {"type": "string"}},
            "required": ["path"],
        },
    }
    for i in range(25)
]


def claude_code_turn(task: str, task_hash: str) -> dict[str, Any]:
    """A first turn of Claude Code for `task`, whose billing line carries `task_hash`."""
    return {
        "model": "claude-opus-4-8",
        "max_tokens": 64000,
        "stream": True,
        "system": [
            {
                "type": "text",
                "text": f"x-anthropic-billing-header: cc_version=2.1.197.{task_hash}; "
                "cc_entrypoint=sdk-cli;",
            },
            {
                "type": "text",
                "text": "You are Claude Code, Anthropic's official CLI for Claude.",
                "cache_control": {"type": "ephemeral"},
            },
            {
                "type": "text",
                "text": "You are an interactive agent that helps users with software "
                "engineering tasks. " * 10,
                "cache_control": {"type": "ephemeral"},
            },
        ],
        "tools": TOOLS,
        "messages": [
            {"role": "user", "content": [{"type": "text", "text": task}]},
            {"role": "system", "content": "Environment: working directory /tmp/w. " * 30},
        ],
        "metadata": {"user_id": "user-1"},
    }


def test_two_tasks_share_system_prompt_and_tools_once_the_line_is_out() -> None:
    first = claude_code_turn("Create hello.py with greet(name).", "c8b")
    second = claude_code_turn("Fix the failing test in test_app.py.", "68e")
    raw_shared = PromptPrefix.of(first).shared_chars(PromptPrefix.of(second))
    a, b = messages_without_billing(first), messages_without_billing(second)
    shared = PromptPrefix.of(a).shared_chars(PromptPrefix.of(b))
    system_and_tools = PromptPrefix.of({"system": a["system"], "tools": a["tools"]}).chars
    assert raw_shared == 0  # the line's hash differs, so nothing before the task is shared
    assert shared == system_and_tools > 0.8 * PromptPrefix.of(a).chars


def test_only_the_line_goes_everything_the_model_reads_stays() -> None:
    body = claude_code_turn("Create hello.py.", "c8b")
    before = copy.deepcopy(body)
    out = messages_without_billing(body)
    assert body == before  # the client's body is not changed in place
    assert out["system"] == before["system"][1:]
    assert {k: v for k, v in out.items() if k != "system"} == {
        k: v for k, v in before.items() if k != "system"
    }


def test_the_line_is_taken_only_where_it_starts_a_system_text() -> None:
    line = "x-anthropic-billing-header: cc_version=2.1.197.c8b; cc_entrypoint=sdk-cli;"
    user_says = {
        "model": "m",
        "messages": [{"role": "user", "content": f"{line}\nWhat is this header?"}],
    }
    assert chat_without_billing(user_says) is user_says
    later = {"model": "m", "system": f"You are terse.\n{line}", "messages": []}
    assert messages_without_billing(later) is later


def test_claude_code_relayed_through_openai_chat() -> None:
    line = "x-anthropic-billing-header: cc_version=2.1.197.c8b; cc_entrypoint=sdk-cli;"
    body = {
        "model": "m",
        "messages": [
            {"role": "system", "content": f"{line}\nYou are Claude Code."},
            {"role": "system", "content": [{"type": "text", "text": line}]},
            {"role": "user", "content": "hi"},
        ],
    }
    out = chat_without_billing(body)
    assert out["messages"] == [
        {"role": "system", "content": "You are Claude Code."},
        {"role": "user", "content": "hi"},
    ]


def test_responses_instructions_and_developer_items() -> None:
    line = "x-anthropic-billing-header: cc_version=2.1.197.c8b; cc_entrypoint=sdk-cli;"
    body = {
        "model": "m",
        "instructions": f"{line}\nBe brief.",
        "input": [
            {"role": "developer", "content": [{"type": "input_text", "text": f"{line}\nRules."}]},
            {"role": "user", "content": "hi"},
        ],
    }
    out = responses_without_billing(body)
    assert out["instructions"] == "Be brief."
    assert out["input"][0]["content"] == [{"type": "input_text", "text": "Rules."}]


async def test_llama_server_never_sees_the_line(tmp_path: Path) -> None:
    async with fast_proxy(tmp_path, {"plain": {}}) as proxy:
        for task, task_hash in (("Create hello.py.", "c8b"), ("Fix test_app.py.", "68e")):
            resp = await proxy.http.post("/v1/messages", json=claude_code_turn(task, task_hash))
            assert resp.status == 200, await resp.text()
            await resp.read()
        first, second = proxy.doubles["plain"].received
    assert "billing" not in str(first) and "billing" not in str(second)
    assert first["system"] == second["system"] and first["tools"] == second["tools"]
