"""One agent conversation: its requests turn by turn, grown by each answer and its tool results."""

from __future__ import annotations

import json
import random
from dataclasses import dataclass, field
from typing import Any, Final, Literal

from loadtests.sessions.repair import repair_arguments, text_tool_calls
from loadtests.sessions.repository import build_repository, hash_seed
from loadtests.sessions.script import Task, build_script
from loadtests.sessions.shapes import (
    AFFINITY_HEADER,
    DEFAULT_SYSTEM_TOKENS,
    DEFAULT_TURNS,
    EXPECTED_TOOL,
    MAX_TOKENS,
    SHAPES,
    Shape,
    TurnKind,
)
from loadtests.sessions.system_prompt import build_system_prompt
from loadtests.sessions.tools import tool_definitions
from loadtests.sessions.workspace import Workspace

# Below this many system tokens the tools are described in one sentence each, so a session fits
# a small test context (2,048 tokens).
_BRIEF_TOOLS_BELOW: Final = 2000


@dataclass
class Session:
    """One agent conversation: its script, its repository, and the messages sent so far."""

    id: str
    shape: Shape
    system: str
    tools: list[dict[str, Any]]
    tasks: list[Task]
    workspace: Workspace
    max_turns: int
    max_tokens_cap: int = 0
    text_tools: bool = True
    messages: list[dict[str, Any]] = field(default_factory=list)
    turns_done: int = 0
    last_style: Literal["call", "text"] | None = None
    _task: int = 0
    _step: int = 0
    _retried: bool = False
    _opened: bool = False

    def __post_init__(self) -> None:
        if not self.messages:
            self.messages.append({"role": "system", "content": self.system})

    @property
    def done(self) -> bool:
        """Whether the session has made all its turns (or run out of script)."""
        return self.turns_done >= self.max_turns or self._task >= len(self.tasks)

    @property
    def kind(self) -> TurnKind:
        """The kind of the turn next_request makes (or made, until observe)."""
        task = self.tasks[min(self._task, len(self.tasks) - 1)]
        return task.kinds[min(self._step, len(task.kinds) - 1)]

    @property
    def headers(self) -> dict[str, str]:
        """What every request of this session carries besides the body."""
        return {AFFINITY_HEADER: self.id}

    def max_tokens(self) -> int:
        """The token budget of the next turn: by its kind, capped by max_tokens_cap if set."""
        budget = MAX_TOKENS[self.kind]
        return min(budget, self.max_tokens_cap) if self.max_tokens_cap else budget

    def next_request(self, model: str = "auto") -> dict[str, Any] | None:
        """The chat body of the next turn, or None once the session is done."""
        if self.done:
            return None
        if not self._opened:
            self.messages.append({"role": "user", "content": self.tasks[self._task].prompt})
            self._opened = True
        return {
            "model": model,
            "messages": list(self.messages),
            "tools": self.tools,
            "tool_choice": "auto",
            "max_tokens": self.max_tokens(),
            "temperature": 0,
            "stream": True,
            "stream_options": {"include_usage": True},
        }

    def observe(self, message: dict[str, Any], finish_reason: str | None = None) -> list[str]:
        """Append the answer as it came and a result per tool call; the tools it called."""
        calls: list[dict[str, Any]] = []
        for i, call in enumerate(message.get("tool_calls") or []):
            function = call.get("function") or {}
            calls.append(
                {
                    "id": call.get("id") or f"call_{self.turns_done}_{i}",
                    "type": "function",
                    "function": {
                        "name": str(function.get("name") or ""),
                        "arguments": repair_arguments(str(function.get("arguments") or "")),
                    },
                }
            )
        content = message.get("content")
        assistant: dict[str, Any] = {"role": "assistant", "content": content or None}
        if calls:
            assistant["tool_calls"] = calls
        else:
            assistant["content"] = content or ""
        self.messages.append(assistant)
        for call in calls:
            self.messages.append(
                {
                    "role": "tool",
                    "tool_call_id": call["id"],
                    "content": self._result(
                        call["function"]["name"], call["function"]["arguments"]
                    ),
                }
            )
        called = [c["function"]["name"] for c in calls]
        self.last_style = "call" if calls else None
        if not calls and self.text_tools:
            written = text_tool_calls(content or "")
            if written:
                # Qwen's chat template renders tool results as a user turn of <tool_response>
                # blocks: the same text, sent as the model was told to expect it.
                results = [self._result(name, args) for name, args in written]
                self.messages.append(
                    {
                        "role": "user",
                        "content": "\n".join(
                            f"<tool_response>\n{r}\n</tool_response>" for r in results
                        ),
                    }
                )
                called = [name for name, _ in written]
                self.last_style = "text"
        self.turns_done += 1
        self._advance(called)
        return called

    def _result(self, name: str, arguments: str) -> str:
        try:
            args = json.loads(arguments)
        except ValueError:
            return "Error: the arguments are not valid JSON."
        if not isinstance(args, dict):
            return "Error: the arguments must be a JSON object."
        return self.workspace.run(name, args)

    def _advance(self, called: list[str]) -> None:
        """Next step of the task after tool calls, else the next task.

        An agent hands every tool result back to the model. A call of another tool than the
        step expects (reading the file again before editing it) keeps the step once.
        """
        task = self.tasks[self._task]
        if not called:
            self._next_task()
            return
        expected = EXPECTED_TOOL[task.kinds[self._step]]
        if expected is not None and expected not in called and not self._retried:
            self._retried = True
            return
        self._step += 1
        self._retried = False
        if self._step >= len(task.kinds):
            self._next_task()

    def _next_task(self) -> None:
        self._task += 1
        self._step = 0
        self._retried = False
        self._opened = False


def build_session(
    shape: Shape,
    index: int,
    seed: int = 0,
    system_tokens: int = DEFAULT_SYSTEM_TOKENS,
    turns: int = DEFAULT_TURNS,
    max_tokens_cap: int = 0,
) -> Session:
    """Session number `index` of a shape: the same seed and index always give the same one."""
    if shape not in SHAPES:
        raise ValueError(f"shape {shape!r}; the shapes are {', '.join(SHAPES)}")
    session_id = f"{shape}-s{seed}-{index}"
    rng = random.Random(session_id)
    repo, description = build_repository(hash_seed(f"{seed}:{index}"))
    system = build_system_prompt(system_tokens, session_id, description, repo, rng)
    return Session(
        id=session_id,
        shape=shape,
        system=system,
        tools=tool_definitions(brief=system_tokens < _BRIEF_TOOLS_BELOW),
        tasks=build_script(shape, repo, turns, rng),
        workspace=Workspace(dict(repo)),
        max_turns=turns,
        max_tokens_cap=max_tokens_cap,
    )


def build_sessions(
    shape: Shape,
    count: int,
    seed: int = 0,
    system_tokens: int = DEFAULT_SYSTEM_TOKENS,
    turns: int = DEFAULT_TURNS,
    max_tokens_cap: int = 0,
) -> list[Session]:
    """`count` sessions of a shape, numbered from 0."""
    return [
        build_session(shape, i, seed, system_tokens, turns, max_tokens_cap) for i in range(count)
    ]
