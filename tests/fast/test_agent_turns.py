"""Agent turns classed by their history, and the CPU meter that tells a busy machine (fast tier)."""

from __future__ import annotations

import os
import subprocess
import sys
import time

from proxy.backends.contention import CONTENDED_SHARE, CpuMeter
from proxy.routing.agent_turns import next_answer_class, session_intent
from proxy.routing.classifier import TaskClassifier

FILE = "\n".join(f"    line_{i} = compute({i})" for i in range(40))
TOOLS = [{"type": "function", "function": {"name": "read_file", "parameters": {}}}]


def openai_turns(instruction: str, *history: dict[str, object]) -> list[dict[str, object]]:
    return [
        {"role": "system", "content": "agent"},
        {"role": "user", "content": instruction},
        *history,
    ]


def call(name: str, arguments: str = "{}") -> dict[str, object]:
    fn = {"name": name, "arguments": arguments}
    return {"role": "assistant", "content": None, "tool_calls": [{"id": "1", "function": fn}]}


def result(text: str) -> dict[str, object]:
    return {"role": "tool", "tool_call_id": "1", "content": text}


def test_a_change_asked_and_the_file_read_makes_an_edit_due() -> None:
    read = openai_turns("rename compute to evaluate in app.py", call("read_file"), result(FILE))
    assert next_answer_class(read) == "echo"
    # Nothing read yet: the next answer is the read itself, a short tool call.
    assert next_answer_class(openai_turns("rename compute in app.py")) == "code"
    # A question about the file is answered in prose once it is read; first comes the read.
    explain = openai_turns("what does app.py do?", call("read_file"), result(FILE))
    assert next_answer_class(explain) == "prose"
    assert next_answer_class(openai_turns("what does app.py do?")) == "code"
    # Once the edit is made and succeeded, the edit is done.
    edited = [*read, call("write_file", '{"path": "app.py", "content": "x"}'), result("ok")]
    assert next_answer_class(edited) == "code"
    # A failed edit is retried with the file in view.
    failed = [*read, call("edit", '{"old_string": "a", "new_string": "b"}')]
    failed.append(result("Error: old_string not found in app.py"))
    assert next_answer_class(failed) == "echo"
    # A new instruction about a file already read is answered by its edit.
    follow = [*edited, {"role": "assistant", "content": "Done."}]
    follow.append({"role": "user", "content": "now also add a docstring to evaluate"})
    assert next_answer_class(follow) == "echo"


def test_a_sessions_intent_is_its_first_instruction() -> None:
    assert session_intent(openai_turns("rename compute in app.py", result(FILE))) == "change"
    assert session_intent(openai_turns("why does app.py crash on start?")) == "question"
    assert session_intent(openai_turns("run the test suite")) == "other"
    # A later instruction does not change what the session set out to do.
    later = [*openai_turns("explain app.py"), {"role": "user", "content": "now fix it"}]
    assert session_intent(later) == "question"


def test_anthropic_and_responses_shapes_read_alike() -> None:
    anthropic = [
        {"role": "user", "content": [{"type": "text", "text": "fix the bug in app.py"}]},
        {"role": "assistant", "content": [{"type": "tool_use", "name": "Read", "input": {}}]},
        {"role": "user", "content": [{"type": "tool_result", "content": FILE}]},
    ]
    assert next_answer_class(anthropic) == "echo"
    responses = [
        {"role": "user", "content": [{"type": "input_text", "text": "fix the bug in app.py"}]},
        {"type": "function_call", "name": "shell", "arguments": '{"command": ["cat", "a"]}'},
        {"type": "function_call_output", "output": FILE},
    ]
    assert next_answer_class(responses) == "echo"


def test_qwen_template_turns_read_alike() -> None:
    # Small Qwen models write calls as text; results come back as <tool_response> user turns.
    text_call = '<tools>{"name": "read_file", "arguments": {"path": "app.py"}}</tools>'
    turns = openai_turns("rename compute in app.py", {"role": "assistant", "content": text_call})
    turns.append({"role": "user", "content": f"<tool_response>\n{FILE}\n</tool_response>"})
    assert next_answer_class(turns) == "echo"
    written = '<tool_call>{"name": "write_file", "arguments": {"content": "x"}}</tool_call>'
    turns += [{"role": "assistant", "content": written}]
    turns.append({"role": "user", "content": "<tool_response>\nok\n</tool_response>"})
    assert next_answer_class(turns) == "code"


def test_the_classifier_routes_agent_turns_through_it() -> None:
    classifier = TaskClassifier()
    body = {"messages": openai_turns("rename x in app.py", call("read_file"), result(FILE))}
    assert classifier.classify({**body, "tools": TOOLS}) == "echo"
    assert classifier.classify({"messages": openai_turns("rename x"), "tools": TOOLS}) == "code"


def test_an_answer_the_client_began_is_classed_as_the_turn_it_continues() -> None:
    read = openai_turns("rename compute to evaluate in app.py", call("read_file"), result(FILE))
    begun = '<tool_call>\n{"name": "write_file", "arguments": {"content": "def evaluate('
    assert next_answer_class([*read, {"role": "assistant", "content": begun}]) == "echo"
    explain = openai_turns("what does app.py do?", call("read_file"), result(FILE))
    assert next_answer_class([*explain, {"role": "assistant", "content": "It"}]) == "prose"


def test_the_cpu_meter_sees_another_program_and_not_its_own() -> None:
    meter = CpuMeter(lambda: [])
    # Half the machine's cores busy: half its CPU time, whatever the machine.
    hogs = [
        subprocess.Popen([sys.executable, "-c", "while True: pass"])
        for _ in range(max(1, (os.cpu_count() or 2) // 2))
    ]
    try:
        own = CpuMeter(lambda: [h.pid for h in hogs])
        start, start_own = meter.snapshot(), own.snapshot()
        time.sleep(1.0)
        busy = meter.foreign_share(start, meter.snapshot())
        counted_as_ours = own.foreign_share(start_own, own.snapshot())
    finally:
        for hog in hogs:
            hog.kill()
            hog.wait()
    assert busy is not None and counted_as_ours is not None
    assert busy >= CONTENDED_SHARE
    # The same processes counted as the proxy's own are not other programs: their half of
    # the machine is not in the share (whatever else runs beside the test).
    assert counted_as_ours <= busy - 0.3
