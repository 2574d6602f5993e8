"""Real agents' edit turns, captured against a scripted server: scripts/capture_edit_turns.py [-h].

Each agent gets a small repository (REPOSITORY) and TASK, to rename a function in one file. A
scripted server (no model) answers its first turn with a call of the agent's own read tool for
that file; the request that comes back with the file in a tool result is the *edit turn*,
saved whole; it is answered with the agent's own edit tool (Write, write, write_file, Codex's
apply_patch, as a tool or through its shell) carrying the renamed file, which the agent applies;
everything after that gets "Done.". The file on disk must then be the expected one: that proves
the scripted answer is the edit as the agent takes it. aider (text edits, no tools) is run with
the file on its command line, so its first request is its edit turn, answered in the edit
format its prompt asks for.

Writes one JSON file per agent and a README.md under tests/data/edit_turns/ (loaded by
loadtests/edit_turns.py).
"""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import sys
import tempfile
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.agents import AIDER, COMMANDS, NPM_BIN, Command, finish, start
from loadtests.edit_turns import (
    DATA_DIR,
    Tool,
    aider_search_replace,
    aider_whole,
    codex_patch,
    holds_file,
    load_all,
    offered,
    text_of,
    tool_calls,
    tool_results,
)
from loadtests.scripted_server import (
    Answer,
    Captured,
    Recorder,
    ToolCall,
    scripted_app,
    serve,
)
from scripts.agent_prefixes import text_answer, version

AGENTS = ("claude-code", "codex", "opencode", "qwen-code", "aider")
FILE = "calc.py"
TASK = (
    "In calc.py rename the function `parse_line` to `split_line` everywhere. Change nothing else."
)
# Each agent's own tools, as its requests name them: (read, write).
TOOLS = {
    "claude-code": ("Read", "Write"),
    "opencode": ("read", "write"),
    "qwen-code": ("read_file", "write_file"),
}
# Codex runs commands through one of these (which one depends on its model family).
CODEX_SHELLS = ("shell", "shell_command", "exec_command")
CODEX_PATCH = "apply_patch"
# What the agent runs as: the binary whose installation tells its version.
BINARIES = {
    "claude-code": NPM_BIN / "claude",
    "codex": NPM_BIN / "codex",
    "opencode": NPM_BIN / "opencode",
    "qwen-code": NPM_BIN / "qwen",
    "aider": AIDER,
}

