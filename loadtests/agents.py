"""Real coding agents, installed by scripts/install-agents.sh, each run once non-interactively.

Every driver points its agent at a base URL the way docs/agents.md says a user does, gives it
a one-line task in a fresh directory with its own HOME, and reads what the agent printed.
"""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from proxy.config import default_cache_dir

AGENTS_DIR = default_cache_dir() / "agents"
NPM_BIN = AGENTS_DIR / "npm" / "node_modules" / ".bin"
AIDER = AGENTS_DIR / "aider" / "bin" / "aider"
TASK = (
    "Create a file hello.py containing a function greet(name) that returns "
    "'Hello, ' + name + '!'. Do nothing else."
)


@dataclass
class AgentRun:
    """What one agent run left: its exit code, output, the files it wrote, how long it took."""

    name: str
    returncode: int
    stdout: str
    stderr: str
    workdir: Path
    seconds: float

    def json_lines(self) -> list[dict[str, Any]]:
        """Every stdout line that is a JSON object (the agents' --json / stream-json output)."""
        out = []
        for line in self.stdout.splitlines():
            line = line.strip()
            if line.startswith("{"):
                try:
                    value = json.loads(line)
                except ValueError:
                    continue
                if isinstance(value, dict):
                    out.append(value)
        return out

    def wrote(self, name: str = "hello.py") -> str | None:
        """The text of a file the agent created in its directory, if it did."""
        path = self.workdir / name
        return path.read_text() if path.is_file() else None

    def task_missed(self) -> str | None:
        """What is wrong with the TASK's result on disk; None where hello.py's greet("Ada")
        returns "Hello, Ada!". The model's file runs in a child interpreter, with a limit."""
        code = self.wrote()
        if code is None:
            made = sorted(str(p.relative_to(self.workdir)) for p in self.workdir.rglob("*"))
            return f"no hello.py (the directory holds {made or 'nothing'})"
        check = "import runpy; print(repr(runpy.run_path('hello.py')['greet']('Ada')))"
        try:
            done = subprocess.run(
                [sys.executable, "-I", "-c", check],
                cwd=self.workdir,
                capture_output=True,
                text=True,
                timeout=20,
            )
        except subprocess.TimeoutExpired:
            return f"hello.py did not finish in 20 s:\n{code}"
        if done.stdout.strip() != repr("Hello, Ada!"):
            why = done.stdout.strip() or done.stderr.strip().splitlines()[-1:]
            return f"greet('Ada') gave {why}, not 'Hello, Ada!'; hello.py:\n{code}"
        return None

    def tail(self) -> str:
        """The end of its output, for assertion messages."""
        return (
            f"rc={self.returncode}\nstdout:\n{self.stdout[-3000:]}\nstderr:\n{self.stderr[-2000:]}"
        )


def _home(root: Path) -> dict[str, str]:
    home = root / "home"
    home.mkdir(parents=True, exist_ok=True)
    path = f"{NPM_BIN}:{os.environ.get('PATH', '/usr/bin:/bin')}"
    keep = {k: v for k, v in os.environ.items() if k in ("LANG", "TERM", "TMPDIR", "USER")}
    return {
        **keep,
        "HOME": str(home),
        "PATH": path,
        "NO_COLOR": "1",
        "CI": "1",
        "DISABLE_TELEMETRY": "1",
        "DO_NOT_TRACK": "1",
    }


@dataclass(frozen=True)
class Command:
    """How to start one agent: its command line and environment, in its own directory."""

    name: str
    argv: list[str]
    env: dict[str, str]
    root: Path

    @property
    def workdir(self) -> Path:
        """Where the agent works (and writes hello.py)."""
        path = self.root / "work"
        path.mkdir(parents=True, exist_ok=True)
        return path


def _command(
    name: str, argv: list[str], root: Path, env: dict[str, str], timeout: float
) -> Command:
    del timeout  # the drivers' signature; the run's own limit is run()'s
    return Command(name, argv, env, root)


def run(command: Command, timeout: float) -> AgentRun:
    """Run the agent to its end (killed after timeout) and keep what it printed."""
    workdir = command.workdir
    started = time.monotonic()
    out, err, rc = finish(start(command), timeout)
    return AgentRun(command.name, rc, out, err, workdir, time.monotonic() - started)


