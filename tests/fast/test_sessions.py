"""Agent sessions: what they send, how answers are replayed, and what the benchmark adds up."""

from __future__ import annotations

import ast
import csv
import json
import os
import threading
from collections import Counter
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from typing import Any, ClassVar

import pytest
import requests

from loadtests.report import (
    BARE,
    Cell,
    SweepSetup,
    agent_lines,
    agent_summary,
    write_csv,
    write_markdown,
)
from loadtests.sessions import (
    MAX_TOKENS,
    SHAPES,
    AnswerStream,
    Session,
    TurnSample,
    build_repository,
    build_session,
    build_sessions,
    cached_share,
    estimate_tokens,
    repair_arguments,
    send_turn,
    text_tool_calls,
)
from proxy.api.validation import check_chat
from scripts.session_benchmark import (
    agreement,
    bootstrap_interval,
    markdown,
    ratio_interval,
    summarise,
)
from tests.load_runs import run_summary

# --------------------------------------------------------------------------- building


def test_the_same_seed_and_index_give_the_same_session() -> None:
    one, two = build_session("mixed", 2, seed=7), build_session("mixed", 2, seed=7)
    assert one.system == two.system and one.tools == two.tools
    assert one.tasks == two.tasks and one.workspace.files == two.workspace.files
    other = build_session("mixed", 3, seed=7)
    assert other.tasks != one.tasks and other.workspace.files != one.workspace.files
    assert build_session("mixed", 2, seed=8).workspace.files != one.workspace.files


def test_sessions_share_the_agents_instructions_as_a_prefix() -> None:
    # One agent's sessions start with the same instructions, so a server that has seen one
    # holds the next one's first thousands of tokens.
    a, b = build_sessions("edit-heavy", 2, seed=0)
    shared = os.path.commonprefix([a.system, b.system])  # noqa: RUF071 (text, not paths)
    assert estimate_tokens(shared) > 3000
    assert a.system != b.system  # the project part is each session's own


@pytest.mark.parametrize("tokens", [300, 2000, 6000, 16000])
def test_the_system_prompt_is_about_as_long_as_asked(tokens: int) -> None:
    system = build_session("mixed", 0, system_tokens=tokens).system
    assert 0.9 * tokens <= estimate_tokens(system) <= 1.02 * tokens


def test_the_system_prompt_is_instructions_not_filler() -> None:
    system = build_session("mixed", 0, system_tokens=6000).system
    instructions = system.split("# Environment")[0]
    assert estimate_tokens(instructions) > 3000
    paragraphs = [p for p in instructions.split("\n\n") if p.strip()]
    assert len(set(paragraphs)) == len(paragraphs)
    assert "# Editing files" in system and "write_file" in system and "old_string" in system


def test_tools_are_openai_function_definitions() -> None:
    tools = build_session("mixed", 0).tools
    names = [t["function"]["name"] for t in tools]
    assert names == ["read_file", "write_file", "edit", "grep", "list_files", "run_shell"]
    for tool in tools:
        assert tool["type"] == "function"
        params = tool["function"]["parameters"]
        assert params["type"] == "object" and set(params["required"]) <= set(params["properties"])
    brief = build_session("mixed", 0, system_tokens=300).tools
    assert len(json.dumps(brief)) < len(json.dumps(tools))


@pytest.mark.parametrize("seed", range(12))
def test_repository_files_look_like_real_code(seed: int) -> None:
    files, description = build_repository(seed)
    assert description and len(files) >= 10
    assert any(p.endswith(".py") for p in files) and any(p.endswith(".js") for p in files)
    for path, text in files.items():
        assert 60 <= text.count("\n") <= 200, path
        assert "<<" not in text, path
        if path.endswith(".py"):
            ast.parse(text)