# The repository every agent works in: text that JSON escaping changes (quotes, backslashes,
# tabs as escapes) and indentation; parse_line is used three times in calc.py and nowhere else.
REPOSITORY = {
    "calc.py": r'''"""A calculator for settings files: `name = value` lines, numbers summed."""

from __future__ import annotations

import re

ASSIGNMENT = re.compile(r"^\s*([A-Za-z_]\w*)\s*=\s*(.+?)\s*$")
ESCAPES = {"n": "\n", "t": "\t", "\\": "\\", '"': '"'}


def unquote(text: str) -> str:
    """The value of a double-quoted string, with its backslash escapes undone."""
    out: list[str] = []
    chars = iter(text[1:-1])
    for char in chars:
        if char == "\\":
            escaped = next(chars, "\\")
            out.append(ESCAPES.get(escaped, "\\" + escaped))
        else:
            out.append(char)
    return "".join(out)


def parse_line(line: str) -> tuple[str, str] | None:
    """A `name = value` line as (name, value); None for a blank line or a # comment."""
    if not line.strip() or line.lstrip().startswith("#"):
        return None
    match = ASSIGNMENT.match(line)
    if match is None:
        raise ValueError(f"not an assignment: {line!r}")
    name, value = match.groups()
    return name, value


def evaluate(text: str) -> dict[str, str | float]:
    """Every assignment of a settings text: quoted values as strings, the others summed."""
    values: dict[str, str | float] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        try:
            parsed = parse_line(line)
        except ValueError as exc:
            raise ValueError(f"line {number}: {exc}") from None
        if parsed is None:
            continue
        name, value = parsed
        if value.startswith('"') and value.endswith('"'):
            values[name] = unquote(value)
        else:
            values[name] = sum(float(part) for part in value.split("+"))
    return values


if __name__ == "__main__":
    SAMPLE = 'greeting = "say \\"hi\\"\\tthen\\\\go"\n    total = 1 + 2.5\n# parse_line skips me\n'
    for key, result in evaluate(SAMPLE).items():
        print(f"{key}:\t{result!r}")
''',
    "report.py": r'''"""Settings as a table, for the terminal or for a Markdown file."""

from __future__ import annotations

import sys

from calc import evaluate

SEPARATOR = " | "


def escape(cell: str) -> str:
    """A cell's text with what a Markdown table treats specially escaped."""
    return cell.replace("\\", "\\\\").replace("|", "\\|").replace("\n", "\\n")


def table(values: dict[str, str | float], markdown: bool = False) -> str:
    """One row per setting: its name, then its value."""
    rows = [("name", "value")]
    for name, value in values.items():
        rows.append((name, f"{value:g}" if isinstance(value, float) else value))
    width = max(len(name) for name, _ in rows)
    lines = []
    for name, value in rows:
        if markdown:
            lines.append("| " + escape(name) + SEPARATOR + escape(value) + " |")
        else:
            lines.append(f"{name:<{width}}  {value}")
    if markdown:
        lines.insert(1, "| --- | --- |")
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Print the table of the settings file named on the command line."""
    paths = [arg for arg in argv[1:] if not arg.startswith("--")]
    if len(paths) != 1:
        print("usage: report.py SETTINGS [--markdown]", file=sys.stderr)
        return 2
    with open(paths[0], encoding="utf-8") as handle:
        print(table(evaluate(handle.read()), "--markdown" in argv), end="")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
''',
    "test_calc.py": r'''"""Tests of calc.evaluate and calc.unquote."""

import pytest

from calc import evaluate, unquote


def test_numbers_are_summed() -> None:
    assert evaluate("total = 1 + 2.5\n") == {"total": 3.5}


def test_quoted_values_keep_their_backslashes() -> None:
    assert evaluate('path = "C:\\\\temp\\\\new"\n') == {"path": "C:\\temp\\new"}


def test_escapes_are_undone() -> None:
    assert unquote('"a\\tb\\n\\"c\\""') == 'a\tb\n"c"'


def test_comments_and_blank_lines_are_skipped() -> None:
    text = "# a comment\n\n    indented = 2\n"
    assert evaluate(text) == {"indented": 2.0}


def test_a_line_without_equals_is_an_error() -> None:
    with pytest.raises(ValueError, match="line 2"):
        evaluate("a = 1\nnot an assignment\n")


def test_names_may_hold_underscores_and_digits() -> None:
    assert evaluate("max_size_2 = 10\n") == {"max_size_2": 10.0}
''',
}
BEFORE = REPOSITORY[FILE]
AFTER = BEFORE.replace("parse_line", "split_line")


# --- the tools a request offers ---------------------------------------------------------------


def path_key(tool: Tool) -> str:
    """The parameter that names the file (file_path, filePath, absolute_path)."""
    found = next((k for k in tool.properties if "path" in k.lower()), None)
    if found is None:
        raise LookupError(f"{tool.name} takes no path: {sorted(tool.properties)}")
    return found


def shell_arguments(tool: Tool, command: str, workdir: Path) -> dict[str, Any]:
    """Arguments of a Codex shell tool running one command: an argv list or a command line."""
    if "cmd" in tool.properties:  # exec_command
        arguments: dict[str, Any] = {"cmd": command}
    elif tool.properties.get("command", {}).get("type") == "array":  # shell
        arguments = {"command": ["bash", "-lc", command]}
    else:  # shell_command
        arguments = {"command": command}
    if "workdir" in tool.properties:
        arguments["workdir"] = str(workdir)
    return arguments


def call(name: str, arguments: dict[str, Any], call_id: str) -> ToolCall:
    """A function tool call, its arguments JSON as models write it (one line, spaced)."""
    return ToolCall(name, json.dumps(arguments, ensure_ascii=False), call_id=call_id)


def read_call(agent: str, tools: dict[str, Tool], workdir: Path) -> ToolCall:
    """The agent's own read tool called for FILE (Codex: its shell running cat)."""
    if agent == "codex":
        shell = tools[next(n for n in CODEX_SHELLS if n in tools)]
        return call(shell.name, shell_arguments(shell, f"cat {FILE}", workdir), "call_read")
    tool = tools[TOOLS[agent][0]]
    return call(tool.name, {path_key(tool): str(workdir / FILE)}, "call_read")


