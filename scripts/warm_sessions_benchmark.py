"""Warm sessions benchmark: a real agent's first turn in a first session, in a second session
with another task in another directory, and in the first session after a restart, through
specproxy and through bare llama-server (the same binary, model and flags as specproxy's
engine), side by side in one run.

Each agent (loadtests/agents.py, installed by scripts/install-agents.sh) reaches its server
through the same timing relay, which notes when each request was sent and when its first
generated token came back (not a keep-alive or progress event); the agent is stopped once its
first turn (its first request offering tools; aider's first request) has been answered. The
restart stops the proxy (or llama-server) and starts it again; specproxy keeps its prompts in a
directory of this run, so it starts cold.

    .venv/bin/python scripts/warm_sessions_benchmark.py [--config FILE] \
        [--agents claude-code,codex,opencode,aider,qwen-code,continue] [--out warm-results]

Not a test: one cold first turn of Claude Code is minutes on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtests import agents  # noqa: E402
from loadtests.bare import BareServer, free_port, log  # noqa: E402
from loadtests.first_turns import Relay, first_turn_s, relay_at  # noqa: E402
from proxy.backends.launch import engine_spec, prepare_backends  # noqa: E402
from proxy.config import load_settings  # noqa: E402
from proxy.testing.running_proxy import RunningProxy, start_proxy  # noqa: E402

TASKS = [
    "Create a file hello.py containing a function greet(name) that returns "
    "'Hello, ' + name + '!'. Do nothing else.",
    "Create a file README.md with one line saying that this project greets people. "
    "Do nothing else.",
    "Create a file add.py containing a function add(a, b) that returns a + b. Do nothing else.",
]
CASES = ("first session", "second session", "after a restart")
RUN_TIMEOUT_S = 2400.0


class Target:
    """A server the agents use: started, restarted, stopped."""

    name = ""

    def start(self) -> str:
        raise NotImplementedError

    def stop(self) -> None:
        raise NotImplementedError


class Bare(Target):
    """Bare llama-server with the engine's command line."""

    name = "llama-server"

    def __init__(self, argv: Callable[[int], list[str]], out: Path) -> None:
        self._argv, self._out = argv, out
        self._server: BareServer | None = None

    def start(self) -> str:
        port = free_port()
        self._server = BareServer(self._argv(port), port, self._out / "llama-server.log")
        self._server.__enter__()
        return self._server.url

    def stop(self) -> None:
        if self._server is not None:
            self._server.__exit__()


class Proxy(Target):
    """specproxy on the config, calibration off, its kept prompts in this run's directory."""

    name = "specproxy"

    def __init__(self, config: Path | None, out: Path, archive: Path) -> None:
        self._config, self._out, self._archive = config, out, archive
        self._proxy: RunningProxy | None = None
        self._starts = 0

    def start(self) -> str:
        self._starts += 1
        self._proxy = start_proxy(
            self._config,
            self._out / f"specproxy-{self._starts}.log",
            SPECPROXY_CALIBRATION_REQUESTS="0",
            SPECPROXY_PROMPT_ARCHIVE_DIR=str(self._archive),
        )
        self._proxy.wait_ready(900)
        return self._proxy.url

    def stop(self) -> None:
        if self._proxy is not None:
            self._proxy.stop()


async def measure(name: str, target: Target, out: Path) -> dict[str, float | None]:
    """The three cases for one agent on one target."""
    relay = Relay()
    times: dict[str, float | None] = {}
    async with relay_at(relay) as url:
        relay.upstream = target.start()
        try:
            for case, task in zip(CASES, TASKS, strict=True):
                if case == "after a restart":
                    target.stop()
                    relay.upstream = target.start()
                root = out / f"{name}-{target.name}-{CASES.index(case)}"
                times[case] = await first_turn_s(name, relay, url, root, task, RUN_TIMEOUT_S)
                log(f"{name} on {target.name}, {case}: {times[case]} s")
        finally:
            target.stop()
    return times


def markdown(results: dict[str, dict[str, dict[str, float | None]]]) -> str:
    """The table: per agent, each case's time to first token on both, and the ratios."""

    def s(value: float | None) -> str:
        return f"{value:.1f}" if value is not None else "-"

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}" if a is not None and b else "-"

    lines = [
        "| agent | first session: specproxy / bare (s) | second session, another task and "
        "directory | after a restart | second / first, specproxy | after restart / first, "
        "specproxy | specproxy / bare, second | specproxy / bare, after restart |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, by in results.items():
        p, b = by["specproxy"], by["llama-server"]
        cells = [f"{s(p[c])} / {s(b[c])}" for c in CASES]
        lines.append(
            f"| {name} | {' | '.join(cells)} | {ratio(p[CASES[1]], p[CASES[0]])} | "
            f"{ratio(p[CASES[2]], p[CASES[0]])} | {ratio(p[CASES[1]], b[CASES[1]])} | "
            f"{ratio(p[CASES[2]], b[CASES[2]])} |"
        )
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--agents", default=",".join(agents.COMMANDS))
    parser.add_argument("--out", type=Path, default=Path("warm-results"))
    args = parser.parse_args()
    if not agents.installed():
        raise SystemExit("agents are not installed: run scripts/install-agents.sh")
    out = args.out.resolve()
    out.mkdir(parents=True, exist_ok=True)
    settings = load_settings(args.config)
    specs = prepare_backends(settings)
    engine = next(iter(settings.engines()), None)
    spec = (
        engine_spec(engine, [s for s in specs if s.config.engine == engine]) if engine else specs[0]
    )
    results: dict[str, dict[str, dict[str, float | None]]] = {}
    for name in args.agents.split(","):
        bare = Bare(lambda port: spec.argv("127.0.0.1", port), out)
        proxy = Proxy(args.config, out, out / f"{name}-prompts")
        results[name] = {t.name: await measure(name, t, out) for t in (bare, proxy)}
        (out / "results.json").write_text(json.dumps(results, indent=1))
        (out / "results.md").write_text(markdown(results))
    print(markdown(results))


if __name__ == "__main__":
    asyncio.run(main())
