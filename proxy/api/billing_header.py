"""Claude Code's per-task billing line, taken out of prompts so sessions share their prefix.

Claude Code (2.1.x) opens every Messages request with a system block
`x-anthropic-billing-header: cc_version=2.1.197.<3 hex>; cc_entrypoint=sdk-cli;` whose three hex
characters are a hash of the user's task (docs/agents.md). It is metadata for Anthropic's
servers, not an instruction to the model, and it sits before the whole system prompt and the
tool schemas: left in, two sessions with different tasks share ~15 tokens of a ~20 k-token
prompt in llama-server's cache; taken out, everything before the task. Only a line that starts
a system text is taken, so nothing the model should read changes.
"""

from __future__ import annotations

import re
from typing import Any

_LINE = re.compile(r"\A\s*x-anthropic-billing-header:[^\n]*(?:\n|\Z)")
_SYSTEM_ROLES = frozenset({"system", "developer"})
_TEXT_PARTS = frozenset({"text", "input_text"})


def _strip(text: str) -> str | None:
    """The text without a leading billing line; None when it had none."""
    match = _LINE.match(text)
    return text[match.end() :] if match else None


def _without_in_blocks(blocks: list[Any]) -> list[Any] | None:
    """Text blocks (Messages `system`, chat or Responses parts) without the line; None: none."""
    changed, kept = False, []
    for block in blocks:
        kind = block.get("type") if isinstance(block, dict) else None
        if isinstance(kind, str) and kind in _TEXT_PARTS:
            text = block.get("text")
            rest = _strip(text) if isinstance(text, str) else None
            if rest is not None:
                changed = True
                if rest.strip():
                    kept.append({**block, "text": rest})
                continue
        kept.append(block)
    return kept if changed else None


def _without_in_content(content: Any) -> tuple[bool, Any]:
    """(changed, content) of one system text: a string or a list of text blocks."""
    if isinstance(content, str):
        rest = _strip(content)
        return (False, content) if rest is None else (True, rest)
    if isinstance(content, list):
        blocks = _without_in_blocks(content)
        return (False, content) if blocks is None else (True, blocks)
    return False, content


def _without_in_messages(messages: Any) -> list[Any] | None:
    """System and developer messages without the line (one left empty dropped); None: unchanged."""
    if not isinstance(messages, list):
        return None
    changed, kept = False, []
    for message in messages:
        role = message.get("role") if isinstance(message, dict) else None
        if isinstance(role, str) and role in _SYSTEM_ROLES:
            stripped, content = _without_in_content(message.get("content"))
            if stripped:
                changed = True
                if content:  # "" or []: nothing left for the model
                    kept.append({**message, "content": content})
                continue
        kept.append(message)
    return kept if changed else None


def messages_without_billing(body: dict[str, Any]) -> dict[str, Any]:
    """An Anthropic Messages body without the line in `system` or a system message."""
    out = body
    changed, system = _without_in_content(body.get("system"))
    if changed:
        rest = {k: v for k, v in out.items() if k != "system"}
        out = {**rest, "system": system} if system else rest
    messages = _without_in_messages(body.get("messages"))
    if messages is not None:
        out = {**out, "messages": messages}
    return out


def chat_without_billing(body: dict[str, Any]) -> dict[str, Any]:
    """An OpenAI chat body (Claude Code relayed through a translating client) without the line."""
    messages = _without_in_messages(body.get("messages"))
    return body if messages is None else {**body, "messages": messages}


def responses_without_billing(body: dict[str, Any]) -> dict[str, Any]:
    """A Responses body without the line in `instructions` or a system/developer input item."""
    out = body
    instructions = body.get("instructions")
    if isinstance(instructions, str) and (rest := _strip(instructions)) is not None:
        out = {**out, "instructions": rest}
    items = _without_in_messages(body.get("input"))
    if items is not None:
        out = {**out, "input": items}
    return out
