"""Prompt prefix each agent's new session shares with its last: scripts/agent_prefixes.py [-h]."""

from __future__ import annotations

import argparse
import dataclasses
import datetime as dt
import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from aiohttp import web

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.agents import AGENTS_DIR, COMMANDS, TASK, Command, finish, installed, start
from loadtests.scripted_server import (
    GENERATING,
    Captured,
    Recorder,
    free_port,
    scripted_app,
    serve,
)
from proxy.api.billing_header import (
    chat_without_billing,
    messages_without_billing,
    responses_without_billing,
)
from proxy.config import default_cache_dir

TASKS = (
    TASK,
    "Add a README.md that says what hello.py does.",
    "Add a file test_hello.py with a pytest test of greet(name).",
)
ANSWER = "Done."
LIBFAKETIME = Path("/usr/lib/x86_64-linux-gnu/faketime/libfaketime.so.1")
# Codex is a static musl binary: LD_PRELOAD cannot reach it. Its clock is left alone; its local
# zone is moved east instead, to UTC+23:59 (chrono refuses 24 h), which dates it tomorrow from
# 00:01 UTC on. Its <timezone> field reads /etc/localtime and stays the same.
NEXT_DAY_TZ = "<+2359>-23:59"
NPM = AGENTS_DIR / "npm" / "node_modules"
VERSIONS = {
    "claude-code": NPM / "@anthropic-ai" / "claude-code" / "package.json",
    "codex": NPM / "@openai" / "codex" / "package.json",
    "opencode": NPM / "opencode-ai" / "package.json",
    "qwen-code": NPM / "@qwen-code" / "qwen-code" / "package.json",
    "continue": NPM / "@continuedev" / "cli" / "package.json",
}


# --- the capturing server ------------------------------------------------------------------


def text_answer(body: dict[str, Any]) -> str:
    """A plain answer, or a JSON object of the asked schema's properties (Claude Code's title)."""
    fmt = body.get("output_config", {}) if isinstance(body.get("output_config"), dict) else {}
    schema = fmt.get("format", {}).get("schema") if isinstance(fmt.get("format"), dict) else None
    if isinstance(schema, dict) and isinstance(schema.get("properties"), dict):
        return json.dumps({name: ANSWER for name in schema["properties"]})
    return ANSWER


def capture_app(recorder: Recorder) -> web.Application:
    """An app that records every request and ends each generation at once with ANSWER."""
    return scripted_app(recorder, lambda path, body: text_answer(body))


@contextmanager
def capture_server(recorder: Recorder) -> Iterator[str]:
    """The capturing server on a free loopback port, in a thread; yields its base URL."""
    with serve(capture_app(recorder)) as url:
        yield url


# --- llama-server: /apply-template and /tokenize only ----------------------------------------


def post(url: str, body: dict[str, Any]) -> Any:
    """POST JSON, read JSON."""
    data = json.dumps(body).encode()
    request = urllib.request.Request(url, data, {"Content-Type": "application/json"})
    with urllib.request.urlopen(request, timeout=120) as resp:
        return json.load(resp)


@contextmanager
def llama_server(binary: Path, model: Path) -> Iterator[str]:
    """A llama-server that only templates and tokenizes: one thread, no warmup decode."""
    port = free_port()
    argv = [str(binary), "-m", str(model), "-c", "32768", "-t", "1", "--port", str(port)]
    argv += ["--host", "127.0.0.1", "-np", "1", "--no-warmup"]
    url = f"http://127.0.0.1:{port}"
    with tempfile.TemporaryFile() as log:
        process = subprocess.Popen(
            argv, stdout=log, stderr=subprocess.STDOUT, start_new_session=True
        )
        try:
            yield _ready(url, process, log)
        finally:
            os.killpg(process.pid, signal.SIGTERM)
            try:
                process.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()


