"""Agent turns: whether an agent's next answer will be an edit that copies a file it has read.

A request with tools is an agent's turn, and most of its answers are short tool calls (read a
file, search, run the tests): new code. But an edit arrives as a tool call whose arguments
copy the file being changed (Write/Edit, write_file, apply_patch), which n-gram speculation
drafts from the prompt: echo-shaped. What comes next shows in the session's own history:
the instruction asked for a change, the file was read, and no edit has been made since.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from proxy.tasks import TaskClass

# Only the newest messages are read: an agent's context grows to hundreds of them.
_RECENT = 24
_SLICE = 4000
# A tool result this long is a file's (or a large part's) contents, not a status line.
_FILE_CHARS = 300
_EDIT_TOOL = re.compile(
    r"write|edit|patch|replace|str_replace|create_file|apply|insert|modify", re.IGNORECASE
)
_EDIT_ARGS = ("content", "new_string", "new_str", "patch", "diff", "file_text", "code", "input")
_CHANGE_WORDS = re.compile(
    r"\b(fix|change|rename|refactor|update|replace|edit|modify|add|remove|delete|rewrite|"
    r"convert|insert|move|make|use|turn|implement|extract|inline|swap|correct|adjust)\b",
    re.IGNORECASE,
)
# Qwen's chat template shows tool results as a user turn of <tool_response> blocks, and small
# Qwen models write their calls as text in <tool_call> or <tools> tags: the same turns.
_TEXT_RESULT = re.compile(r"^\s*<tool_response>", re.IGNORECASE)
_TEXT_CALL = re.compile(r"<(?:tool_call|tools)>\s*(\{.*?)\s*</(?:tool_call|tools)>", re.DOTALL)
_QUESTION = re.compile(
    r"\?|\b(explain|describe|why|what|how|where|which|summari[sz]e|tell me|walk me)\b",
    re.IGNORECASE,
)
_FAILED = re.compile(r"\b(error|not found|failed|no match|did not match|unable)\b", re.IGNORECASE)


@dataclass(frozen=True)
class _Step:
    """One message of the conversation, as the turn predictor reads it."""

    kind: str  # "instruction", "edit", "call", "result", "text"
    text: str = ""


def _text(content: Any) -> str:
    if isinstance(content, str):
        return content[:_SLICE]
    if isinstance(content, list):
        parts = []
        for part in content:
            if isinstance(part, Mapping):
                value = part.get("text", part.get("content", part.get("output", "")))
                parts.append(_text(value))
            elif isinstance(part, str):
                parts.append(part)
        return "\n".join(parts)[:_SLICE]
    return ""


def _is_edit(name: Any, arguments: Any) -> bool:
    if isinstance(name, str) and _EDIT_TOOL.search(name):
        return True
    if isinstance(arguments, str):
        try:
            arguments = json.loads(arguments)
        except ValueError:
            return len(arguments) >= _FILE_CHARS and "*** Begin Patch" in arguments
    if isinstance(arguments, Mapping):
        return any(
            isinstance(arguments.get(k), str) and len(arguments[k]) >= 100 for k in _EDIT_ARGS
        )
    return False


def _steps(message: Mapping[str, Any]) -> Iterator[_Step]:
    """What one message (OpenAI chat, Anthropic Messages or Responses item) holds."""
    role = message.get("role")
    kind = message.get("type")
    if kind == "function_call" or kind == "custom_tool_call":
        args = message.get("arguments", message.get("input"))
        yield _Step("edit" if _is_edit(message.get("name"), args) else "call")
        return
    if kind in ("function_call_output", "custom_tool_call_output") or role == "tool":
        yield _Step("result", _text(message.get("output", message.get("content"))))
        return
    content = message.get("content")
    if role == "assistant":
        for call in message.get("tool_calls") or []:
            if isinstance(call, Mapping):
                fn = call.get("function") or {}
                edit = isinstance(fn, Mapping) and _is_edit(fn.get("name"), fn.get("arguments"))
                yield _Step("edit" if edit else "call")
        if isinstance(content, list):
            for block in content:
                if isinstance(block, Mapping) and block.get("type") == "tool_use":
                    edit = _is_edit(block.get("name"), block.get("input"))
                    yield _Step("edit" if edit else "call")
        text = _text(content)
        calls = _TEXT_CALL.findall(text)
        for raw in calls:
            try:
                call = json.loads(raw)
            except ValueError:
                call = {}
            name = call.get("name") if isinstance(call, Mapping) else None
            args = call.get("arguments") if isinstance(call, Mapping) else None
            yield _Step("edit" if _is_edit(name, args) else "call")
        if text.strip() and not calls:
            yield _Step("text", text)
        return
    if role == "user" and isinstance(content, list):
        results = [b for b in content if isinstance(b, Mapping) and b.get("type") == "tool_result"]
        for block in results:
            yield _Step("result", _text(block.get("content")))
        if results:
            return
    if role == "user":
        text = _text(content)
        yield _Step("result" if _TEXT_RESULT.match(text) else "instruction", text)


def next_answer_class(messages: Sequence[Any]) -> TaskClass:
    """The class of an agent's next answer: echo when it is due to edit a file it has read.

    Due: the newest instruction asks for a change, a file's contents came back since (a read
    whose result is long), and no edit followed; or the last edit failed (it is retried with
    the file in view). A question, once a tool result came back, is answered in prose. Anything
    else is a short tool call or new code: code.
    """
    turns = list(messages)
    # A client's own start of the answer (a trailing assistant message, which the server
    # continues) is the turn before it, carried on.
    while turns and isinstance(turns[-1], Mapping) and turns[-1].get("role") == "assistant":
        turns.pop()
    steps = [step for m in turns[-_RECENT:] if isinstance(m, Mapping) for step in _steps(m)]
    instruction = max((i for i, s in enumerate(steps) if s.kind == "instruction"), default=-1)
    if instruction < 0:
        return "code"
    since = steps[instruction + 1 :]
    asks_change = bool(_CHANGE_WORDS.search(steps[instruction].text))
    if not asks_change and _QUESTION.search(steps[instruction].text):
        # A question about the code, once something came back to answer it from: prose.
        return "prose" if since and since[-1].kind == "result" else "code"
    if since and since[-1].kind == "result":
        edits = [i for i, s in enumerate(since) if s.kind == "edit"]
        if edits and edits[-1] == len(since) - 2 and _FAILED.search(since[-1].text[:400]):
            return "echo"
        read = any(s.kind == "result" and len(s.text) >= _FILE_CHARS for s in since)
        if asks_change and read and not edits:
            return "echo"
    if not since and asks_change:
        # A new instruction about a file already in the context is answered by its edit.
        earlier = steps[:instruction]
        if any(s.kind == "result" and len(s.text) >= _FILE_CHARS for s in earlier):
            return "echo"
    return "code"


Intent = Literal["change", "question", "other"]


def session_intent(messages: Sequence[Any]) -> Intent:
    """What the session's first instruction asks for: a change, an answer, or something else.

    It tells what the session's answers will mostly be (edits, prose, tool calls), which is
    what its first turn is placed by: the session stays where it starts.
    """
    for m in messages:
        if isinstance(m, Mapping):
            for step in _steps(m):
                if step.kind == "instruction":
                    if _CHANGE_WORDS.search(step.text):
                        return "change"
                    return "question" if _QUESTION.search(step.text) else "other"
    return "other"
