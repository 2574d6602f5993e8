"""Real agents' edit turns (tests/data/edit_turns/), loaded for replay, and their edits applied.

Each file there holds one agent's edit turn as scripts/capture_edit_turns.py captured it: the
request the agent sent once a file it was asked to change had come back from its read tool, and
the answer that edits it, as the model writes it (a tool call's arguments, or aider's text).
"""

from __future__ import annotations

import copy
import dataclasses
import difflib
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

DATA_DIR = Path(__file__).resolve().parent.parent / "tests" / "data" / "edit_turns"
# Where a whole new file is among a write tool's arguments, by agent (Write, write, write_file).
CONTENT_KEYS = ("content", "file_text", "new_content")
PATCH_BEGIN, PATCH_END = "*** Begin Patch", "*** End Patch"
_SEARCH_REPLACE = re.compile(
    r"^<<<<<<< SEARCH\n(.*?)^=======\n(.*?)^>>>>>>> REPLACE", re.MULTILINE | re.DOTALL
)


@dataclass(frozen=True)
class EditTurn:
    """One agent's captured edit turn: the request, the edit answer, and the file around it."""

    agent: str
    version: str
    captured_at: str
    surface: str  # the endpoint's path, without query
    path: str  # the path as the agent sent it (Claude Code adds ?beta=true)
    body: dict[str, Any]
    tool: str | None  # the edit tool's name; None for a text edit (aider)
    custom: bool  # a Responses custom tool: `expected` is its free-form input
    expected: str
    file: str  # the edited file's name in the agent's work directory
    file_before: str
    file_after: str

    def applied(self, answer: str | None = None) -> str:
        """The file after the edit `answer` (by default the expected one) is applied."""
        return apply_edit(self.tool, self.expected if answer is None else answer, self)


def load(path: Path) -> EditTurn:
    """One captured turn's file."""
    data = json.loads(path.read_text(encoding="utf-8"))
    expected = data["expected"]
    return EditTurn(
        agent=data["agent"],
        version=data["version"],
        captured_at=data["captured_at"],
        surface=data["surface"],
        path=data.get("path") or data["surface"],
        body=data["body"],
        tool=expected["tool"],
        custom=bool(expected.get("custom")),
        expected=expected["text"],
        file=data["file"],
        file_before=data["file_before"],
        file_after=data["file_after"],
    )


def load_all(folder: Path = DATA_DIR) -> list[EditTurn]:
    """Every captured turn, by agent name."""
    return [load(path) for path in sorted(folder.glob("*.json"))]


def edit_turns(folder: Path = DATA_DIR) -> list[tuple[str, dict[str, Any], str]]:
    """(surface path, request body, expected answer text) of every captured turn, for replay."""
    return [(t.surface, t.body, t.expected) for t in load_all(folder)]


# --- reading a body ---------------------------------------------------------------------------


def text_of(content: Any) -> str:
    """The text of a string, or of a list of text parts and blocks."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        return "\n".join(t for t in texts if isinstance(t, str))
    return ""


def tool_results(surface: str, body: dict[str, Any]) -> list[str]:
    """The text of every tool result in a body, oldest first, in its surface's shape."""
    if surface.endswith("/messages"):
        return [
            text_of(block.get("content"))
            for message in body.get("messages") or []
            if isinstance(message.get("content"), list)
            for block in message["content"]
            if isinstance(block, dict) and block.get("type") == "tool_result"
        ]
    if surface.endswith("/responses"):
        items = body["input"] if isinstance(body.get("input"), list) else []
        return [
            text_of(item.get("output"))
            for item in items
            if isinstance(item, dict)
            and item.get("type") in ("function_call_output", "custom_tool_call_output")
        ]
    return [
        text_of(m.get("content"))
        for m in body.get("messages") or []
        if isinstance(m, dict) and m.get("role") == "tool"
    ]


def tool_calls(surface: str, body: dict[str, Any]) -> list[str]:
    """The names of the tools the conversation in a body has called, oldest first."""
    if surface.endswith("/messages"):
        return [
            str(block.get("name"))
            for message in body.get("messages") or []
            if isinstance(message.get("content"), list)
            for block in message["content"]
            if isinstance(block, dict) and block.get("type") == "tool_use"
        ]
    if surface.endswith("/responses"):
        items = body["input"] if isinstance(body.get("input"), list) else []
        return [
            str(item.get("name"))
            for item in items
            if isinstance(item, dict) and item.get("type") in ("function_call", "custom_tool_call")
        ]
    return [
        str((call.get("function") or {}).get("name"))
        for m in body.get("messages") or []
        if isinstance(m, dict) and m.get("role") == "assistant"
        for call in m.get("tool_calls") or []
        if isinstance(call, dict)
    ]