def _ready(url: str, process: subprocess.Popen[bytes], log: IO[bytes]) -> str:
    """The URL once the server answers /health."""
    for _ in range(240):
        if process.poll() is not None:
            log.seek(0)
            raise RuntimeError(f"llama-server exited: {log.read()[-2000:]!r}")
        try:
            with urllib.request.urlopen(f"{url}/health", timeout=2) as resp:
                if resp.status == 200:
                    return url
        except OSError:
            pass
        time.sleep(0.5)
    raise RuntimeError("llama-server did not get ready in 120 s")


# --- bodies as the chat the model sees -------------------------------------------------------


def _text(content: Any) -> str:
    """The text of a string or of a list of text parts / blocks, joined by blank lines."""
    if isinstance(content, str):
        return content
    if isinstance(content, list):
        texts = [p.get("text") for p in content if isinstance(p, dict)]
        return "\n\n".join(t for t in texts if isinstance(t, str))
    return ""


def _function(name: str, description: Any, parameters: Any) -> dict[str, Any]:
    schema = parameters if isinstance(parameters, dict) else {"type": "object", "properties": {}}
    desc = description if isinstance(description, str) else ""
    function = {"name": name, "description": desc, "parameters": schema}
    return {"type": "function", "function": function}


def _messages_chat(body: dict[str, Any]) -> dict[str, Any]:
    """Anthropic Messages: system blocks as one system message, tools as functions."""
    messages: list[dict[str, Any]] = []
    if body.get("system"):
        messages.append({"role": "system", "content": _text(body["system"])})
    for message in body.get("messages") or []:
        content = message.get("content")
        if isinstance(content, list):
            calls = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_use"]
            results = [b for b in content if isinstance(b, dict) and b.get("type") == "tool_result"]
            for r in results:
                messages.append(
                    {
                        "role": "tool",
                        "tool_call_id": r.get("tool_use_id"),
                        "content": _text(r.get("content")),
                    }
                )
            text = _text([b for b in content if isinstance(b, dict) and b.get("type") == "text"])
            if calls:
                tool_calls = [
                    {
                        "id": c.get("id"),
                        "type": "function",
                        "function": {
                            "name": c.get("name"),
                            "arguments": json.dumps(c.get("input")),
                        },
                    }
                    for c in calls
                ]
                messages.append({"role": "assistant", "content": text, "tool_calls": tool_calls})
            elif text or not results:
                messages.append({"role": message.get("role"), "content": text})
        else:
            messages.append({"role": message.get("role"), "content": _text(content)})
    tools = [
        _function(t["name"], t.get("description"), t.get("input_schema"))
        for t in body.get("tools") or []
        if isinstance(t, dict) and "name" in t
    ]
    return {"messages": messages, "tools": tools}


def _responses_tools(tools: list[Any], prefix: str = "") -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    for tool in tools:
        if not isinstance(tool, dict):
            continue
        kind = tool.get("type")
        name = f"{prefix}{tool.get('name', kind)}"
        if kind == "namespace":
            out += _responses_tools(tool.get("tools") or [], f"{tool.get('name')}.")
        elif kind == "function":
            out.append(_function(name, tool.get("description"), tool.get("parameters")))
        elif kind == "custom":  # free-form input: one string
            schema = {"type": "object", "properties": {"input": {"type": "string"}}}
            out.append(_function(name, tool.get("description"), schema))
        else:  # a hosted tool (web_search): its name only
            out.append(_function(name, tool.get("description"), None))
    return out


