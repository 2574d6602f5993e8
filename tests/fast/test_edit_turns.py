"""Real agents' captured edit turns (tests/data/edit_turns/): shape, edit and class (fast tier)."""

from __future__ import annotations

import copy
import json

import pytest

from loadtests.edit_turns import (
    DATA_DIR,
    EditTurn,
    edit_opening,
    edit_turns,
    holds_file,
    load_all,
    offered,
    text_of,
    tool_calls,
    tool_results,
    written,
)
from proxy.api.surfaces import SURFACES, Surface
from proxy.routing.classifier import TaskClassifier
from scripts import edit_turns_benchmark

# Every agent scripts/capture_edit_turns.py captures: four with tool calls, aider with text.
AGENTS = ("aider", "claude-code", "codex", "opencode", "qwen-code")
TURNS = {turn.agent: turn for turn in load_all()}
KEYS = {
    "agent",
    "version",
    "captured_at",
    "task",
    "surface",
    "path",
    "file",
    "expected",
    "file_before",
    "file_after",
    "body",
}


def surface_of(turn: EditTurn) -> Surface:
    """The proxy's surface for the turn's path."""
    return next(s for s in SURFACES if s.path == turn.surface)


def test_every_agent_has_one_turn_that_parses() -> None:
    assert sorted(TURNS) == sorted(AGENTS)
    for path in sorted(DATA_DIR.glob("*.json")):
        data = json.loads(path.read_text(encoding="utf-8"))
        assert set(data) == KEYS, path.name
        assert path.stem == data["agent"]
        assert data["version"] and data["version"] != "?"
    assert len(edit_turns()) == len(AGENTS)
    assert (DATA_DIR / "README.md").is_file()


@pytest.mark.parametrize("agent", AGENTS)
def test_the_body_is_its_surfaces_shape(agent: str) -> None:
    turn = TURNS[agent]
    surface = surface_of(turn)
    assert surface.generates
    surface.check(copy.deepcopy(turn.body))  # the proxy's own validation accepts it
    body = turn.body
    if turn.surface == "/v1/responses":
        assert isinstance(body["input"], list)
        kinds = {item.get("type") for item in body["input"]}
        assert kinds & {"function_call_output", "custom_tool_call_output"}
    elif turn.surface == "/v1/messages":
        assert isinstance(body["messages"], list) and body["max_tokens"] > 0
        last = body["messages"][-1]
        assert last["role"] == "user"
        assert any(b.get("type") == "tool_result" for b in last["content"])
    else:
        assert turn.surface == "/v1/chat/completions"
        assert isinstance(body["messages"], list)
        assert body["messages"][-1]["role"] == ("user" if agent == "aider" else "tool")


@pytest.mark.parametrize("agent", AGENTS)
def test_the_file_before_the_edit_is_in_the_body(agent: str) -> None:
    turn = TURNS[agent]
    if turn.tool is None:
        # aider: the file comes in a user message, fenced under its name; no tools at all.
        assert not turn.body.get("tools")
        users = [text_of(m["content"]) for m in turn.body["messages"] if m["role"] == "user"]
        assert any(holds_file(text, turn.file_before) and turn.file in text for text in users)
        return
    # The first tool call read the file; its result, the turn's newest, shows it whole.
    assert len(tool_calls(turn.surface, turn.body)) == 1
    results = tool_results(turn.surface, turn.body)
    assert len(results) == 1
    assert holds_file(results[0], turn.file_before)


@pytest.mark.parametrize("agent", AGENTS)
def test_the_expected_edit_gives_the_file_after(agent: str) -> None:
    turn = TURNS[agent]
    assert turn.file_after != turn.file_before
    assert turn.file_after == turn.file_before.replace("parse_line", "split_line")
    assert turn.applied() == turn.file_after
    if turn.tool is None:
        return
    # A tool the body offers, called as its schema says.
    tool = offered(turn.surface, turn.body)[turn.tool]
    assert tool.kind == ("custom" if turn.custom else "function")
    if not turn.custom:
        arguments = json.loads(turn.expected)
        assert isinstance(arguments, dict) and set(arguments) <= set(tool.properties)


def test_a_wrong_edit_does_not_pass_for_the_expected_one() -> None:
    for turn in TURNS.values():
        wrong = turn.expected.replace("split_line", "splitline")
        assert turn.applied(wrong) != turn.file_after


@pytest.mark.parametrize("agent", AGENTS)
def test_the_classifier_routes_each_edit_turn_as_echo(agent: str) -> None:
    turn = TURNS[agent]
    view = surface_of(turn).view(turn.body)
    assert TaskClassifier().classify(view) == "echo"


@pytest.mark.parametrize("agent", AGENTS)
def test_an_edits_opening_stops_where_the_model_starts_copying_the_file(agent: str) -> None:
    turn = TURNS[agent]
    opening, whole = edit_opening(turn), written(turn)
    assert whole.startswith(opening) and len(opening) < len(whole) // 4
    rest = whole[len(opening) :]
    if turn.tool is None:
        assert rest.startswith(turn.file_after.splitlines()[0])
    elif "*** Update File" in opening:
        assert rest.startswith("@@")
    else:
        assert rest.startswith(json.dumps(turn.file_after)[1:20])


@pytest.mark.parametrize("agent", AGENTS)
def test_a_prefilled_edit_turn_passes_its_surfaces_validation(agent: str) -> None:
    turn = TURNS[agent]
    body = edit_turns_benchmark.request_body(turn, "plain", "kolasu", 64, prefill=True)
    surface_of(turn).check(copy.deepcopy(body))
    names = edit_turns_benchmark.defined_names(turn.file_before, turn.file_after)
    share = edit_turns_benchmark.written_share
    whole = edit_turns_benchmark.renamed(written(turn), names, "kolasu")
    assert share(turn, names, "kolasu", whole) == 1.0
    assert share(turn, names, "kolasu", edit_opening(turn)) == 0.0
    half = whole[: (len(edit_opening(turn)) + len(whole)) // 2]
    assert 0.45 < share(turn, names, "kolasu", half) < 0.55
