"""Tool calls put right: arguments cut by max_tokens closed, calls written as text picked out."""

from __future__ import annotations

import json
import re
from typing import Final

from loadtests.sessions.tools import tool_definitions


def repair_arguments(arguments: str) -> str:
    """Tool-call arguments as valid JSON: a call cut by max_tokens gets its strings and braces
    closed (llama-server refuses a conversation whose tool arguments do not parse)."""
    try:
        json.loads(arguments or "{}")
        return arguments or "{}"
    except ValueError:
        pass
    stack: list[str] = []
    in_string = escaped = False
    for ch in arguments:
        if in_string:
            if escaped:
                escaped = False
            elif ch == "\\":
                escaped = True
            elif ch == '"':
                in_string = False
        elif ch == '"':
            in_string = True
        elif ch in "{[":
            stack.append("}" if ch == "{" else "]")
        elif ch in "}]" and stack:
            stack.pop()
    text = arguments
    if escaped:
        text = text[:-1]
    if in_string:
        # A cut \u escape would not parse either.
        text = re.sub(r"\\u[0-9a-fA-F]{0,3}$", "", text) + '"'
    closed = text + "".join(reversed(stack))
    for candidate in (closed, re.sub(r',\s*"[^"]*"\s*:?\s*$', "", text) + "".join(reversed(stack))):
        try:
            json.loads(candidate)
            return candidate
        except ValueError:
            continue
    return "{}"


_TOOL_NAMES: Final = frozenset(t["function"]["name"] for t in tool_definitions())
_TEXT_CALL = re.compile(r'\{\s*"name"\s*:\s*"(\w+)"')


def text_tool_calls(content: str) -> list[tuple[str, str]]:
    """Tool calls a model wrote as text, (name, JSON arguments), for the tools it was given.

    Small models often write the call instead of making it: Qwen2.5-Coder-1.5B answered
    `<tools>{"name": "read_file", "arguments": {...}}</tools>` here, others a fenced JSON block.
    A call cut by max_tokens is closed like a cut real call.
    """
    calls = []
    position = 0
    while (match := _TEXT_CALL.search(content, position)) is not None:
        position = match.end()
        if match.group(1) not in _TOOL_NAMES:
            continue
        tail = content[match.start() :]
        try:
            value, used = json.JSONDecoder().raw_decode(tail)
        except ValueError:
            # Cut: everything from the brace on, fences and tags after it left out.
            cut = re.sub(r"\s*(```|</?tools?(_call)?>)\s*$", "", tail)
            try:
                value, used = json.loads(repair_arguments(cut)), len(tail)
            except ValueError:
                continue
        arguments = value.get("arguments") if isinstance(value, dict) else None
        if isinstance(arguments, str):
            arguments = json.loads(repair_arguments(arguments))
        if isinstance(arguments, dict):
            calls.append((match.group(1), json.dumps(arguments)))
        position = match.start() + used
    return calls