def _responses_chat(body: dict[str, Any]) -> dict[str, Any]:
    """Responses: instructions and developer items as system messages, tools as functions."""
    messages: list[dict[str, Any]] = []
    if isinstance(body.get("instructions"), str) and body["instructions"]:
        messages.append({"role": "system", "content": body["instructions"]})
    items = body.get("input")
    if isinstance(items, str):
        items = [{"role": "user", "content": items}]
    for item in items or []:
        if not isinstance(item, dict):
            continue
        kind = item.get("type", "message")
        if kind == "message":
            role = item.get("role")
            role = "system" if role in ("developer", "system") else role
            messages.append({"role": role, "content": _text(item.get("content"))})
        elif kind in ("function_call", "custom_tool_call"):
            arguments = item.get("arguments", item.get("input", ""))
            call = {"id": item.get("call_id"), "type": "function"}
            call["function"] = {"name": item.get("name"), "arguments": arguments}
            messages.append({"role": "assistant", "content": "", "tool_calls": [call]})
        elif kind in ("function_call_output", "custom_tool_call_output"):
            output = item.get("output")
            messages.append(
                {"role": "tool", "tool_call_id": item.get("call_id"), "content": _text(output)}
            )
    return {"messages": messages, "tools": _responses_tools(body.get("tools") or [])}


def _chat_chat(body: dict[str, Any]) -> dict[str, Any]:
    messages = [
        {**m, "content": _text(m.get("content"))} if isinstance(m.get("content"), list) else m
        for m in body.get("messages") or []
        if isinstance(m, dict)
    ]
    return {"messages": messages, "tools": body.get("tools") or []}


def as_chat(path: str, body: dict[str, Any], strip: bool) -> dict[str, Any]:
    """The chat body (messages, tools) the model sees; `strip`: the proxy's billing-line strip."""
    if "/messages" in path:
        return _messages_chat(messages_without_billing(body) if strip else body)
    if "/responses" in path:
        return _responses_chat(responses_without_billing(body) if strip else body)
    return _chat_chat(chat_without_billing(body) if strip else body)


# --- agent runs ------------------------------------------------------------------------------


@dataclass
class Session:
    """One agent session: where and when it ran, its requests, and its first turn."""

    agent: str
    case: str
    root: Path  # the work directory's parent
    home: Path  # the driver's root: HOME (and CODEX_HOME, Continue's config) under it
    task: str
    next_day: bool
    returncode: int
    seconds: float
    requests: list[Captured]
    output: str
    tries: int = 1

    @property
    def workdir(self) -> Path:
        """The agent's working directory."""
        return self.root / "work"

    def first_turn(self) -> Captured | None:
        """The first generating request with tools (not a title or memory request); without
        tools anywhere (aider), the first generating request."""
        posts = [
            r
            for r in self.requests
            if r.method == "POST"
            and r.body is not None
            and any(r.path.split("?")[0].endswith(k) for k in GENERATING)
        ]
        with_tools = [r for r in posts if r.body and r.body.get("tools")]
        found = with_tools or posts
        return found[0] if found else None


def next_day_env(agent: str, env: dict[str, str]) -> dict[str, str]:
    """The environment that dates the agent tomorrow."""
    if agent == "codex":
        return {**env, "TZ": NEXT_DAY_TZ}
    return {
        **env,
        "LD_PRELOAD": str(LIBFAKETIME),
        "FAKETIME": "+1d",
        "FAKETIME_DONT_FAKE_MONOTONIC": "1",
    }


def run_session(
    recorder: Recorder,
    url: str,
    agent: str,
    case: str,
    root: Path,
    task: str,
    next_day: bool,
    timeout: float,
    home: Path | None = None,
) -> Session:
    """Run one agent once, kill what it left, and keep the requests it sent. `home`: the
    driver's root (HOME, config) when it is not `root`, the work directory's parent."""
    command: Command = COMMANDS[agent](url, home or root, timeout, task)
    if home is not None:
        command = dataclasses.replace(command, root=root)
    if next_day:
        command = dataclasses.replace(command, env=next_day_env(agent, command.env))
    recorder.take()
    started = time.monotonic()
    out, err, rc = finish(start(command), timeout)
    time.sleep(0.3)
    return Session(
        agent,
        case,
        root,
        home or root,
        task,
        next_day,
        rc,
        time.monotonic() - started,
        recorder.take(),
        (out or "")[-1500:] + (err or "")[-1500:],
    )


# --- comparing two first turns ---------------------------------------------------------------


@dataclass
class Rendered:
    """One first turn as the model sees it."""

    prompt: str
    tokens: list[int]
    chat: dict[str, Any]


