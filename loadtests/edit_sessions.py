"""Real agents' edit turns replayed as sessions: each captured turn grown into its agent's
conversation, one rename after another in the same file.

A captured turn (tests/data/edit_turns/) is the request an agent sent once its read tool had
returned the file. Around it the agent's session is, per task: the request that opens the task
(the conversation up to the user's instruction: the model answers with a read call), the edit
turn (the read call and its result added: the model answers with the edit), and the request that
closes it (the edit call and its result added: the model says it is done). aider, which sends the
file with the instruction and has no tools, makes one request per task. Each later task renames
another function of the same file, so its read result and its edit show the file as the earlier
tasks left it. The conversation is scripted (the answers an agent's model would give, not the
served model's), so every mode replays the same requests word for word; what the served model
answers is measured, not followed.
"""

from __future__ import annotations

import ast
import copy
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Literal

from loadtests.edit_turns import (
    PATCH_BEGIN,
    PATCH_END,
    EditTurn,
    aider_whole,
    codex_patch,
    load_all,
    text_of,
    trimmed,
)
from proxy.workload import fresh_word

TurnStep = Literal["open", "edit", "close"]
Message = dict[str, Any]
# What the agents' edit tools report after a whole-file write or a patch, as each says it.
EDIT_RESULTS = {
    "claude-code": "The file {path} has been updated successfully.",
    "opencode": "Wrote file successfully.",
    "qwen-code": "Successfully overwrote file: {path}.",
    "codex": "Success. Updated the following files:\nM {file}\n",
}
DONE = "Done: the function is renamed everywhere in {file}."


@dataclass(frozen=True)
class Rename:
    """One task: a function of the file renamed everywhere."""

    old: str
    new: str

    def apply(self, text: str) -> str:
        """text with every identifier `old` renamed."""
        return re.sub(rf"\b{re.escape(self.old)}\b", self.new, text)


@dataclass(frozen=True)
class ScriptedTurn:
    """One request of a session and the answer the script continues with."""

    step: TurnStep
    body: dict[str, Any]
    answer: str


@dataclass(frozen=True)
class EditSession:
    """One agent's session of edit tasks, request by request, on the agent's own surface."""

    id: str
    agent: str
    surface: str
    path: str
    turns: tuple[ScriptedTurn, ...]


def surface_kind(surface: str) -> Literal["messages", "responses", "chat"]:
    """Which API a path speaks: Anthropic Messages, OpenAI Responses, or OpenAI chat."""
    if surface.endswith("/messages"):
        return "messages"
    if surface.endswith("/responses"):
        return "responses"
    return "chat"


def functions(source: str) -> list[str]:
    """The module-level functions a file defines, in order."""
    return [n.name for n in ast.parse(source).body if isinstance(n, ast.FunctionDef)]


def renames(turn: EditTurn, tasks: int, variant: int = 0) -> list[Rename]:
    """The session's tasks: first the captured rename, then the file's other functions.

    Variant 0 keeps the captured task's names (its edit turn is the captured request word for
    word); other variants name every new function with their own made-up word.
    """
    gone = [f for f in functions(turn.file_before) if f not in functions(turn.file_after)]
    added = [f for f in functions(turn.file_after) if f not in functions(turn.file_before)]
    if len(gone) != 1 or len(added) != 1:
        raise ValueError(f"{turn.agent}: the captured edit is not one function renamed")
    word = fresh_word(variant)
    first = Rename(gone[0], added[0] if variant == 0 else f"{added[0]}_{word}")
    others = [Rename(f, f"{f}_{word}") for f in functions(turn.file_before) if f != first.old]
    if tasks > 1 + len(others):
        raise ValueError(f"{turn.file} has {1 + len(others)} functions to rename, not {tasks}")
    return [first, *others][:tasks]


def _strings(value: Any, change: Any) -> Any:
    """A JSON value with change applied to every string in it."""
    if isinstance(value, str):
        return change(value)
    if isinstance(value, list):
        return [_strings(v, change) for v in value]
    if isinstance(value, dict):
        return {k: _strings(v, change) for k, v in value.items()}
    return value


def _renamed(value: Any, done: Sequence[Rename]) -> Any:
    """A message showing the file, as the tasks done so far left it."""

    def change(text: str) -> str:
        for rename in done:
            text = rename.apply(text)
        return text

    return _strings(copy.deepcopy(value), change)


def _items(surface: str, body: dict[str, Any]) -> list[Message]:
    key = "input" if surface_kind(surface) == "responses" else "messages"
    items = body.get(key)
    if not isinstance(items, list):
        raise ValueError(f"the captured body has no {key} list")
    return list(items)