def test_shapes_ask_for_their_kinds_of_turns() -> None:
    kinds = {
        shape: Counter(
            k for s in build_sessions(shape, 4, turns=12) for t in s.tasks for k in t.kinds
        )
        for shape in SHAPES
    }
    edits = {shape: c["write"] + c["edit"] for shape, c in kinds.items()}
    assert edits["explain"] == 0 and kinds["explain"]["explain"] > kinds["explain"]["read"]
    assert edits["edit-heavy"] > kinds["edit-heavy"]["explain"] + kinds["edit-heavy"]["search"]
    assert edits["mixed"] > 0 and kinds["mixed"]["explain"] > 0
    for session in build_sessions("edit-heavy", 4):
        read: set[str | None] = set()
        for t in session.tasks:
            if t.kinds == ("read",):
                read.add(t.path)
            elif t.kinds[0] in ("write", "edit"):
                assert t.path in read  # an edit is of a file the conversation holds


# --------------------------------------------------------------------------- replay


def _call(name: str, arguments: dict[str, Any] | str, call_id: str = "c1") -> dict[str, Any]:
    args = arguments if isinstance(arguments, str) else json.dumps(arguments)
    return {"id": call_id, "type": "function", "function": {"name": name, "arguments": args}}


def _answer(content: str | None = None, *calls: dict[str, Any]) -> dict[str, Any]:
    message: dict[str, Any] = {"role": "assistant", "content": content}
    if calls:
        message["tool_calls"] = list(calls)
    return message


def _check_body(body: dict[str, Any], session: Session) -> None:
    """A valid OpenAI chat body whose tool messages answer the calls before them."""
    assert check_chat(body) is body
    assert body["stream"] is True and body["stream_options"] == {"include_usage": True}
    assert body["temperature"] == 0 and body["tool_choice"] == "auto"
    assert body["max_tokens"] == MAX_TOKENS[session.kind]
    messages = body["messages"]
    assert messages[0]["role"] == "system" and messages[-1]["role"] in ("user", "tool")
    pending: set[str] = set()
    for m in messages[1:]:
        assert m["role"] in ("user", "assistant", "tool")
        if m["role"] == "tool":
            pending.remove(m["tool_call_id"])
        else:
            assert not pending, "every tool call is answered before the next message"
        if m["role"] == "assistant":
            for call in m.get("tool_calls", []):
                json.loads(call["function"]["arguments"])
                pending.add(call["id"])


def test_a_replay_appends_each_answer_and_its_tool_results() -> None:
    session = build_session("edit-heavy", 0, turns=6)
    assert session.headers == {"x-session-affinity": session.id}
    first = session.tasks[0]
    assert first.kinds == ("read",) and first.path is not None
    original = session.workspace.files[first.path]

    body = session.next_request("auto")
    assert body is not None and body["model"] == "auto"
    _check_body(body, session)
    assert body["messages"][-1] == {"role": "user", "content": first.prompt}
    assert session.next_request("auto") == body  # asking again sends the same turn
    assert session.observe(_answer(None, _call("read_file", {"path": first.path}))) == ["read_file"]
    assert session.messages[-2]["tool_calls"][0]["function"]["name"] == "read_file"
    assert session.messages[-1] == {"role": "tool", "tool_call_id": "c1", "content": original}

    # The next task starts with its instruction, after the tool result.
    body = session.next_request("plain")
    assert body is not None
    _check_body(body, session)
    assert body["messages"][-1]["content"] == session.tasks[1].prompt
    assert body["messages"][-2]["role"] == "tool"


