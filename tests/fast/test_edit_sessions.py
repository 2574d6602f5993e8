"""Captured edit turns grown into agents' sessions (loadtests/edit_sessions.py; fast tier)."""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from loadtests.edit_replay import answer_of, request_body
from loadtests.edit_sessions import (
    EditSession,
    edit_session,
    edit_sessions,
    renames,
    surface_kind,
)
from loadtests.edit_turns import EditTurn, apply_edit, holds_file, load_all, tool_results
from proxy.api.surfaces import SURFACES
from scripts import session_benchmark

TURNS = {turn.agent: turn for turn in load_all()}
AGENTS = sorted(TURNS)
TOOL_AGENTS = [a for a in AGENTS if TURNS[a].tool is not None]


def items(session: EditSession, index: int) -> list[dict[str, Any]]:
    """The conversation request `index` sends."""
    body = session.turns[index].body
    return list(body["input" if surface_kind(session.surface) == "responses" else "messages"])


def file_after(turn: EditTurn, tasks: int, variant: int = 0) -> str:
    """The file once the session's first `tasks` renames are done."""
    text = turn.file_before
    for rename in renames(turn, tasks, variant):
        text = rename.apply(text)
    return text


@pytest.mark.parametrize("agent", AGENTS)
def test_the_first_edit_turn_is_the_captured_request_word_for_word(agent: str) -> None:
    turn = TURNS[agent]
    session = edit_session(turn, tasks=3)
    edit = next(t for t in session.turns if t.step == "edit")
    assert edit.body == turn.body
    assert edit.answer == turn.expected
    assert session.path == turn.path and session.surface == turn.surface


def test_the_captured_rename_is_the_first_task_and_the_rest_rename_other_functions() -> None:
    turn = TURNS["opencode"]
    first, *others = renames(turn, 3)
    assert (first.old, first.new) == ("parse_line", "split_line")
    assert first.apply(turn.file_before) == turn.file_after
    assert {r.old for r in others} == {"unquote", "evaluate"}
    moved = renames(turn, 3, variant=1)
    assert moved[0].old == "parse_line" and moved[0].new.startswith("split_line_")
    assert {r.new for r in moved}.isdisjoint({r.new for r in renames(turn, 3)})
    with pytest.raises(ValueError, match="3 functions to rename, not 4"):
        renames(turn, 4)


@pytest.mark.parametrize("agent", AGENTS)
def test_every_request_passes_its_surfaces_validation(agent: str) -> None:
    session = edit_session(TURNS[agent], tasks=3)
    surface = next(s for s in SURFACES if s.path == session.surface)
    for turn in session.turns:
        surface.check(copy.deepcopy(request_body(session.surface, turn, "auto", 64)))


@pytest.mark.parametrize("agent", TOOL_AGENTS)
def test_a_tool_agents_task_is_read_edit_done_and_the_conversation_only_grows(agent: str) -> None:
    session = edit_session(TURNS[agent], tasks=3)
    assert [t.step for t in session.turns] == ["open", "edit", "close"] * 3
    for i in range(1, len(session.turns)):
        before, now = items(session, i - 1), items(session, i)
        # A prefix kept turn after turn: what a server's prompt cache serves.
        assert now[: len(before)] == before and len(now) > len(before), i


@pytest.mark.parametrize("agent", AGENTS)
def test_each_edit_rewrites_the_file_as_the_earlier_tasks_left_it(agent: str) -> None:
    turn = TURNS[agent]
    session = edit_session(turn, tasks=3, variant=2)
    edits = [t for t in session.turns if t.step == "edit"]
    assert len(edits) == 3
    for k, edit in enumerate(edits):
        before, after = file_after(turn, k, 2), file_after(turn, k + 1, 2)
        shown = tool_results(session.surface, edit.body)
        if turn.tool is None:
            # aider sends the file with the instruction, never an older copy beside it.
            listing = f"{turn.file}\n```"
            shown = [m["content"] for m in edit.body["messages"] if listing in m["content"]]
        assert holds_file(shown[-1], before), k
        assert before != after
        rebased = EditTurn(**{**turn.__dict__, "file_before": before})
        assert apply_edit(turn.tool, edit.answer, rebased) == after, k


