"""Run each coding agent once against a running specproxy and print what each turn cost.

    make serve                       # in one terminal: the embedded default
    .venv/bin/python scripts/agent_turns.py --log proxy.log [--agents claude-code,codex,...]

`--log` is the proxy's JSON log (SPECPROXY_LOG_FORMAT=json, stderr to a file): each request's
line gives its prompt tokens, how many of them a slot already held (cache_n), time to first
token and duration. Agents run one at a time, each on the one-line task of the agent tests,
with the drivers of loadtests/agents.py (install them with scripts/install-agents.sh).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from loadtests.agents import COMMANDS, installed, run_agent


def requests_after(log: Path, offset: int) -> list[dict[str, object]]:
    """Request lines the proxy wrote after `offset` bytes of its log."""
    with log.open() as f:
        f.seek(offset)
        lines = [json.loads(line) for line in f if line.startswith("{")]
    return [line for line in lines if line.get("event") == "request"]


def main() -> int:
    """Run the agents, print a Markdown table of their turns."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--url", default="http://127.0.0.1:8080")
    parser.add_argument("--log", type=Path, required=True, help="the proxy's JSON log file")
    parser.add_argument("--agents", default=",".join(COMMANDS))
    parser.add_argument("--timeout", type=float, default=3600.0, help="seconds per agent")
    args = parser.parse_args()
    if not installed():
        print("agents are not installed: run scripts/install-agents.sh", file=sys.stderr)
        return 1
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