def test_writes_and_edits_change_the_files_later_reads_see() -> None:
    session = build_session("edit-heavy", 0, turns=8)
    path = next(iter(session.workspace.files))
    run = session.workspace.run
    assert run("write_file", {"path": f"./{path}", "content": "a = 1\nb = 2\n"}).startswith(
        f"ok: wrote {path} (2 lines;"
    )
    assert run("read_file", {"path": path}) == "a = 1\nb = 2\n"
    assert run("edit", {"path": path, "old_string": "b = 2", "new_string": "b = 3"}).startswith(
        "ok"
    )
    assert run("read_file", {"path": path, "offset": 2, "limit": 1}) == "b = 3\n"
    assert "not found" in run("edit", {"path": path, "old_string": "zzz", "new_string": "y"})
    run("write_file", {"path": path, "content": "x\nx\n"})
    assert "occurs 2 times" in run("edit", {"path": path, "old_string": "x", "new_string": "y"})
    assert "file not found" in run("read_file", {"path": "nope.py"})
    assert "unknown tool" in run("browse", {})
    assert "bad arguments" in run("read_file", {})


def test_grep_returns_path_line_text_hits() -> None:
    session = build_session("mixed", 0)
    name = next(p for p in session.workspace.files if "/services/" in p)
    hits = session.workspace.run("grep", {"pattern": "def page\\(", "include": "*.py"})
    assert any(h.startswith(f"{name}:") and "def page(" in h for h in hits.splitlines())
    everything = session.workspace.run("grep", {"pattern": "import", "path": "."})
    assert everything.count("\n") >= 20
    assert session.workspace.run("grep", {"pattern": "no_such_name_anywhere"}) == (
        "No matches found."
    )


def test_a_text_answer_ends_the_task_and_a_session_ends_after_its_turns() -> None:
    session = build_session("explain", 0, turns=3)
    for _ in range(3):
        body = session.next_request()
        assert body is not None
        _check_body(body, session)
        assert session.observe(_answer("It validates the input.")) == []
    assert session.next_request() is None and session.done
    users = [m["content"] for m in session.messages if m["role"] == "user"]
    assert users == [t.prompt for t in session.tasks[:3]]


def test_a_call_of_another_tool_keeps_the_step_once() -> None:
    session = build_session("edit-heavy", 0, turns=12)
    write = next(i for i, t in enumerate(session.tasks) if t.kinds == ("write",))
    for _ in range(write):
        session.next_request()
        session.observe(_answer("ok"))
    path = session.tasks[write].path
    assert path is not None
    session.next_request()
    assert session.kind == "write"
    # Reading the file again before rewriting it: the model gets to write next.
    session.observe(_answer(None, _call("read_file", {"path": path})))
    assert session.kind == "write" and session.next_request() is not None
    assert session.messages[-1]["role"] == "tool"
    session.observe(_answer(None, _call("write_file", {"path": path, "content": "x = 1\n"})))
    assert session.workspace.files[path] == "x = 1\n"
    assert session.kind != "write" or session.tasks[write + 1].kinds == ("write",)


def test_a_tool_call_cut_by_max_tokens_is_closed_so_the_next_turn_parses() -> None:
    cut = '{"path": "a.py", "content": "import os\\nde'
    assert json.loads(repair_arguments(cut)) == {"path": "a.py", "content": "import os\nde"}
    assert json.loads(repair_arguments('{"path": "a.py", "content"')) == {"path": "a.py"}
    assert json.loads(repair_arguments('{"a": "x\\')) == {"a": "x"}
    assert repair_arguments("") == "{}"
    session = build_session("edit-heavy", 0)
    session.next_request()
    session.observe(_answer(None, _call("write_file", cut)), "length")
    sent = session.messages[-2]["tool_calls"][0]["function"]["arguments"]
    assert json.loads(sent)["content"] == "import os\nde"