def finish(process: subprocess.Popen[str], timeout: float) -> tuple[str, str, int]:
    """An agent's output and exit code (-9: killed after timeout); whatever it started and
    left running is killed with it."""
    try:
        out, err = process.communicate(timeout=timeout)
        rc = process.returncode
    except subprocess.TimeoutExpired:
        out, err, rc = "", "", -9
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    if rc == -9:
        out, err = process.communicate()
    return out, err, rc


def start(command: Command) -> subprocess.Popen[str]:
    """Start the agent in its own process group (so it can be killed with its children)."""
    return subprocess.Popen(
        command.argv,
        cwd=command.workdir,
        env=command.env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def claude_code(base_url: str, root: Path, timeout: float, task: str = TASK) -> Command:
    """Claude Code with nothing but ANTHROPIC_BASE_URL: its own default model name."""
    env = {
        **_home(root),
        "ANTHROPIC_BASE_URL": base_url,
        "ANTHROPIC_API_KEY": "local",
        "CLAUDE_CODE_MAX_RETRIES": "2",
        "CLAUDE_CODE_DISABLE_NONESSENTIAL_TRAFFIC": "1",
        "DISABLE_AUTOUPDATER": "1",
        # Its per-request timeout: a 20 k-token first turn takes minutes on a CPU.
        "API_TIMEOUT_MS": str(int(timeout * 1000)),
    }
    argv = [str(NPM_BIN / "claude"), "-p", task, "--output-format", "stream-json", "--verbose"]
    argv += ["--max-turns", "3", "--permission-mode", "acceptEdits"]
    return _command("claude-code", argv, root, env, timeout)


def codex(base_url: str, root: Path, timeout: float, task: str = TASK) -> Command:
    """Codex CLI over the Responses API, with the provider file docs/agents.md shows (model auto;
    with no model it sends its own default, gpt-6.2-sol, and its own models' tool shapes)."""
    codex_home = root / "codex"
    codex_home.mkdir(parents=True, exist_ok=True)
    (codex_home / "config.toml").write_text(
        'model = "auto"\n'
        'model_provider = "local"\n'
        "[model_providers.local]\n"
        'name = "specproxy"\n'
        f'base_url = "{base_url}/v1"\n'
        'wire_api = "responses"\n'
        'env_key = "LOCAL_KEY"\n'
        f"stream_idle_timeout_ms = {int(timeout * 1000)}\n"
        "request_max_retries = 1\n"
        "stream_max_retries = 1\n"
    )
    env = {**_home(root), "CODEX_HOME": str(codex_home), "LOCAL_KEY": "local"}
    argv = [str(NPM_BIN / "codex"), "exec", "--json", "--sandbox", "workspace-write"]
    argv += ["--skip-git-repo-check", "--ephemeral", task]
    return _command("codex", argv, root, env, timeout)


def opencode(base_url: str, root: Path, timeout: float, task: str = TASK) -> Command:
    """opencode with an OpenAI-compatible provider file and model `auto`."""
    env = _home(root)
    config = Path(env["HOME"]) / ".config" / "opencode"
    config.mkdir(parents=True, exist_ok=True)
    provider = {
        "npm": "@ai-sdk/openai-compatible",
        "name": "specproxy",
        "options": {"baseURL": f"{base_url}/v1", "apiKey": "local"},
        "models": {"auto": {"name": "auto"}},
    }
    (config / "opencode.json").write_text(
        json.dumps(
            {
                "$schema": "https://opencode.ai/config.json",
                "provider": {"local": provider},
                "model": "local/auto",
                "autoupdate": False,
                "share": "disabled",
            }
        )
    )
    argv = [str(NPM_BIN / "opencode"), "run", "--format", "json", task]
    return _command("opencode", argv, root, env, timeout)


def aider(base_url: str, root: Path, timeout: float, task: str = TASK) -> Command:
    """aider, whole-file edits, pointed at the base URL with model openai/auto."""
    env = _home(root)
    argv = [str(AIDER), "--yes-always", "--no-git", "--no-check-update", "--analytics-disable"]
    argv += ["--no-show-model-warnings", "--no-pretty", "--no-stream", "--edit-format", "whole"]
    argv += ["--openai-api-base", f"{base_url}/v1", "--openai-api-key", "local"]
    argv += ["--model", "openai/auto", "--message", task, "hello.py"]
    return _command("aider", argv, root, env, timeout)


def qwen_code(
    base_url: str, root: Path, timeout: float, task: str = TASK, resume: bool = False
) -> Command:
    """Qwen Code with OpenAI auth and no model: it sends its own default name. `resume`:
    the same directory's last session goes on (`--continue`) with `task` as the next message."""
    env = _home(root)
    argv = [str(NPM_BIN / "qwen"), "--auth-type", "openai", "--openai-base-url", f"{base_url}/v1"]
    argv += ["--openai-api-key", "local", "--approval-mode", "yolo", "-p", task]
    if resume:
        argv.append("--continue")
    return _command("qwen-code", argv, root, env, timeout)


def continue_cli(base_url: str, root: Path, timeout: float, task: str = TASK) -> Command:
    """Continue's CLI with a config.yaml naming an OpenAI model at the base URL."""
    root.mkdir(parents=True, exist_ok=True)
    config = root / "continue.yaml"
    config.write_text(
        "name: specproxy\nversion: 0.0.1\nschema: v1\nmodels:\n"
        "  - name: local\n    provider: openai\n    model: gpt-4o\n"
        f"    apiBase: {base_url}/v1\n    apiKey: local\n"
    )
    argv = [str(NPM_BIN / "cn"), "--config", str(config), "--auto", "-p", task]
    return _command("continue", argv, root, _home(root), timeout)


class Driver(Protocol):
    """A driver: the command that runs one agent on `task` against base_url, in root."""

    def __call__(self, base_url: str, root: Path, timeout: float, task: str = TASK) -> Command:
        """The agent's command line and environment."""
        ...


COMMANDS: dict[str, Driver] = {
    "claude-code": claude_code,
    "codex": codex,
    "opencode": opencode,
    "aider": aider,
    "qwen-code": qwen_code,
    "continue": continue_cli,
}


# What the agents whose first turn is 7-20 k tokens offer a user to narrow it, through their
# own options: the tools the one-line task needs and (Qwen Code) a short system prompt. A cold
# 20 k-token prompt takes 4-7 minutes on two cores whatever the model (attention over the long
# context dominates): narrowed, a first turn is 2-5 k tokens; the protocol, tool calls and
# session structure (Claude Code's billing block, Qwen Code's memory request) are the agent's.
QWEN_SYSTEM_PROMPT = "You are Qwen Code, a coding agent. Use the tools to create and change files."
NARROW: dict[str, list[str]] = {
    "claude-code": ["--tools", "Write,Read,Edit"],
    "qwen-code": [
        *("--core-tools", "write_file", "read_file"),
        *("--exclude-tools", "agent", "skill", "tool_search", "task_stop", "send_message"),
        *("--system-prompt", QWEN_SYSTEM_PROMPT),
    ],
}


# opencode's tools a one-line file task does without (its config's `tools` switches them off).
OPENCODE_SPARE_TOOLS = ("bash", "glob", "grep", "skill", "task", "todowrite", "webfetch")


CODEX_INSTRUCTIONS = "You are Codex, a coding agent. Use the tools to create and change files."


def narrowed(command: Command) -> Command:
    """The agent's command with NARROW's options (unchanged for an agent without any); opencode
    with OPENCODE_SPARE_TOOLS off in its config file, Codex with CODEX_INSTRUCTIONS for its own
    17 k characters (its `model_instructions_file`)."""
    argv = [*command.argv, *NARROW.get(command.name, [])]
    if command.name == "opencode":
        path = Path(command.env["HOME"]) / ".config" / "opencode" / "opencode.json"
        config = json.loads(path.read_text())
        config["tools"] = dict.fromkeys(OPENCODE_SPARE_TOOLS, False)
        path.write_text(json.dumps(config))
    if command.name == "codex":
        instructions = Path(command.env["CODEX_HOME"]) / "instructions.md"
        instructions.write_text(CODEX_INSTRUCTIONS + "\n")
        # `codex exec -c KEY=VALUE ... TASK`: the option before the task.
        argv[2:2] = ["-c", f'model_instructions_file="{instructions}"']
    return dataclasses.replace(command, argv=argv)


def run_agent(
    name: str, base_url: str, root: Path, timeout: float, task: str = TASK, narrow: bool = False
) -> AgentRun:
    """Run one agent on `task` (TASK by default) against base_url, in root; `narrow`: with
    NARROW's options."""
    command = COMMANDS[name](base_url, root, timeout, task)
    return run(narrowed(command) if narrow else command, timeout)


def installed() -> bool:
    """Whether scripts/install-agents.sh has run."""
    return AIDER.is_file() and (NPM_BIN / "claude").exists()
