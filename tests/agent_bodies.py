"""Request bodies coding agents send, as captured (docs/agents.md): one copy for both tiers."""

from __future__ import annotations

from typing import Any


def codex_responses_body() -> dict[str, Any]:
    """Codex CLI's Responses request: developer instructions as an input message, its own tool
    types beside functions (namespace, web_search), encrypted reasoning asked for, streamed.

    A new dict each call, so a test may change its copy.
    """
    return {
        "model": "gpt-6.2-sol",
        "instructions": "",
        "input": [
            {
                "type": "message",
                "role": "developer",
                "content": [{"type": "input_text", "text": "You are a coding agent."}],
            },
            {"type": "message", "role": "user", "content": [{"type": "input_text", "text": "hi"}]},
        ],
        "tools": [
            {"type": "function", "name": "shell", "parameters": {"type": "object"}},
            {"type": "namespace", "name": "mcp", "tools": []},
            {"type": "web_search"},
        ],
        "store": False,
        "include": ["reasoning.encrypted_content"],
        "reasoning": {"effort": "medium"},
        "prompt_cache_key": "session-1",
        "parallel_tool_calls": False,
        "stream": True,
    }