def test_tool_calls_written_as_text_are_run_and_answered_as_tool_responses() -> None:
    text = '<tools>\n{"name": "read_file", "arguments": {"path": "x.py"}}\n</tools>'
    assert text_tool_calls(text) == [("read_file", '{"path": "x.py"}')]
    assert text_tool_calls(
        '```json\n{"name": "write_file", "arguments": {"path": "a", "content": "b'
    ) == [("write_file", '{"path": "a", "content": "b"}')]
    # Not one of the tools: an answer, not a call.
    assert text_tool_calls('{"name": "x.py", "arguments": {"command": "read_file"}}') == []

    session = build_session("edit-heavy", 0)
    path = session.tasks[0].path
    assert path is not None
    session.next_request()
    written = f'<tools>\n{{"name": "read_file", "arguments": {{"path": "{path}"}}}}\n</tools>'
    assert session.observe(_answer(written)) == ["read_file"] and session.last_style == "text"
    assert session.messages[-2] == {"role": "assistant", "content": written}
    assert session.messages[-1]["role"] == "user"
    assert session.messages[-1]["content"] == (
        f"<tool_response>\n{session.workspace.files[path]}\n</tool_response>"
    )
    off = build_session("edit-heavy", 0)
    off.text_tools = False
    off.next_request()
    assert off.observe(_answer(written)) == []


def test_a_stream_is_put_back_together_in_whatever_chunks_it_arrives() -> None:
    events = [
        {"choices": [{"index": 0, "delta": {"role": "assistant", "content": None}}]},
        {"choices": [{"index": 0, "delta": {"content": "Reading it."}}]},
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {
                        "tool_calls": [
                            {
                                "index": 0,
                                "id": "call_1",
                                "type": "function",
                                "function": {"name": "read_file", "arguments": '{"pa'},
                            }
                        ]
                    },
                }
            ]
        },
        {
            "choices": [
                {
                    "index": 0,
                    "delta": {"tool_calls": [{"index": 0, "function": {"arguments": 'th": "a"}'}}]},
                }
            ]
        },
        {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
        {"choices": [], "usage": {}, "timings": {"prompt_n": 5, "cache_n": 95, "predicted_n": 9}},
    ]
    raw = b"".join(b"data: " + json.dumps(e).encode() + b"\n\n" for e in events)
    raw += b"data: [DONE]\n\n"
    stream = AnswerStream()
    for i in range(0, len(raw), 7):
        stream.feed(raw[i : i + 7], at_s=i / 100)
    assert stream.done and stream.finish_reason == "tool_calls"
    assert stream.first_token_s is not None and stream.first_token_s > 0
    assert stream.timings["cache_n"] == 95
    assert stream.message == {
        "role": "assistant",
        "content": "Reading it.",
        "tool_calls": [
            {
                "id": "call_1",
                "type": "function",
                "function": {"name": "read_file", "arguments": '{"path": "a"}'},
            }
        ],
    }


class _CannedStream(BaseHTTPRequestHandler):
    """Answers every chat request with one streamed read_file call, as a proxy would."""

    bodies: ClassVar[list[dict[str, Any]]] = []
    headers_seen: ClassVar[list[str | None]] = []

    def do_POST(self) -> None:
        self.bodies.append(json.loads(self.rfile.read(int(self.headers["Content-Length"]))))
        self.headers_seen.append(self.headers.get("x-session-affinity"))
        words = self.bodies[-1]["messages"][-1]["content"].split()
        path = next(w for w in words if "/" in w).rstrip(";.")
        call = {"index": 0, "id": "call_9", "type": "function"}
        call["function"] = {"name": "read_file", "arguments": json.dumps({"path": path})}
        events = [
            {"choices": [{"index": 0, "delta": {"tool_calls": [call]}}]},
            {"choices": [{"index": 0, "delta": {}, "finish_reason": "tool_calls"}]},
            {
                "choices": [],
                "timings": {
                    "prompt_n": 40,
                    "cache_n": 60,
                    "predicted_n": 12,
                    "predicted_per_second": 30.0,
                    "prompt_per_second": 200.0,
                },
            },
        ]
        self.send_response(200)
        self.send_header("Content-Type", "text/event-stream")
        self.send_header("X-Specproxy-Backend", "ngram")
        self.send_header("X-Specproxy-Route", "fastest")
        self.end_headers()
        for event in events:
            self.wfile.write(b"data: " + json.dumps(event).encode() + b"\n\n")
        self.wfile.write(b"data: [DONE]\n\n")

    def log_message(self, *_: Any) -> None:
        pass