def render(llama: str, path: str, body: dict[str, Any], strip: bool) -> Rendered:
    """Template and tokenize a first turn with the llama-server."""
    chat = as_chat(path, body, strip)
    request: dict[str, Any] = {"messages": chat["messages"]}
    if chat["tools"]:
        request["tools"] = chat["tools"]
    prompt = str(post(f"{llama}/apply-template", request)["prompt"])
    tokenized = post(f"{llama}/tokenize", {"content": prompt, "parse_special": True})
    return Rendered(prompt, [int(t) for t in tokenized["tokens"]], chat)


def common(a: list[Any] | str, b: list[Any] | str) -> int:
    """Length of the common prefix."""
    n = 0
    for x, y in zip(a, b, strict=False):
        if x != y:
            break
        n += 1
    return n


def date_strings(day: dt.date) -> list[str]:
    """The ways an agent writes a date."""
    return [
        day.isoformat(),
        day.strftime("%a %b %d %Y"),
        f"{day.month}/{day.day}/{day.year}",
        f"{day.strftime('%B')} {day.day}, {day.year}",
        f"{day.strftime('%A')}, {day.strftime('%B')} {day.day}, {day.year}",
        day.strftime("%Y/%m/%d"),
    ]


def dates_in(prompt: str, days: list[dt.date]) -> list[tuple[int, str]]:
    """(char offset, text) of every date of `days` in the prompt."""
    found = []
    for day in days:
        for text in date_strings(day):
            found += [(m.start(), text) for m in re.finditer(re.escape(text), prompt)]
    return sorted(set(found))


def where(prompt: str, index: int) -> str:
    """Which part of the Qwen2.5 prompt a character offset falls in."""
    turns = prompt[:index].count("<|im_start|>")
    head = prompt[: prompt.find("<|im_end|>") if "<|im_end|>" in prompt else len(prompt)]
    in_tools = turns == 1 and "<tools>" in head and index > head.find("<tools>")
    if in_tools:
        name = re.findall(r'"name": "([^"]+)"', prompt[head.find("<tools>") : index])
        return f"tool schemas ({name[-1] if name else '?'})"
    start = prompt.rfind("<|im_start|>", 0, index)
    role = prompt[start + 12 : prompt.find("\n", start)] if start >= 0 else "?"
    return f"message {turns - 1} ({role})"


def _paths(s: Session) -> list[tuple[str, str]]:
    """(label, text) of the paths of a session that a prompt may hold, the most specific first."""
    work = str(s.workdir)
    return [
        ("working directory", work),
        ("working directory (as a folder name)", re.sub(r"[^A-Za-z0-9]", "-", work)),
        ("home directory (each run's own HOME)", str(s.home / "home")),
        ("HOME's path relative to the working directory", os.path.relpath(s.home / "home", work)),
        ("CODEX_HOME (each run's own)", str(s.home / "codex")),
        ("run folder", str(s.root)),
    ]


def why(old: Session, new: Session, a: str, b: str, index: int) -> str:
    """What the first difference is about."""
    line_start = a.rfind("\n", 0, index) + 1
    line_end = a.find("\n", index)
    line = a[line_start : line_end if line_end >= 0 else len(a)]
    reasons = []
    if "x-anthropic-billing-header" in line:
        reasons.append("billing header (hash of the task)")
    for label, text in _paths(old):
        if any(m.start() <= index < m.end() for m in re.finditer(re.escape(text), a)):
            reasons.append(label)
            break
    days = [dt.date.today(), dt.date.today() + dt.timedelta(days=1)]
    near = [(i, t) for i, t in dates_in(a, days) + dates_in(b, days) if abs(i - index) < 40]
    if near and old.next_day != new.next_day:
        reasons.append("date")
    for task in (old.task, new.task):
        at = a.find(task[:30]) if task in a else b.find(task[:30])
        if at >= 0 and abs(at - index) < 40:
            reasons.append("task")
            break
    if "git" in line.lower():
        reasons.append("git status")
    window = a[max(0, index - 120) : index + 120] + b[max(0, index - 120) : index + 120]
    if not reasons and re.search(r"session|[0-9a-f]{8}-[0-9a-f]{4}-", window, re.I):
        reasons.append("session id?")
    return ", ".join(dict.fromkeys(reasons)) or "other"