@dataclass(frozen=True)
class Tool:
    """One tool a request offers: its name, kind (function or custom) and parameters' schema."""

    name: str
    kind: str
    properties: dict[str, Any]


def offered(surface: str, body: dict[str, Any]) -> dict[str, Tool]:
    """The tools of a request by name, from each surface's shape (namespaces left out)."""
    tools: dict[str, Tool] = {}
    for tool in body.get("tools") or []:
        if not isinstance(tool, dict):
            continue
        if surface.endswith("/messages"):
            schema = tool.get("input_schema") or {}
            kind, name = "function", tool.get("name")
        elif surface.endswith("/responses"):
            schema = tool.get("parameters") or {}
            kind, name = str(tool.get("type")), tool.get("name")
        else:
            function = tool.get("function") or {}
            schema = function.get("parameters") or {}
            kind, name = "function", function.get("name")
        if isinstance(name, str) and kind in ("function", "custom"):
            tools[name] = Tool(name, kind, dict(schema.get("properties") or {}))
    return tools


def holds_file(result: str, text: str) -> bool:
    """Whether a tool result shows every line of a file in order (read tools number lines)."""
    at = 0
    for line in text.splitlines():
        if not line.strip():
            continue
        found = result.find(line, at)
        if found < 0:
            return False
        at = found + len(line)
    return True


# --- making and applying edits ----------------------------------------------------------------


def codex_patch(name: str, before: str, after: str) -> str:
    """A Codex apply_patch `*** Update File` patch, three context lines around each change."""
    old, new = before.splitlines(), after.splitlines()
    lines = [PATCH_BEGIN, f"*** Update File: {name}"]
    for group in difflib.SequenceMatcher(None, old, new).get_grouped_opcodes(3):
        lines.append("@@")
        for tag, i1, i2, j1, j2 in group:
            if tag == "equal":
                lines += [f" {line}" for line in old[i1:i2]]
                continue
            lines += [f"-{line}" for line in old[i1:i2]]
            lines += [f"+{line}" for line in new[j1:j2]]
    return "\n".join([*lines, PATCH_END]) + "\n"


def apply_patch(patch: str, before: str) -> str:
    """A Codex apply_patch patch (one `*** Update File`) applied to the file's text."""
    start, end = patch.find(PATCH_BEGIN), patch.find(PATCH_END)
    if start < 0 or end < 0:
        raise ValueError("no *** Begin Patch ... *** End Patch in the answer")
    body = patch[start + len(PATCH_BEGIN) : end].strip("\n").split("\n")
    if not body or not body[0].startswith("*** Update File: "):
        raise ValueError(f"not an update of one file: {body[:1]}")
    hunks: list[list[str]] = []
    for line in body[1:]:
        if line.startswith("@@") or not hunks:
            hunks.append([])
        if not line.startswith("@@") and line != "*** End of File":
            hunks[-1].append(line)
    lines, cursor = before.split("\n"), 0
    for hunk in hunks:
        old = [line[1:] for line in hunk if line[:1] in (" ", "-", "")]
        new = [line[1:] for line in hunk if line[:1] in (" ", "+", "")]
        at = next(
            (i for i in range(cursor, len(lines) - len(old) + 1) if lines[i : i + len(old)] == old),
            -1,
        )
        if at < 0:
            raise ValueError(f"a hunk's old lines are not in the file: {old[:3]}")
        lines[at : at + len(old)] = new
        cursor = at + len(new)
    return "\n".join(lines)


def aider_whole(name: str, after: str, language: str = "python") -> str:
    """aider's whole-file answer: the file's name, then the new file in a fenced block."""
    return f"{name}\n```{language}\n{after}```\n"


def aider_search_replace(name: str, before: str, after: str, language: str = "python") -> str:
    """aider's SEARCH/REPLACE answer: one block per run of changed lines."""
    old, new = before.splitlines(keepends=True), after.splitlines(keepends=True)
    blocks = []
    for tag, i1, i2, j1, j2 in difflib.SequenceMatcher(None, old, new).get_opcodes():
        if tag != "equal":
            search, replace = "".join(old[i1:i2]), "".join(new[j1:j2])
            block = f"<<<<<<< SEARCH\n{search}=======\n{replace}>>>>>>> REPLACE\n"
            blocks.append(f"{name}\n```{language}\n{block}```\n")
    return "\n".join(blocks)