def edit_call(agent: str, tools: dict[str, Tool], workdir: Path) -> ToolCall:
    """The agent's own edit tool carrying AFTER: a whole-file write, or Codex's apply_patch."""
    if agent == "codex":
        patch = codex_patch(FILE, BEFORE, AFTER)
        tool = tools.get(CODEX_PATCH)
        if tool is not None and tool.kind == "custom":
            return ToolCall(tool.name, patch, custom=True, call_id="call_edit")
        if tool is not None:
            key = next(iter(tool.properties), "input")
            return call(tool.name, {key: patch}, "call_edit")
        # No apply_patch tool: Codex takes a shell call of apply_patch as the patch itself.
        shell = tools[next(n for n in CODEX_SHELLS if n in tools)]
        if shell.properties.get("command", {}).get("type") == "array":
            return call(shell.name, {"command": [CODEX_PATCH, patch]}, "call_edit")
        heredoc = f"{CODEX_PATCH} <<'EOF'\n{patch}EOF\n"
        return call(shell.name, shell_arguments(shell, heredoc, workdir), "call_edit")
    tool = tools[TOOLS[agent][1]]
    return call(tool.name, {path_key(tool): str(workdir / FILE), "content": AFTER}, "call_edit")


def aider_answer(body: dict[str, Any]) -> str:
    """aider's edit in the format its system prompt asks for: SEARCH/REPLACE or whole file."""
    system = " ".join(
        str(m.get("content")) for m in body.get("messages") or [] if m.get("role") == "system"
    )
    if "<<<<<<< SEARCH" in system:
        return aider_search_replace(FILE, BEFORE, AFTER)
    return aider_whole(FILE, AFTER)


# --- one agent's scripted session -------------------------------------------------------------


@dataclass
class EditScript:
    """The answers of one agent's session: read FILE, then edit it, then "Done."."""

    agent: str
    workdir: Path
    edit_turn: Captured | None = None
    expected: ToolCall | str | None = None
    notes: list[str] = field(default_factory=list)
    lock: threading.Lock = field(default_factory=threading.Lock)

    def __call__(self, path: str, body: dict[str, Any]) -> Answer:
        """The answer to one generating request (`path` with its query)."""
        with self.lock:
            try:
                answer = self._answer(path, body)
            except (LookupError, StopIteration) as exc:  # not the tools this script expects
                tools = sorted(offered(path.split("?")[0], body))
                self.notes.append(f"no answer for {path}: {exc!r}; tools offered: {tools}")
                answer = text_answer(body)
        kind = f"tool call {answer.name}" if isinstance(answer, ToolCall) else repr(answer[:40])
        self.notes.append(f"{path} stream={bool(body.get('stream'))}: {kind}")
        return answer

    def _answer(self, path: str, body: dict[str, Any]) -> Answer:
        surface = path.split("?")[0]
        if self.agent == "aider":
            users = [text_of(m.get("content")) for m in body.get("messages") or []]
            if self.edit_turn is None and any(holds_file(text, BEFORE) for text in users):
                self._keep(path, body, aider_answer(body))
                assert isinstance(self.expected, str)
                return self.expected
            return text_answer(body)
        tools = offered(surface, body)
        # Title, summary and memory requests have no tools or not the task: text for them.
        if not tools or TASK[:40] not in json.dumps(body, ensure_ascii=False):
            return text_answer(body)
        made, results = tool_calls(surface, body), tool_results(surface, body)
        if not made:
            return read_call(self.agent, tools, self.workdir)
        if len(made) == 1 and results and holds_file(results[-1], BEFORE):
            if self.edit_turn is None:
                self._keep(path, body, edit_call(self.agent, tools, self.workdir))
            assert isinstance(self.expected, ToolCall)
            return self.expected
        if len(made) == 1:
            self.notes.append(f"the read's result is not the file: {results[-1:]!r:.600}")
        return text_answer(body)

    def _keep(self, path: str, body: dict[str, Any], answer: ToolCall | str) -> None:
        self.edit_turn = Captured("POST", path, json.loads(json.dumps(body)), time.time())
        self.expected = answer