@dataclass
class Comparison:
    """A new session's first turn against the previous session's."""

    case: str
    strip: bool
    shared: int
    total: int
    previous_total: int
    part: str
    reason: str
    before: str
    after: str
    dates: str


def compare(llama: str, case: str, old: Session, new: Session, strip: bool) -> Comparison | None:
    """Shared prefix tokens and the first difference of two sessions' first turns."""
    first_old, first_new = old.first_turn(), new.first_turn()
    if first_old is None or first_new is None or not first_old.body or not first_new.body:
        return None
    a = render(llama, first_old.path, first_old.body, strip)
    b = render(llama, first_new.path, first_new.body, strip)
    shared = common(a.tokens, b.tokens)
    index = common(a.prompt, b.prompt)
    around = slice(max(0, index - 40), index + 40)
    days = [dt.date.today(), dt.date.today() + dt.timedelta(days=1)]
    found = dates_in(b.prompt, days)
    dates = ", ".join(
        f"'{t}' at char {i} (token ~{len(tokens_upto(llama, b.prompt, i))})" for i, t in found[:3]
    )
    return Comparison(
        case,
        strip,
        shared,
        len(b.tokens),
        len(a.tokens),
        where(a.prompt, index) if index < len(a.prompt) else "end of the previous prompt",
        why(old, new, a.prompt, b.prompt, index),
        a.prompt[around],
        b.prompt[around],
        dates or "none",
    )


def tokens_upto(llama: str, prompt: str, index: int) -> list[int]:
    """Tokens of the prompt's first `index` characters."""
    tokenized = post(f"{llama}/tokenize", {"content": prompt[:index], "parse_special": True})
    return [int(t) for t in tokenized["tokens"]]


# --- the report ------------------------------------------------------------------------------

CASES = ("same dir", "other dir", "other dir, same HOME", "next day")


def version(agent: str) -> str:
    """The installed agent's version."""
    if agent == "aider":
        found = sorted(AGENTS_DIR.glob("aider/lib/python*/site-packages/aider_chat-*.dist-info"))
        return found[0].name.removesuffix(".dist-info").split("-")[1] if found else "?"
    path = VERSIONS.get(agent)
    return str(json.loads(path.read_text()).get("version", "?")) if path else "?"


def quote(text: str) -> str:
    """Text for a markdown code span in a table cell."""
    return text.replace("\n", "⏎").replace("|", "\\|").replace("`", "'")


def cell(c: Comparison | None) -> str:
    """One table cell: shared / total (share)."""
    if c is None:
        return "no first turn"
    return f"{c.shared:,} / {c.total:,} ({100 * c.shared / max(1, c.total):.0f} %)"