def _is_call(surface: str, item: Message) -> bool:
    kind = surface_kind(surface)
    if kind == "responses":
        return item.get("type") in ("function_call", "custom_tool_call")
    if kind == "messages":
        content = item.get("content")
        return isinstance(content, list) and any(
            isinstance(b, dict) and b.get("type") == "tool_use" for b in content
        )
    return bool(item.get("tool_calls"))


def _task_text(item: Message) -> str:
    return text_of(item.get("content")) if "content" in item else ""


class _Conversation:
    """The captured body taken apart: what comes before the task, the task, the read."""

    def __init__(self, turn: EditTurn, first: Rename) -> None:
        items = _items(turn.surface, turn.body)
        marker = f"`{first.old}`"
        self.task_at = max(i for i, m in enumerate(items) if marker in _task_text(m))
        calls = [i for i, m in enumerate(items) if i > self.task_at and _is_call(turn.surface, m)]
        self.items = items
        self.read_at = calls[0] if calls else len(items)

    def before_task(self) -> list[Message]:
        return self.items[: self.task_at]

    def task(self, captured: Rename, rename: Rename, first: bool = True) -> list[Message]:
        """The instruction for another rename; with what the agent sent beside it the first
        time (Claude Code's list of sub-agents) only for the session's first task."""

        def change(text: str) -> str:
            text = text.replace(f"`{captured.old}`", "`\0old`").replace(
                f"`{captured.new}`", "`\0new`"
            )
            return text.replace("`\0old`", f"`{rename.old}`").replace("`\0new`", f"`{rename.new}`")

        sent = self.items[self.task_at : self.read_at] if first else [self.items[self.task_at]]
        return list(_strings(copy.deepcopy(sent), change))

    def read(self) -> list[Message]:
        """The read call and its result, as captured."""
        return self.items[self.read_at :]


def _edit_arguments(turn: EditTurn, before: str, after: str) -> str:
    """The edit call's arguments (or custom input) rewriting `before` into `after`, in the
    form the captured edit takes: a whole-file write, or an apply_patch patch."""
    if turn.custom:
        return codex_patch(turn.file, before, after)
    arguments = json.loads(turn.expected)
    for key, value in arguments.items():
        if isinstance(value, str) and value == turn.file_after:
            arguments[key] = after
        elif isinstance(value, str) and PATCH_BEGIN in value:
            start, end = value.index(PATCH_BEGIN), value.index(PATCH_END) + len(PATCH_END) + 1
            arguments[key] = value[:start] + codex_patch(turn.file, before, after) + value[end:]
    return json.dumps(arguments)


def _file_path(turn: EditTurn) -> str:
    arguments = {} if turn.custom or turn.tool is None else json.loads(turn.expected)
    for value in arguments.values():
        if isinstance(value, str) and value.endswith(turn.file):
            return value
    return turn.file


def _call(surface: str, call_id: str, name: str, arguments: str, custom: bool) -> Message:
    kind = surface_kind(surface)
    if kind == "messages":
        block = {"type": "tool_use", "id": call_id, "name": name, "input": json.loads(arguments)}
        return {"role": "assistant", "content": [block]}
    if kind == "responses":
        if custom:
            return {
                "type": "custom_tool_call",
                "call_id": call_id,
                "name": name,
                "input": arguments,
            }
        return {"type": "function_call", "call_id": call_id, "name": name, "arguments": arguments}
    function = {"name": name, "arguments": arguments}
    return {
        "role": "assistant",
        "content": None,
        "tool_calls": [{"id": call_id, "type": "function", "function": function}],
    }


def _result(surface: str, call_id: str, text: str, custom: bool) -> Message:
    kind = surface_kind(surface)
    if kind == "messages":
        block = {"type": "tool_result", "tool_use_id": call_id, "content": text}
        return {"role": "user", "content": [block]}
    if kind == "responses":
        kind_name = "custom_tool_call_output" if custom else "function_call_output"
        return {"type": kind_name, "call_id": call_id, "output": text}
    return {"role": "tool", "tool_call_id": call_id, "content": text}


def assistant_says(surface: str, text: str) -> Message:
    """An assistant's text answer on a surface."""
    kind = surface_kind(surface)
    if kind == "messages":
        return {"role": "assistant", "content": [{"type": "text", "text": text}]}
    if kind == "responses":
        content = [{"type": "output_text", "text": text}]
        return {"type": "message", "role": "assistant", "content": content}
    return {"role": "assistant", "content": text}


