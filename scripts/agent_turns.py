"""Run each coding agent once against a running specproxy and print what each turn cost.

    make serve                       # in one terminal: the embedded default
    .venv/bin/python scripts/agent_turns.py --log proxy.log [--agents claude-code,codex,...]

`--kill-after S` instead kills each agent S seconds into its first prompt and prints how long the
device stays held after that.

`--log` is the proxy's JSON log (SPECPROXY_LOG_FORMAT=json, stderr to a file): each request's
line gives its prompt tokens, how many of them a slot already held (cache_n), time to first
token and duration. Agents run one at a time, each on the one-line task of the agent tests,
with the drivers of loadtests/agents.py (install them with scripts/install-agents.sh).
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys
import tempfile
import time
import urllib.request
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.agents import COMMANDS, installed, run_agent, start


def requests_after(log: Path, offset: int) -> list[dict[str, object]]:
    """Request lines the proxy wrote after `offset` bytes of its log."""
    with log.open() as f:
        f.seek(offset)
        lines = []
        for line in f:
            try:
                lines.append(json.loads(line))
            except ValueError:
                continue  # llama-server's own output, the ready banner
    return [line for line in lines if isinstance(line, dict) and line.get("event") == "request"]


def get(url: str) -> object:
    """A JSON document from url."""
    with urllib.request.urlopen(url, timeout=10) as resp:
        return json.load(resp)


def device_in_use(url: str) -> int:
    """Slots of devices held, summed over the proxy's devices (its /health)."""
    health = get(f"{url}/health")
    assert isinstance(health, dict)
    return sum(int(d["in_use"]) for d in health["devices"].values())


def kill_mid_prompt(name: str, url: str, after_s: float) -> None:
    """Start the agent, kill it `after_s` seconds into its first request, and print how long
    the device stayed held after that."""
    with tempfile.TemporaryDirectory(prefix=f"agent-{name}-") as root:
        process = start(COMMANDS[name](url, Path(root), 3600.0))
        deadline = time.monotonic() + 300
        while device_in_use(url) == 0 and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(after_s)
        os.killpg(process.pid, signal.SIGKILL)
        process.communicate()
    killed = time.monotonic()
    while device_in_use(url) > 0:
        time.sleep(0.1)
    freed = time.monotonic() - killed
    print(f"{name} killed {after_s:.0f} s into its prompt: device free {freed:.1f} s later")


def main() -> int:
    """Run the agents, print a Markdown table of their turns."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--log", type=Path, required=True, help="the proxy's JSON log file")
    parser.add_argument("--agents", default=",".join(COMMANDS))
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per agent")
    parser.add_argument(
        "--kill-after",
        type=float,
        help="instead: kill each agent this many seconds into its prompt",
    )
    args = parser.parse_args()
    if not installed():
        print("agents are not installed: run scripts/install-agents.sh", file=sys.stderr)
        return 1
    if args.kill_after is not None:
        for name in args.agents.split(","):
            kill_mid_prompt(name, args.url, args.kill_after)
        return 0
    head = "agent", "run s", "exit", "request", "endpoint", "status", "prompt", "cached", "TTFT s"
    print("| " + " | ".join([*head, "s"]) + " |")
    print("| --- | ---: | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: |")
    for name in args.agents.split(","):
        offset = args.log.stat().st_size
        with tempfile.TemporaryDirectory(prefix=f"agent-{name}-") as root:
            run = run_agent(name, args.url, Path(root), args.timeout)
        seen = requests_after(args.log, offset)
        for i, r in enumerate(seen, 1):
            print(
                f"| {name} | {run.seconds:.0f} | {run.returncode} | {i} | {r.get('endpoint')} | "
                f"{r.get('status')} | {r.get('prompt_tokens')} | {r.get('cached_tokens')} | "
                f"{r.get('ttft_s')} | {r.get('duration_s')} |",
                flush=True,
            )
        if not seen:
            print(f"| {name} | {run.seconds:.0f} | {run.returncode} | – | no request | | | | | |")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