def test_send_turn_measures_a_streamed_turn_and_appends_its_answer() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), _CannedStream)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        session = build_session("edit-heavy", 0, turns=1)
        url = f"http://127.0.0.1:{server.server_address[1]}"
        with requests.Session() as http:
            result = send_turn(http, url, session, "auto")
            assert send_turn(http, url, session, "auto") is None  # one turn asked
    finally:
        server.shutdown()
        server.server_close()
    assert result is not None and result.ok, result
    assert (result.backend, result.route, result.finish_reason) == (
        "ngram",
        "fastest",
        "tool_calls",
    )
    assert (result.prompt_n, result.cache_n, result.predicted_n) == (40, 60, 12)
    assert result.predicted_per_second == 30.0 and result.prompt_per_second == 200.0
    assert result.ttft_s is not None and 0 < result.ttft_s <= result.seconds
    assert result.tools_called == ["read_file"] and result.tool_style == "call"
    assert _CannedStream.headers_seen[-1] == session.id
    assert _CannedStream.bodies[-1]["max_tokens"] == MAX_TOKENS["read"]
    assert (
        session.messages[-1]["role"] == "tool" and session.messages[-1]["tool_call_id"] == "call_9"
    )
    assert session.messages[-1]["content"] == session.workspace.files[session.tasks[0].path or ""]


# --------------------------------------------------------------------------- the benchmark


def _row(mode: str, session: str, turn: int, seconds: float, **extra: Any) -> dict[str, Any]:
    row = {
        "mode": mode,
        "shape": "mixed",
        "session": session,
        "turn": turn,
        "kind": "read",
        "error": None,
        "seconds": seconds,
        "ttft_s": seconds / 2,
        "prompt_n": 100,
        "cache_n": 300,
        "predicted_n": 50,
        "predicted_per_second": 25.0,
        "backend": None,
        "route": None,
        "answer": f"{session}:{turn}",
        "tools_called": [],
        "tool_style": None,
    }
    return {**row, **extra}