def test_aider_keeps_its_earlier_tasks_as_history_before_the_current_file() -> None:
    session = edit_session(TURNS["aider"], tasks=2)
    assert [t.step for t in session.turns] == ["edit", "edit"]
    second = session.turns[1].body["messages"]
    answers = [m["content"] for m in second if m["role"] == "assistant"]
    assert session.turns[0].answer in answers
    files = [
        i for i, m in enumerate(second) if "calc.py\n```" in m["content"] and m["role"] == "user"
    ]
    assert len(files) == 1 and "split_line" in second[files[0]]["content"]


def test_sessions_take_the_agents_in_turn_then_new_variants() -> None:
    sessions = edit_sessions(7, tasks=1)
    assert [s.agent for s in sessions[:5]] == AGENTS
    assert sessions[5].agent == AGENTS[0] and sessions[5].id.endswith("-v1")
    first, again = sessions[0].turns[0].body, sessions[5].turns[0].body
    assert first != again
    task = again["messages"][-1]["content"]
    assert f"`{renames(TURNS['aider'], 1, 1)[0].new}`" in task and "`split_line`" not in task
    assert [s.agent for s in edit_sessions(2, agents=["codex"])] == ["codex", "codex"]
    # A later run starts from a later variant: the same agents, new tasks.
    later = edit_sessions(5, tasks=1, first_variant=1)
    assert [s.id for s in later] == [s.id.replace("-v0", "-v1") for s in sessions[:5]]
    assert later[0].turns[0].body == again
    with pytest.raises(ValueError, match="no captured edit turn"):
        edit_sessions(1, agents=["nobody"])


def test_a_whole_answer_is_read_on_every_surface() -> None:
    chat = {
        "choices": [
            {
                "message": {
                    "content": "",
                    "tool_calls": [{"function": {"name": "write", "arguments": '{"a": 1}'}}],
                }
            }
        ],
        "usage": {"completion_tokens": 7},
    }
    assert answer_of("/v1/chat/completions", chat) == ('{"a": 1}', ["write"], 7)
    messages = {
        "content": [
            {"type": "text", "text": "ok "},
            {"type": "tool_use", "name": "Write", "input": {}},
        ],
        "usage": {"output_tokens": 5},
    }
    assert answer_of("/v1/messages", messages) == ("ok {}", ["Write"], 5)
    responses = {
        "output": [
            {"type": "message", "content": [{"type": "output_text", "text": "hi"}]},
            {"type": "function_call", "name": "exec_command", "arguments": "{}"},
        ],
        "usage": {"output_tokens": 3},
    }
    assert answer_of("/v1/responses", responses) == ("hi{}", ["exec_command"], 3)
    body = request_body("/v1/responses", edit_session(TURNS["codex"]).turns[0], "plain", 9)
    assert body["max_output_tokens"] == 9 and body["stream"] is False and body["model"] == "plain"
    assert json.dumps(body)  # serializable as sent


def test_the_session_benchmark_replays_captured_sessions_as_a_shape_of_its_own() -> None:
    args = session_benchmark.parse_args(
        ["--shapes", "captured-edits,edit-heavy", "--edits", "2", "--agents", "codex,aider"]
    )
    assert args.shapes == ["captured-edits", "edit-heavy"]
    captured = session_benchmark.sessions_of("captured-edits", 3, args)
    replayed = [s for s in captured if isinstance(s, EditSession)]
    assert [s.agent for s in replayed] == ["aider", "codex", "aider"]
    assert len(replayed[1].turns) == 6  # two renames of read, edit, done
    generated = session_benchmark.sessions_of("edit-heavy", 2, args)
    assert not any(isinstance(s, EditSession) for s in generated)
    with pytest.raises(SystemExit):
        session_benchmark.parse_args(["--shapes", "captured"])