def _body(turn: EditTurn, items: list[Message]) -> dict[str, Any]:
    body = copy.deepcopy(turn.body)
    body["input" if surface_kind(turn.surface) == "responses" else "messages"] = items
    return body


def _tool_session(turn: EditTurn, tasks: list[Rename]) -> list[ScriptedTurn]:
    captured = renames(turn, 1)[0]
    parts = _Conversation(turn, captured)
    read = parts.read()
    path = _file_path(turn)
    conversation = parts.before_task()
    turns: list[ScriptedTurn] = []
    done: list[Rename] = []
    for k, rename in enumerate(tasks):
        before = turn.file_before
        for earlier in done:
            before = earlier.apply(before)
        after = rename.apply(before)
        conversation = conversation + parts.task(captured, rename, first=k == 0)
        # Open: the model reads the file (the captured read call).
        turns.append(ScriptedTurn("open", _body(turn, conversation), json.dumps(read[0])))
        conversation = conversation + _renamed(_with_ids(read, k), done)
        arguments = _edit_arguments(turn, before, after)
        turns.append(ScriptedTurn("edit", _body(turn, conversation), arguments))
        call_id = f"call_edit_{k}"
        assert turn.tool is not None
        result = EDIT_RESULTS[turn.agent].format(path=path, file=turn.file)
        if turn.agent == "codex":
            # Codex's shell tool reports as its read did: the same header, this output.
            output = str(read[-1].get("output", ""))
            result = output[: output.index("Output:\n") + len("Output:\n")] + result
        conversation = [
            *conversation,
            _call(turn.surface, call_id, turn.tool, arguments, turn.custom),
            _result(turn.surface, call_id, result, turn.custom),
        ]
        said = DONE.format(file=turn.file)
        turns.append(ScriptedTurn("close", _body(turn, conversation), said))
        conversation = [*conversation, assistant_says(turn.surface, said)]
        done.append(rename)
    return turns


def _with_ids(read: list[Message], k: int) -> list[Message]:
    """The captured read call and result, their call id made the task's own after the first."""
    if k == 0:
        return read
    text = json.dumps(read)
    for old in set(re.findall(r'"(?:id|call_id|tool_use_id|tool_call_id)": "([^"]+)"', text)):
        text = text.replace(f'"{old}"', f'"{old}_{k}"')
    return list(json.loads(text))


def _aider_session(turn: EditTurn, tasks: list[Rename]) -> list[ScriptedTurn]:
    """aider: the file comes with every instruction; earlier tasks stay as chat history."""
    items = _items(turn.surface, turn.body)
    captured = renames(turn, 1)[0]
    parts = _Conversation(turn, captured)
    task_at = parts.task_at
    files_at = max(i for i, m in enumerate(items[:task_at]) if turn.file_before in _task_text(m))
    turns: list[ScriptedTurn] = []
    history: list[Message] = []
    done: list[Rename] = []
    for rename in tasks:
        before = turn.file_before
        for earlier in done:
            before = earlier.apply(before)
        instruction = parts.task(captured, rename)
        files = _renamed(items[files_at:task_at], done)
        body = _body(turn, items[:files_at] + history + files + instruction)
        answer = aider_whole(turn.file, rename.apply(before))
        turns.append(ScriptedTurn("edit", body, answer))
        history = history + instruction + [assistant_says(turn.surface, answer)]
        done.append(rename)
    return turns


def edit_session(turn: EditTurn, tasks: int = 2, variant: int = 0) -> EditSession:
    """One agent's session of `tasks` renames, grown around its captured edit turn."""
    plan = renames(turn, tasks, variant)
    steps = _tool_session(turn, plan) if turn.tool is not None else _aider_session(turn, plan)
    return EditSession(
        id=f"{turn.agent}-v{variant}",
        agent=turn.agent,
        surface=turn.surface,
        path=turn.path,
        turns=tuple(steps),
    )


def edit_sessions(
    count: int,
    tasks: int = 2,
    agents: Sequence[str] = (),
    first_variant: int = 0,
    system_chars: int | None = None,
) -> list[EditSession]:
    """`count` sessions, the captured agents in turn (each a new variant once all have had one),
    from `first_variant` on: another run's sessions with the same agents and new tasks. With
    `system_chars`, each turn trimmed (edit_turns.trimmed): the tools it calls, short system
    texts."""
    captured = [t for t in load_all() if not agents or t.agent in agents]
    if system_chars is not None:
        captured = [trimmed(t, system_chars) for t in captured]
    if not captured:
        raise ValueError(f"no captured edit turn for agents {list(agents)}")
    n = len(captured)
    return [edit_session(captured[i % n], tasks, first_variant + i // n) for i in range(count)]