@dataclass
class Outcome:
    """One agent's run: what it sent and left, and whether its edit landed."""

    agent: str
    returncode: int
    seconds: float
    requests: list[Captured]
    output: str
    script: EditScript
    file_now: str | None
    others_kept: bool

    @property
    def edited(self) -> bool:
        """Whether the agent wrote exactly the expected file and left the others alone."""
        return self.file_now == AFTER and self.others_kept


def command_for(agent: str, url: str, root: Path, timeout: float) -> Command:
    """The driver's command with FILE on aider's command line, Claude Code's turns raised."""
    command = COMMANDS[agent](url, root, timeout, TASK)
    argv = list(command.argv)
    if agent == "aider":
        argv[-1] = FILE
    if "--max-turns" in argv:
        argv[argv.index("--max-turns") + 1] = "6"
    return dataclasses.replace(command, argv=argv)


def run_agent(agent: str, root: Path, timeout: float) -> Outcome:
    """Lay out the repository, run the agent against a scripted server, check the file."""
    recorder = Recorder()
    workdir = root / "work"
    workdir.mkdir(parents=True, exist_ok=True)
    for name, text in REPOSITORY.items():
        (workdir / name).write_text(text)
    script = EditScript(agent, workdir)
    started = time.monotonic()
    with serve(scripted_app(recorder, script)) as url:
        command = command_for(agent, url, root, timeout)
        assert command.workdir == workdir
        out, err, rc = finish(start(command), timeout)
        time.sleep(0.3)
    path = workdir / FILE
    others = all((workdir / n).read_text() == t for n, t in REPOSITORY.items() if n != FILE)
    return Outcome(
        agent,
        rc,
        time.monotonic() - started,
        recorder.take(),
        (out or "")[-2000:] + (err or "")[-2000:],
        script,
        path.read_text() if path.is_file() else None,
        others,
    )


# --- what is saved ----------------------------------------------------------------------------


def record(outcome: Outcome, when: dt.datetime) -> dict[str, Any]:
    """The saved form of a captured turn (see loadtests/edit_turns.py)."""
    turn, expected = outcome.script.edit_turn, outcome.script.expected
    assert turn is not None and turn.body is not None and expected is not None
    if isinstance(expected, ToolCall):
        answer = {"tool": expected.name, "custom": expected.custom, "text": expected.arguments}
    else:
        answer = {"tool": None, "custom": False, "text": expected}
    return {
        "agent": outcome.agent,
        "version": version(outcome.agent),
        "captured_at": when.isoformat(timespec="seconds"),
        "task": TASK,
        "surface": turn.path.split("?")[0],
        "path": turn.path,
        "file": FILE,
        "expected": answer,
        "file_before": BEFORE,
        "file_after": AFTER,
        "body": turn.body,
    }


