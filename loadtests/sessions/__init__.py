"""Coding-agent sessions, deterministic from a seed, replayed turn by turn with the real answers.

A session is what an agent such as Codex, opencode or Qwen Code sends (docs/agents.md): a long
system prompt of agent instructions, tool definitions in OpenAI chat ``tools`` format (read_file,
write_file, edit, grep, list_files, run_shell), and a conversation that grows by one answer and its
tool results per turn, so consecutive turns share a prefix of thousands of tokens. The session
works on a small generated repository (Python and JavaScript, 60-200 lines a file) and follows a
script of tasks: read a file, rewrite it whole with write_file, change it with edit
(old_string/new_string), search with grep, or explain something in prose. Which model answer
comes back is up to the model: whatever it returns is appended as it came (content and/or
tool_calls), each tool call gets a deterministic result computed from the repository (file text,
"ok" with a line count, grep hits), and the script's next instruction follows when a task ends.

    sessions = build_sessions("edit-heavy", count=3, seed=0, system_tokens=6000)
    body = sessions[0].next_request("auto")       # a chat body, max_tokens set for the turn kind
    sessions[0].observe(message, finish_reason)   # the assistant message exactly as returned

``send_turn`` makes one streamed request of a session and measures it (time to first token,
llama.cpp's timings, the proxy's headers); the session benchmark and the Locust agent user use it.

The package, one concern a module: ``shapes`` (shapes, turn kinds, budgets), ``tools`` (the tool
definitions), ``system_prompt`` (instructions from ``instructions.md``, then project context),
``repository`` (the generated application, from ``entities``, ``python_files``,
``javascript_files`` and the text files under ``templates/``), ``names`` and ``script`` (the
user's instructions), ``repair`` (cut and written-out tool calls), ``workspace`` (tool results),
``session`` (the conversation), ``client`` (one turn over HTTP) and ``samples`` (Locust records).
"""

from loadtests.sessions.client import AnswerStream, TurnResult, send_turn
from loadtests.sessions.entities import Entity
from loadtests.sessions.names import Symbols, symbols
from loadtests.sessions.repair import repair_arguments, text_tool_calls
from loadtests.sessions.repository import build_repository, hash_seed
from loadtests.sessions.samples import TurnSample, cached_share, read_turn_samples, turn_sample
from loadtests.sessions.script import Task, build_script
from loadtests.sessions.session import Session, build_session, build_sessions
from loadtests.sessions.shapes import (
    AFFINITY_HEADER,
    AGENT_TASKS,
    CHARS_PER_TOKEN,
    DEFAULT_SYSTEM_TOKENS,
    DEFAULT_TURNS,
    EXPECTED_TOOL,
    MAX_TOKENS,
    SHAPES,
    Shape,
    TurnKind,
    estimate_tokens,
    is_agent_task,
)
from loadtests.sessions.system_prompt import build_system_prompt
from loadtests.sessions.tools import tool_definitions
from loadtests.sessions.workspace import Workspace

__all__ = [
    "AFFINITY_HEADER",
    "AGENT_TASKS",
    "CHARS_PER_TOKEN",
    "DEFAULT_SYSTEM_TOKENS",
    "DEFAULT_TURNS",
    "EXPECTED_TOOL",
    "MAX_TOKENS",
    "SHAPES",
    "AnswerStream",
    "Entity",
    "Session",
    "Shape",
    "Symbols",
    "Task",
    "TurnKind",
    "TurnResult",
    "TurnSample",
    "Workspace",
    "build_repository",
    "build_script",
    "build_session",
    "build_sessions",
    "build_system_prompt",
    "cached_share",
    "estimate_tokens",
    "hash_seed",
    "is_agent_task",
    "read_turn_samples",
    "repair_arguments",
    "send_turn",
    "symbols",
    "text_tool_calls",
    "tool_definitions",
    "turn_sample",
]