def test_bootstrap_intervals_bracket_the_estimate() -> None:
    assert bootstrap_interval([4.0, 4.0, 4.0]) == (4.0, 4.0)
    low, high = bootstrap_interval([1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    assert 1.0 <= low < 3.5 < high <= 6.0
    same = {"a": 10.0, "b": 20.0}
    assert ratio_interval(same, same) == (1.0, 1.0, 1.0)
    faster = ratio_interval({"a": 8.0, "b": 16.0, "c": 4.0}, {"a": 10.0, "b": 20.0, "c": 5.0})
    assert faster is not None and faster == pytest.approx((0.8, 0.8, 0.8))
    mixed = ratio_interval({"a": 5.0, "b": 30.0}, {"a": 10.0, "b": 20.0})
    assert mixed is not None and mixed[1] < mixed[0] < mixed[2]
    assert ratio_interval({"a": 1.0}, {"b": 1.0}) is None


def test_summaries_count_complete_sessions_and_prompt_cache() -> None:
    rows = [
        _row("plain", "s0", 0, 2.0),
        _row("plain", "s0", 1, 3.0, cache_n=100, prompt_n=0),
        _row("plain", "s1", 0, 4.0),
        _row("plain", "s1", 1, 1.0, error="HTTP 500: boom"),
    ]
    s = summarise(rows, "plain", "mixed")
    assert s.session_s == {"s0": 5.0} and s.failed_sessions == 1 and s.failed_turns == 1
    assert s.cached_share == pytest.approx(700 / 900)  # the failed turn has no timings
    assert s.decode_tps == pytest.approx(25.0)
    assert s.ttft_p50_s == pytest.approx(1.5)


def test_the_table_compares_every_mode_with_bare_llama_server_and_the_best_pinned() -> None:
    rows = []
    for session, base in (("s0", 10.0), ("s1", 20.0), ("s2", 15.0)):
        rows.append(_row(BARE, session, 0, base))
        rows.append(_row("plain", session, 0, base * 1.1, backend="plain", route="pinned"))
        rows.append(
            _row("ngram", session, 0, base * 0.8, backend="ngram", route="pinned", predicted_n=60)
        )
        rows.append(
            _row("auto", session, 0, base * 0.9, backend="ngram", route="fastest")
            | ({"answer": "different"} if session == "s2" else {})
        )
    report = markdown(rows, ["auto", "plain", "ngram", BARE], ["mixed"])
    lines = {line.split(" | ")[0].lstrip("| "): line for line in report.splitlines()}
    assert "| 0.80 (0.80-0.80) | 1.00 (1.00-1.00) | 3/3 |" in lines["ngram"]
    assert "| 1.10 (1.10-1.10) | 1.38 (1.38-1.38) |" in lines["plain"]
    assert "| 0.90 (0.90-0.90) | 1.12 (1.12-1.12) | 2/3 | ngram:3 | fastest:3 |" in lines["auto"]
    assert lines[BARE].startswith(f"| {BARE} | 3 | 15.0 (")
    assert "- best pinned backend: ngram" in report
    assert agreement(summarise(rows, "auto", "mixed"), summarise(rows, BARE, "mixed")) == (2, 3)


def test_each_concurrency_gets_its_table_with_later_turns_cached_beside_bare() -> None:
    rows = []
    for level, slow in ((1, 1.0), (2, 1.5)):
        for session in (f"s{i}" for i in range(level)):
            for mode, factor, cached in (
                (BARE, 1.0, 900),
                ("auto", slow, 900 if level == 1 else 0),
            ):
                rows += [
                    _row(mode, session, 0, 10.0 * factor, concurrency=level),
                    _row(mode, session, 1, 2.0 * factor, cache_n=cached, prompt_n=1000 - cached)
                    | {"concurrency": level},
                ]
    one, two = summarise(rows, "auto", "mixed", 1), summarise(rows, "auto", "mixed", 2)
    assert one.session_s == {"s0": 12.0} and set(two.session_s) == {"s0", "s1"}
    assert one.later_cached_share == pytest.approx(0.9) and two.later_cached_share == 0.0
    # Rows of a run before --concurrency existed read as one session at a time.
    assert (
        summarise(
            [{k: v for k, v in r.items() if k != "concurrency"} for r in rows[:4]], BARE, "mixed"
        ).turns
        == 2
    )
    report = markdown(rows, [BARE, "auto"], ["mixed"])
    assert "## mixed, 1 session at once" in report and "## mixed, 2 sessions at once" in report
    at_two = report.split("## mixed, 2 sessions at once")[1]
    cells = next(x for x in at_two.splitlines() if x.startswith("| auto |")).split(" | ")
    # later turns cached, and session time over bare llama-server's at the same concurrency
    assert (cells[7], cells[9]) == ("0%", "1.50 (1.50-1.50)"), cells


# --------------------------------------------------------------------------- the sweep's rows


def _turn(session: str, turn: int, start: float, end: float, **extra: Any) -> TurnSample:
    fields: dict[str, Any] = {
        "outcome": "ok",
        "backend": "plain",
        "tokens": 10,
        "tokens_per_s": 20.0,
        "prompt_n": 50,
        "cache_n": 150,
    }
    return TurnSample(
        start=start,
        task="agent-mixed",
        model="plain",
        stream=True,
        end=end,
        session=session,
        turn=turn,
        **(fields | extra),
    )


def test_agent_cells_report_sessions_and_cached_share(tmp_path: Path) -> None:
    samples = [
        _turn("a", 0, 0.0, 4.0),
        _turn("a", 1, 4.0, 6.0),
        _turn("b", 0, 0.0, 5.0),
        _turn("b", 1, 5.0, 9.0, outcome="cut"),
    ]
    agent = agent_summary(samples, turns=2)
    assert (agent.sessions, agent.complete, agent.turns, agent.session_s) == (2, 1, 4, 6.0)
    assert agent.cached_share == cached_share(samples[:3]) == 0.75
    cells = [
        Cell("agent-mixed", "plain", 1, run_summary(10.0), agent),
        Cell("agent-mixed", "ngram", 1, run_summary(12.0), agent_summary(samples[:2], turns=2)),
    ]
    lines = agent_lines(cells, "agent-mixed", ["plain", "ngram"], "plain")
    assert "| plain | 6 s (1/2), TTFT - s, 75% |" in lines
    assert "- ngram: session time ×1.00 at 1 of plain's" in lines
    write_csv(tmp_path / "results.csv", cells)
    header, first, _ = (tmp_path / "results.csv").read_text().splitlines()
    assert header.endswith(",sessions,session_s,cached_share,later_cached_share,session_vs_bare")
    assert first.endswith(",2,6.00,0.750,0.750,")  # no llama-server cell to compare with


def test_agent_cells_report_later_turns_cached_and_time_against_bare_llama_server(
    tmp_path: Path,
) -> None:
    # A bare llama-server that lost each conversation between turns, a proxy that kept it.
    bare = [_turn("a", 0, 0.0, 4.0, cache_n=0), _turn("a", 1, 4.0, 8.0, prompt_n=180, cache_n=20)]
    kept = [_turn("a", 0, 0.0, 4.0, cache_n=0), _turn("a", 1, 4.0, 6.0, prompt_n=20, cache_n=180)]
    first_turn_cached = [_turn("a", 0, 0.0, 4.0, prompt_n=100, cache_n=100), kept[1]]
    agents = {
        BARE: agent_summary(bare, turns=2),
        "plain": agent_summary(kept, turns=2),
        "auto": agent_summary(first_turn_cached, turns=2),
    }
    assert agents[BARE].later_cached_share == 0.1
    assert agents["plain"].later_cached_share == 0.9
    # The first turn's prompt does not count: its cache holds other sessions' instructions.
    assert agents["auto"].later_cached_share == 0.9 and agents["auto"].cached_share == 0.7
    cells = [Cell("agent-mixed", b, 1, run_summary(10.0), a) for b, a in agents.items()]
    cells.append(Cell("code", "plain", 1, run_summary(20.0)))

    write_csv(tmp_path / "results.csv", cells)
    with (tmp_path / "results.csv").open() as f:
        rows = {(r["task"], r["backend"]): r for r in csv.DictReader(f)}
    assert rows[("agent-mixed", BARE)]["session_vs_bare"] == "1.00"
    assert rows[("agent-mixed", "plain")]["session_vs_bare"] == "0.75"
    assert rows[("agent-mixed", "plain")]["later_cached_share"] == "0.900"
    assert rows[("code", "plain")]["session_vs_bare"] == ""

    lines = agent_lines(cells, "agent-mixed", [BARE, "plain", "auto"], "plain")
    assert f"| {BARE} | 8 s, TTFT - s, 10% |" in lines
    assert "| plain | 6 s, TTFT - s, 90% |" in lines
    assert "- plain: session time ×0.75 at 1 of llama-server's" in lines
    setup = SweepSetup("http://proxy", {"plain": "plain"}, "plain", 0.05, "")
    write_markdown(tmp_path / "report.md", cells, setup)
    report = (tmp_path / "report.md").read_text()
    code = report[report.index("## code") :]
    assert "backends llama-server (bare), plain (plain)." in report
    # llama-server is the agents' baseline, not a speculative backend nor one auto could choose.
    assert "No speculative backend measured besides plain" in report and BARE not in code
    assert "- auto at 1: chose nothing; 100% of the best pinned backend (plain," in report