def apply_aider(text: str, name: str, before: str) -> str:
    """aider's answer applied: its SEARCH/REPLACE blocks, or the whole file under its name."""
    blocks = _SEARCH_REPLACE.findall(text)
    if blocks:
        after = before
        for search, replace in blocks:
            if search not in after:
                raise ValueError(f"a SEARCH block is not in the file: {search[:80]!r}")
            after = after.replace(search, replace, 1)
        return after
    lines = text.split("\n")
    for i, line in enumerate(lines[:-1]):
        if line.strip() == name and lines[i + 1].startswith("```"):
            end = lines.index("```", i + 2)
            return "\n".join(lines[i + 2 : end]) + "\n"
    raise ValueError(f"no fenced block under {name} in the answer")


def written(turn: EditTurn) -> str:
    """The expected edit as the served model writes it: aider's text, or the tool call in
    Qwen2.5's format (`<tool_call>` around the name and the arguments object)."""
    if turn.tool is None:
        return turn.expected
    arguments = json.dumps(turn.expected) if turn.custom else turn.expected
    return f'<tool_call>\n{{"name": "{turn.tool}", "arguments": {arguments}}}\n</tool_call>'


def edit_opening(turn: EditTurn) -> str:
    """The written edit up to where the file itself begins: the new file's content, a patch's
    first hunk, or aider's fenced block. An answer begun with it leaves the model to write the
    edit, the part an agent's model copies from the file it read."""
    text = written(turn)
    if turn.tool is None:
        fence = text.index("```")
        return text[: text.index("\n", fence) + 1]
    header = f"*** Update File: {turn.file}"
    for marker in (header + "\\n", header + "\n"):
        if marker in text:
            return text[: text.index(marker) + len(marker)]
    content = json.dumps(turn.file_after)[1:41]
    if content not in text:
        raise ValueError(f"{turn.agent}: neither a patch nor the new file in the edit")
    return text[: text.index(content)]


def _patch_in(value: Any) -> str | None:
    """The apply_patch patch among a tool call's arguments (an `input`, or a shell command)."""
    if isinstance(value, str):
        return value if PATCH_BEGIN in value else None
    if isinstance(value, list | dict):
        values = value.values() if isinstance(value, dict) else value
        return next((p for v in values if (p := _patch_in(v)) is not None), None)
    return None


def apply_edit(tool: str | None, answer: str, turn: EditTurn) -> str:
    """The file after an edit answer: aider's text, a whole-file write, or an apply_patch."""
    if tool is None:
        return apply_aider(answer, turn.file, turn.file_before)
    if turn.custom or (PATCH_BEGIN in answer and not answer.lstrip().startswith("{")):
        return apply_patch(answer, turn.file_before)
    arguments = json.loads(answer)
    if not isinstance(arguments, dict):
        raise ValueError("the arguments are not a JSON object")
    content = next((arguments[k] for k in CONTENT_KEYS if isinstance(arguments.get(k), str)), None)
    if content is not None:
        return str(content)
    patch = _patch_in(arguments)
    if patch is None:
        raise ValueError(f"neither a file's content nor a patch in {sorted(arguments)}")
    return apply_patch(patch, turn.file_before)


# --- a cheaper copy of a turn -------------------------------------------------------------------


def _tool_name(tool: Any) -> str | None:
    if not isinstance(tool, dict):
        return None
    function = tool.get("function")
    name = function.get("name") if isinstance(function, dict) else tool.get("name")
    return name if isinstance(name, str) else None


def _cut(content: Any, chars: int) -> Any:
    """A string, or each text part of a list, cut to its first `chars` characters."""
    if isinstance(content, str):
        return content[:chars]
    if isinstance(content, list):
        return [
            {**part, "text": part["text"][:chars]}
            if isinstance(part, dict) and isinstance(part.get("text"), str)
            else part
            for part in content
        ]
    return content


def trimmed(turn: EditTurn, chars: int) -> EditTurn:
    """The turn with only the tools its conversation calls (and its edit tool), and every system
    or developer text cut to `chars` characters: the same shapes on the same surface, a few
    thousand prompt tokens instead of 10-20 k (a cold 20 k-token prompt is minutes on a CPU)."""
    body = copy.deepcopy(turn.body)
    used = {*tool_calls(turn.surface, body), *([turn.tool] if turn.tool else [])}
    if isinstance(body.get("tools"), list):
        body["tools"] = [t for t in body["tools"] if _tool_name(t) in used]
    if "system" in body:
        body["system"] = _cut(body["system"], chars)
    key = "input" if turn.surface.endswith("/responses") else "messages"
    for item in body.get(key) or []:
        if isinstance(item, dict) and item.get("role") in ("system", "developer"):
            item["content"] = _cut(item.get("content"), chars)
    return dataclasses.replace(turn, body=body)