def report(
    results: dict[str, list[Comparison | None]],
    sessions: dict[str, list[Session]],
    command: str,
    date_method: dict[str, str],
) -> str:
    """The markdown document: the table, then each case's details."""
    lines = [
        "# What a new agent session's first turn shares with the previous session's",
        "",
        f"Captured {dt.date.today().isoformat()} by `{command}` against a capturing server that "
        f"answers every turn with plain text ({ANSWER!r}, no tool calls), rendered with the "
        "Qwen2.5 chat template and counted by a llama-server's /apply-template and /tokenize "
        "(no decoding). Versions: " + ", ".join(f"{a} {version(a)}" for a in sessions) + ".",
        "",
        "Each driver of loadtests/agents.py gives a run a root folder with the work directory "
        "`work/` and the agent's own HOME (`home/`, Codex's `codex/`, Continue's config) in it. "
        "Sessions per agent, in this order: **A** in root 1 on task 1; **B** in root 1 on task 2 "
        "(*same dir*, compared with A); **C** in a fresh root 2 on task 2 (*other dir*: another "
        "work directory and a fresh HOME, compared with A); **D** in work directory 3 with root "
        "1's HOME and config on task 2 (*other dir, same HOME*: one user's other project, "
        "compared with A); **E** in root 1 on task 3, dated tomorrow (*next day*, compared with "
        "B, the previous session there). Tasks:",
        "",
        *[f"{i + 1}. {t}" for i, t in enumerate(TASKS)],
        "",
        "Cells: shared prefix tokens / tokens of the new first turn (first-turn tokens: "
        "session A's). Claude Code is shown as sent "
        "(raw) and after the proxy's `messages_without_billing`; the other agents' strip is a "
        "no-op (their numbers are after it).",
        "",
        "| agent | first-turn tokens | shared, same dir | shared, other dir "
        "| shared, other dir, same HOME | shared, next day | first difference and why |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for key, comps in results.items():
        base = next((c for c in comps if c is not None), None)
        total = f"{base.previous_total:,}" if base else "?"
        whys = "; ".join(
            f"{case}: {c.part}, {c.reason}"
            for case, c in zip(CASES, comps, strict=True)
            if c is not None
        )
        lines.append(f"| {key} | {total} | {' | '.join(cell(c) for c in comps)} | {whys} |")
    lines += ["", "How the next day was dated:", ""]
    lines += [f"- {agent}: {how}" for agent, how in date_method.items()]
    lines += [
        "",
        "Reading it: the Qwen2.5 template renders the tool schemas at the end of the first "
        "system message, so a difference inside the system prompt costs the tools as well. The "
        "paths are this script's temporary folders; the drivers give every root its own HOME, "
        "so *other dir* is another user as well (session D keeps one user's HOME). A session "
        "that sent no first turn is run again (twice at most); the tries are in the last table.",
        "",
        "## Details",
        "",
    ]
    for key, comps in results.items():
        lines += [f"### {key}", ""]
        for case, c in zip(CASES, comps, strict=True):
            if c is None:
                lines += [f"- **{case}**: no first turn captured", ""]
                continue
            lines += [
                f"- **{case}**: {c.shared:,} shared of {c.total:,} tokens (previous first turn "
                f"{c.previous_total:,}); first difference in {c.part}: {c.reason}",
                f"  - previous: `{quote(c.before)}`",
                f"  - new:      `{quote(c.after)}`",
                f"  - dates in the new first turn: {c.dates}",
            ]
        lines.append("")
    lines += ["## Sessions", ""]
    lines += ["| agent | session | tries | rc | s | requests (method path) | first turn |"]
    lines += ["| --- | --- | --- | --- | --- | --- | --- |"]
    for agent, runs in sessions.items():
        for s in runs:
            paths = ", ".join(f"{r.method} {r.path}" for r in s.requests)
            first = s.first_turn()
            index = s.requests.index(first) + 1 if first else 0
            lines.append(
                f"| {agent} | {s.case} | {s.tries} | {s.returncode} | {s.seconds:.0f} "
                f"| {quote(paths)} | request {index} |"
            )
    return "\n".join(lines) + "\n"


def agent_sessions(
    recorder: Recorder, url: str, agent: str, tmp: Path, timeout: float
) -> list[Session]:
    """An agent's sessions A to E; one without a first turn is tried again, twice at most."""
    one, two, three = (tmp / agent / f"dir{i}" for i in (1, 2, 3))
    plan: list[tuple[str, Path, str, bool, Path | None]] = [
        ("A", one, TASKS[0], False, None),
        ("B same dir", one, TASKS[1], False, None),
        ("C other dir", two, TASKS[1], False, None),
        ("D other dir, same HOME", three, TASKS[1], False, one),
        ("E next day", one, TASKS[2], True, None),
    ]
    runs = []
    for case, root, task, tomorrow, home in plan:
        for attempt in range(1, 4):
            session = run_session(recorder, url, agent, case, root, task, tomorrow, timeout, home)
            session.tries = attempt
            print(
                f"{agent} {case} (try {attempt}): rc={session.returncode} "
                f"{session.seconds:.0f}s {len(session.requests)} requests",
                flush=True,
            )
            if session.first_turn() is not None:
                break
            print(session.output, flush=True)
        runs.append(session)
    return runs


def main() -> None:
    """Run every agent's four sessions, compare their first turns, write the markdown."""
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--agents", default=",".join(COMMANDS))
    parser.add_argument("--timeout", type=float, default=120.0)
    parser.add_argument("--out", type=Path, default=Path("docs/agent-prefixes.md"))
    parser.add_argument("--keep", type=Path, help="also write every captured body here")
    cache = default_cache_dir()
    parser.add_argument(
        "--llama-server", type=Path, default=cache / "build-11434" / "bin" / "llama-server"
    )
    parser.add_argument(
        "--model", type=Path, default=cache / "models" / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
    )
    args = parser.parse_args()
    if not installed():
        sys.exit("agents not installed: scripts/install-agents.sh")
    if not LIBFAKETIME.is_file():
        sys.exit(f"{LIBFAKETIME} missing: apt-get install faketime")
    agents = args.agents.split(",")
    command = "python scripts/agent_prefixes.py" + (
        f" --agents {args.agents}" if args.agents != ",".join(COMMANDS) else ""
    )
    recorder = Recorder()
    sessions: dict[str, list[Session]] = {}
    with tempfile.TemporaryDirectory(prefix="agent-prefixes-") as tmp:
        with capture_server(recorder) as url:
            for agent in agents:
                runs = agent_sessions(recorder, url, agent, Path(tmp), args.timeout)
                sessions[agent] = runs
                if args.keep:
                    keep(args.keep, agent, runs)
        results: dict[str, list[Comparison | None]] = {}
        with llama_server(args.llama_server, args.model) as llama:
            for agent, (a, b, c, d, e) in sessions.items():
                for strip in (False, True) if agent == "claude-code" else (True,):
                    key = (
                        f"{agent} ({'stripped' if strip else 'raw'})"
                        if agent == "claude-code"
                        else agent
                    )
                    results[key] = [
                        compare(llama, "same dir", a, b, strip),
                        compare(llama, "other dir", a, c, strip),
                        compare(llama, "other dir, same HOME", a, d, strip),
                        compare(llama, "next day", b, e, strip),
                    ]
                    print(key, [cell(x) for x in results[key]], flush=True)
    date_method = {
        agent: (
            f"TZ={NEXT_DAY_TZ} (static musl binary: libfaketime's LD_PRELOAD cannot reach it)"
            if agent == "codex"
            else "libfaketime (LD_PRELOAD, FAKETIME=+1d)"
        )
        + f"; {dated(results, agent)}"
        for agent in sessions
    }
    args.out.write_text(report(results, sessions, command, date_method))
    print(f"wrote {args.out}")


def dated(results: dict[str, list[Comparison | None]], agent: str) -> str:
    """Whether session E's first turn holds tomorrow's date, today's, or none."""
    comps = results.get(agent) or results.get(f"{agent} (stripped)") or []
    last = comps[-1] if comps else None
    if last is None:
        return "no first turn"
    today = dt.date.today()
    if any(t in last.dates for t in date_strings(today + dt.timedelta(days=1))):
        return "tomorrow's date is in session E's first turn"
    if any(t in last.dates for t in date_strings(today)):
        return "session E's first turn still has today's date: the fake did not reach it"
    return "no date in its first turn (nothing to fake)"


def keep(folder: Path, agent: str, runs: list[Session]) -> None:
    """Write each session's captured requests as JSON, for reading by hand."""
    folder.mkdir(parents=True, exist_ok=True)
    for s in runs:
        name = s.case.split()[0]
        rows = [dataclasses.asdict(r) for r in s.requests]
        (folder / f"{agent}-{name}.json").write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    main()