def readme(command: str) -> str:
    """tests/data/edit_turns/README.md, from the files that are there now."""
    turns = load_all()
    lines = [
        "# Real agents' edit turns",
        "",
        "Each JSON file here is one real coding agent's *edit turn*: the request it sent once the",
        "file it was asked to change had come back from its own read tool. Captured by",
        f"`{command}` against a scripted server, no model: each agent ran non-interactively",
        "(the drivers of loadtests/agents.py, each with its own HOME) in a fresh directory",
        "holding three Python files, on the task",
        "",
        f"> {TASK}",
        "",
        "The server answered the agent's first turn with a call of its own read tool for",
        f"`{FILE}` (Claude Code `Read`, opencode `read`, Qwen Code `read_file`, Codex its shell",
        "tool, `exec_command`, running `cat`). The request that came back holding the file in a",
        "tool result (the agents' temporary work directories show in the bodies' paths) is the",
        "edit turn, saved whole. It was answered with the agent's own edit tool carrying the",
        "renamed file (Claude Code `Write`, opencode `write`, Qwen Code `write_file`; Codex, whose",
        "tools for model `auto` hold no apply_patch tool, an `apply_patch` heredoc through its",
        "`exec_command`, as its prompt asks for, which Codex applies itself), the agent applied",
        'it, everything after got "Done.", and the file on disk was checked to be the expected',
        "one: so `expected` is an edit in the form the agent really takes. aider (text edits, no",
        "tools) ran with the file on its command line: its first request holds the file and is",
        "its edit turn, answered in the edit format its system prompt asks for (whole file: the",
        "driver's `--edit-format whole`).",
        "",
        "To capture them again: `scripts/install-agents.sh`, then the command above (seconds; no",
        "llama-server). An agent that is not installed is skipped; one whose edit does not land",
        "on disk is not written.",
        "",
        "| file | agent | version | captured | surface | edit answer | body |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for t in turns:
        tool = f"`{t.tool}` ({'custom tool input' if t.custom else 'arguments JSON'})"
        size = len(json.dumps(t.body)) // 1000
        lines.append(
            f"| {t.agent}.json | {t.agent} | {t.version} | {t.captured_at} | `{t.surface}` "
            f"| {tool if t.tool else 'text (aider)'} | {size} kB |"
        )
    lines += [
        "",
        "Each file holds:",
        "",
        "- `agent`, `version`, `captured_at` (UTC), `task`;",
        "- `surface`: the endpoint's path; `path`: the path as sent (Claude Code adds a query);",
        "- `body`: the edit turn's request body, as the agent sent it (parsed JSON);",
        "- `expected`: the edit as the model writes it: `tool` (the edit tool's name; null for",
        "  aider's text), `custom` (a Responses custom tool: `text` is its free-form input) and",
        "  `text` (the tool call's arguments JSON string, the custom tool's input, or aider's",
        "  answer);",
        f"- `file`, `file_before`, `file_after`: `{FILE}` before and after the edit.",
        "",
        "loadtests/edit_turns.py loads them, (surface, body, expected) for replay, and applies an",
        "answer to `file_before`; tests/fast/test_edit_turns.py checks them: each parses, its body",
        "passes its surface's validation, holds the file in its one tool result (aider: in a user",
        "message), `expected` applied to `file_before` gives `file_after`, and the proxy's",
        "classifier puts each turn in `echo`.",
        "",
    ]
    return "\n".join(lines)


def installed(agent: str) -> bool:
    """Whether scripts/install-agents.sh installed the agent."""
    return BINARIES[agent].exists()


def main() -> None:
    """Capture each agent's edit turn; save those whose edit landed on disk."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", default=",".join(AGENTS))
    parser.add_argument("--timeout", type=float, default=180.0)
    parser.add_argument("--out", type=Path, default=DATA_DIR)
    parser.add_argument("--keep", type=Path, help="also write every request of every run here")
    args = parser.parse_args()
    agents = args.agents.split(",")
    command = "python scripts/capture_edit_turns.py" + (
        f" --agents {args.agents}" if args.agents != ",".join(AGENTS) else ""
    )
    args.out.mkdir(parents=True, exist_ok=True)
    failed = []
    for agent in agents:
        if not installed(agent):
            print(f"{agent}: not installed ({BINARIES[agent]}), skipped", flush=True)
            continue
        when = dt.datetime.now(dt.UTC)
        with tempfile.TemporaryDirectory(prefix=f"edit-turn-{agent}-") as tmp:
            outcome = run_agent(agent, Path(tmp), args.timeout)
        print(
            f"{agent}: rc={outcome.returncode} {outcome.seconds:.0f}s "
            f"{len(outcome.requests)} requests, edit turn "
            f"{'captured' if outcome.script.edit_turn else 'NOT captured'}, file "
            f"{'edited as expected' if outcome.edited else 'NOT as expected'}",
            flush=True,
        )
        for note in outcome.script.notes:
            print(f"  {note}", flush=True)
        if args.keep:
            args.keep.mkdir(parents=True, exist_ok=True)
            rows = [dataclasses.asdict(r) for r in outcome.requests]
            (args.keep / f"{agent}.json").write_text(json.dumps(rows, indent=1))
        if outcome.script.edit_turn is None or not outcome.edited:
            print(outcome.output, flush=True)
            if outcome.file_now not in (None, AFTER):
                print(f"  {FILE} now:\n{outcome.file_now}", flush=True)
            failed.append(agent)
            continue
        saved = args.out / f"{agent}.json"
        saved.write_text(json.dumps(record(outcome, when), indent=1, ensure_ascii=False) + "\n")
        print(f"  wrote {saved}", flush=True)
    if args.out == DATA_DIR:
        (args.out / "README.md").write_text(readme(command))
    if failed:
        sys.exit(f"not captured: {', '.join(failed)}")


if __name__ == "__main__":
    main()
