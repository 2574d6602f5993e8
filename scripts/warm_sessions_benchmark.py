"""Warm sessions benchmark: a real agent's first turn in a first session, in a second session
with another task, and in the first session after a restart (a third task), all in one work
directory, through specproxy and through bare llama-server (the same binary, model and flags as
specproxy's engine), side by side in one run.

Each agent (loadtests/agents.py, installed by scripts/install-agents.sh) reaches its server
through the same timing relay, which notes when each request was sent and when its first
generated token came back (not a keep-alive or progress event); the agent is stopped once its
first turn (its first request offering tools; aider's first request) has been answered. The
restart stops the proxy (or llama-server) and starts it again; specproxy keeps its prompts in a
directory of this run, so it starts cold. specproxy routes as after a user's first `make serve`:
with a scoreboard calibrated once at the start of the run (at the default settings) and copied
for each agent.

    .venv/bin/python scripts/warm_sessions_benchmark.py [--config FILE] \
        [--agents claude-code,codex,opencode,aider,qwen-code,continue] [--out warm-results]

Not a test: one cold first turn of Claude Code is minutes on two cores.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import shutil
import sys
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtests import agents  # noqa: E402
from loadtests.bare import BareServer, free_port, log  # noqa: E402
from loadtests.first_turns import Relay, first_turn, relay_at  # noqa: E402
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
CALIBRATION_TIMEOUT_S = 3600.0


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

    def __init__(self, config: Path | None, out: Path, archive: Path, board: Path) -> None:
        self._config, self._out, self._archive = config, out, archive
        self._proxy: RunningProxy | None = None
        self._starts = 0
        # Routing as after a user's first `make serve`: the calibrated scoreboard, which then
        # learns from this agent's turns and survives the restart as a user's does.
        self._board = archive.with_suffix(".scoreboard.json")
        shutil.copyfile(board, self._board)

    def start(self) -> str:
        self._starts += 1
        self._proxy = start_proxy(
            self._config,
            self._out / f"{self._archive.name}-specproxy-{self._starts}.log",
            # Calibrated already: its cells hold their samples.
            SPECPROXY_CALIBRATION_REQUESTS="0",
            SPECPROXY_PROMPT_ARCHIVE_DIR=str(self._archive),
            SPECPROXY_SCOREBOARD_FILE=str(self._board),
        )
        self._proxy.wait_ready(900)
        return self._proxy.url

    def stop(self) -> None:
        if self._proxy is not None:
            self._proxy.stop()


def calibrated_scoreboard(config: Path | None, out: Path) -> Path:
    """The scoreboard a user's `make serve` has after its first start: calibrated (at the
    default settings) once, saved; kept in `out` for a rerun."""
    board = out / "calibrated.scoreboard.json"
    if board.is_file():
        return board
    log("calibrating a scoreboard, as a first `make serve` does")
    proxy = start_proxy(
        config,
        out / "calibration.log",
        SPECPROXY_SCOREBOARD_FILE=str(board),
        SPECPROXY_PROMPT_ARCHIVE_DIR=str(out / "calibration-prompts"),
    )
    try:
        proxy.wait_ready(CALIBRATION_TIMEOUT_S, calibrated=True)
    finally:
        proxy.stop()
    return board


async def measure(
    name: str, target: Target, out: Path, cases: tuple[str, ...] = CASES
) -> tuple[dict[str, float | None], dict[str, str]]:
    """The cases for one agent on one target: each first turn's time to first token, and its
    prompt tokens found cached."""
    relay = Relay()
    times: dict[str, float | None] = {}
    cached: dict[str, str] = {}
    async with relay_at(relay) as url:
        relay.upstream = target.start()
        try:
            for case, task in zip(CASES, TASKS, strict=True):
                if case not in cases:
                    continue
                if case == "after a restart":
                    target.stop()
                    relay.upstream = target.start()
                root = out / f"{name}-{target.name}"
                turn = await first_turn(name, relay, url, root, task, RUN_TIMEOUT_S)
                times[case] = turn.first_token_s if turn is not None else None
                if turn is not None and turn.prompt_tokens:
                    cached[case] = f"{turn.cached_tokens:,}/{turn.prompt_tokens:,}"
                log(f"{name} on {target.name}, {case}: {times[case]} s, cached {cached.get(case)}")
        finally:
            target.stop()
    return times, cached


Result = dict[str, dict[str, dict[str, float | None]]]  # agent -> target -> case -> TTFT
Cached = dict[str, dict[str, dict[str, str]]]  # agent -> target -> case -> "cached/prompt"


def markdown(results: Result, cached: Cached) -> str:
    """The tables: per agent, each case's time to first token on both, the ratios, and the
    prompt tokens each first turn found cached."""

    def s(value: float | None) -> str:
        return f"{value:.1f}" if value is not None else "-"

    def ratio(a: float | None, b: float | None) -> str:
        return f"{a / b:.2f}" if a is not None and b else "-"

    first, second, restart = CASES
    lines = [
        "Time to first token of the first turn, s: specproxy / bare llama-server",
        "",
        "| agent | first session | second session, another task | after a restart | "
        "second / first, specproxy | after a restart / first, specproxy | "
        "specproxy / bare, second | specproxy / bare, after a restart |",
        "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: |",
    ]
    for name, by in results.items():
        p, b = by["specproxy"], {**by["llama-server"]}
        measured = restart in b
        # Not measured (--no-bare-restart): a restarted llama-server is as cold as a new one.
        b[restart] = b.get(restart, b[first])
        cells = [f"{s(p[c])} / {s(b[c])}" for c in CASES]
        if not measured:
            cells[2] += "*"
        lines.append(
            f"| {name} | {' | '.join(cells)} | {ratio(p[second], p[first])} | "
            f"{ratio(p[restart], p[first])} | {ratio(p[second], b[second])} | "
            f"{ratio(p[restart], b[restart])} |"
        )
    lines += [
        "",
        "Prompt tokens found cached / the first turn's prompt: specproxy; bare llama-server",
        "",
        "| agent | first session | second session, another task | after a restart |",
        "| --- | ---: | ---: | ---: |",
    ]
    for name, found in cached.items():
        cells = [
            f"{found['specproxy'].get(c, '-')}; {found['llama-server'].get(c, '-')}" for c in CASES
        ]
        lines.append(f"| {name} | {' | '.join(cells)} |")
    if any(restart not in by["llama-server"] for by in results.values()):
        lines.append(
            "\n(* bare llama-server after a restart not measured again: a restarted "
            "llama-server starts as cold as a new one, so its first session's figure stands)"
        )
    return "\n".join(lines) + "\n"


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--agents", default=",".join(agents.COMMANDS))
    parser.add_argument("--out", type=Path, default=Path("warm-results"))
    parser.add_argument(
        "--no-bare-restart",
        action="store_true",
        help="skip bare llama-server's third session (it is as cold as its first)",
    )
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
    board = calibrated_scoreboard(args.config, out)
    results: Result = {}
    cached: Cached = {}
    for name in args.agents.split(","):
        bare = Bare(lambda port: spec.argv("127.0.0.1", port), out)
        proxy = Proxy(args.config, out, out / f"{name}-prompts", board)
        bare_cases = CASES[:2] if args.no_bare_restart else CASES
        through, through_cached = await measure(name, proxy, out)
        baseline, baseline_cached = await measure(name, bare, out, bare_cases)
        results[name] = {proxy.name: through, bare.name: baseline}
        cached[name] = {proxy.name: through_cached, bare.name: baseline_cached}
        (out / "results.json").write_text(json.dumps({"ttft_s": results, "cached": cached}))
        (out / "results.md").write_text(markdown(results, cached))
    print(markdown(results, cached))


if __name__ == "__main__":
    asyncio.run(main())
