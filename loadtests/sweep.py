"""Sweep concurrency × backend × task class, one headless locust run per cell, then report.

python -m loadtests.sweep --url http://127.0.0.1:8080 --out loadtest-results/

Task classes are the prompt classes (code, prose, echo) and, asked for by name, coding-agent
sessions (agent-edit-heavy, agent-explain, agent-mixed): N agents at once, each running one
session of --session-turns turns (loadtests/sessions/). Agent cells also run the mode
llama-server: a bare llama-server, started for the cell, as the baseline.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from loadtests.bare import BareServer, bare_command, free_port
from loadtests.measure import RunSummary, Sample, read_samples, summarise
from loadtests.prompts import PROMPTS, Messages, prompt_sequence
from loadtests.report import (
    AUTO,
    BARE,
    AgentSummary,
    Cell,
    SweepSetup,
    agent_summary,
    failed_cell,
    write_csv,
    write_markdown,
    write_plot,
)
from loadtests.sessions import AGENT_TASKS, DEFAULT_SYSTEM_TOKENS, is_agent_task, read_turn_samples
from proxy.llamacpp import metric_value

ROOT = Path(__file__).resolve().parent.parent
LOCUSTFILE = Path(__file__).resolve().parent / "locustfile.py"
# Locust's own start-up and the idle check, per cell, for the time estimate.
_CELL_OVERHEAD_S = 1.5


@dataclass(frozen=True)
class SweepOptions:
    """How every cell is run."""

    url: str
    out: Path
    levels: list[int]
    backends: list[str] | None
    tasks: list[str]
    seconds: int
    drain: int
    requests_per_user: int
    idle_timeout: float
    max_tokens: int
    temperature: float
    stream: bool
    baseline: str | None
    margin: float
    api_key: str | None
    warm_up: bool
    session_turns: int = 6
    system_tokens: int = DEFAULT_SYSTEM_TOKENS
    agent_seconds: int = 1800
    session_seed: int = 0
    config: Path | None = None
    ctx: int = 32768


def _csv_list(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _levels(text: str) -> list[int]:
    try:
        levels = sorted({int(item) for item in _csv_list(text)})
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of integers: {text!r}") from None
    if not levels or levels[0] < 1:
        raise argparse.ArgumentTypeError("levels must be positive integers")
    return levels


def _tasks(text: str) -> list[str]:
    tasks = _csv_list(text)
    unknown = [t for t in tasks if t not in PROMPTS and t not in AGENT_TASKS]
    if unknown or not tasks:
        raise argparse.ArgumentTypeError(
            f"task classes are {', '.join(PROMPTS)}, and agent sessions {', '.join(AGENT_TASKS)}"
        )
    return tasks


def task_modes(task: str, modes: Sequence[str]) -> list[str]:
    """The modes a task's cells run: bare llama-server only where agents are measured."""
    return [m for m in modes if m != BARE or is_agent_task(task)]


def parse_options(argv: list[str] | None) -> SweepOptions:
    """The command line."""
    p = argparse.ArgumentParser(
        prog="python -m loadtests.sweep", description=__doc__.split("\n")[0]
    )
    p.add_argument("--url", default="http://127.0.0.1:8080", help="the proxy")
    p.add_argument("--out", type=Path, default=Path("loadtest-results"), help="report folder")
    p.add_argument(
        "--levels",
        type=_levels,
        help="concurrency levels (default: 1,2,4 when every task is an agent task, else 1,2,4,8)",
    )
    p.add_argument(
        "--backends",
        type=_csv_list,
        help=f"model ids to load, and {BARE} for a bare llama-server on agent tasks (default: "
        f"{BARE} on agent tasks, every backend in /v1/models, then auto)",
    )
    p.add_argument(
        "--tasks",
        type=_tasks,
        default=list(PROMPTS),
        help=f"task classes ({', '.join(PROMPTS)}), or agent sessions ({', '.join(AGENT_TASKS)})",
    )
    # A 256-token edit takes 15 s alone on two cores: 16 s cells held 1-3 answers, and the
    # same backend measured 17.2 and 24.0 tokens/s in two of them.
    p.add_argument(
        "--seconds", type=int, default=36, help="per cell: how long new requests are issued"
    )
    p.add_argument(
        "--drain",
        type=int,
        default=6,
        help="per cell: seconds requests in flight get to finish; later ones are cut",
    )
    p.add_argument(
        "--requests-per-user",
        type=int,
        default=0,
        help="per cell: stop issuing after this many requests per user (0: only --seconds)",
    )
    p.add_argument(
        "--idle-timeout",
        type=float,
        default=300,
        help="before each cell, wait this long for the backends to go idle (0: do not wait)",
    )
    # An edit's answer is a whole file, and ngram-mod drafts only once 24 tokens of context
    # match: 64-token answers would hide most of what it does on edits.
    p.add_argument("--max-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument(
        "--no-stream",
        dest="stream",
        action="store_false",
        help="ask for whole answers (no time to first token; cut requests count no tokens)",
    )
    p.add_argument(
        "--baseline", help="backend speculation is compared with (default: the plain one)"
    )
    p.add_argument(
        "--margin",
        type=float,
        default=0.05,
        help="speculation pays when at least this much faster in aggregate (0.05 = 5%%)",
    )
    p.add_argument(
        "--no-warm-up",
        dest="warm_up",
        action="store_false",
        help="skip warming each prompt prefix once per backend before a task's first cell",
    )
    p.add_argument(
        "--api-key",
        default=os.environ.get("LOCUST_API_KEY"),
        help="for a proxy with api_keys (default: env LOCUST_API_KEY)",
    )
    agents = p.add_argument_group("agent sessions (--tasks agent-...)")
    agents.add_argument(
        "--session-turns", type=int, default=6, help="turns of each agent's one session"
    )
    agents.add_argument(
        "--system-tokens",
        type=int,
        default=DEFAULT_SYSTEM_TOKENS,
        help="system prompt of each session, in tokens (tools come on top)",
    )
    # Eight agents' first turns are 8 x 7 k prompt tokens: minutes on two CPU cores.
    agents.add_argument(
        "--agent-seconds",
        type=int,
        default=1800,
        help="per agent cell: longest run; it ends earlier once every agent finished its session",
    )
    agents.add_argument(
        "--session-seed",
        type=int,
        default=0,
        help="which sessions; each level adds its own offset, every mode at a level runs the same",
    )
    agents.add_argument(
        "--config",
        type=Path,
        help=f"the config the proxy was started with (default: the embedded one); {BARE} "
        "serves its plain backend's model with its threads",
    )
    # Agents resend up to 20 k tokens.
    agents.add_argument("--ctx", type=int, default=32768, help=f"{BARE}'s -c")
    a = p.parse_args(argv)
    agent_only = all(is_agent_task(t) for t in a.tasks)
    if a.backends and BARE in a.backends and not any(is_agent_task(t) for t in a.tasks):
        p.error(f"{BARE} runs agent cells only (--tasks {','.join(AGENT_TASKS)})")
    return SweepOptions(
        url=a.url.rstrip("/"),
        out=a.out,
        # Eight agents' first turns alone take minutes on a CPU.
        levels=a.levels or ([1, 2, 4] if agent_only else [1, 2, 4, 8]),
        backends=a.backends,
        tasks=a.tasks,
        seconds=a.seconds,
        drain=a.drain,
        requests_per_user=a.requests_per_user,
        idle_timeout=a.idle_timeout,
        max_tokens=a.max_tokens,
        temperature=a.temperature,
        stream=a.stream,
        baseline=a.baseline,
        margin=a.margin,
        api_key=a.api_key,
        warm_up=a.warm_up,
        session_turns=a.session_turns,
        system_tokens=a.system_tokens,
        agent_seconds=a.agent_seconds,
        session_seed=a.session_seed,
        config=a.config,
        ctx=a.ctx,
    )


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _get_json(url: str, api_key: str | None = None) -> Any:
    with urllib.request.urlopen(
        urllib.request.Request(url, headers=_auth(api_key)), timeout=10
    ) as resp:
        return json.load(resp)


def _health(url: str) -> dict[str, Any]:
    """The proxy's backends as /health describes them; empty if it says nothing usable."""
    try:
        body = _get_json(f"{url}/health")
    except urllib.error.HTTPError as err:
        body = json.load(err)
    except (OSError, ValueError):
        return {}
    backends = body.get("backends") if isinstance(body, dict) else None
    return backends if isinstance(backends, dict) else {}


def _llama_servers_busy(url: str, api_key: str | None) -> bool:
    """Whether any llama-server still processes a request (per its re-exported metrics).

    A cancelled request leaves the proxy at once, but llama-server finishes the batch step it
    is in first; a long speculative verification on a CPU can take seconds, and the next cell
    would share the cores with it.
    """
    try:
        request = urllib.request.Request(f"{url}/metrics", headers=_auth(api_key))
        with urllib.request.urlopen(request, timeout=10) as resp:
            text = resp.read().decode()
    except (OSError, ValueError):
        return False
    return metric_value(text, "llamacpp_requests_processing") > 0


def _wait_idle(url: str, timeout: float, api_key: str | None = None) -> bool:
    """Wait until every backend is ready with nothing in flight (start-up, calibration, cuts)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        backends = _health(url).values()
        busy = not backends or any(
            b.get("state") != "ready" or b.get("in_flight", 0) or b.get("queued", 0)
            for b in backends
        )
        if not busy and not _llama_servers_busy(url, api_key):
            return True
        time.sleep(0.5)
    return timeout <= 0


# Where a pasted file ends in an edit request: what comes before it is the shared prefix.
_FILE_END = "\n```\n\n"


def _routed(model: str) -> bool:
    """Whether a model id is auto (or auto for one class) rather than a pinned backend."""
    return model == AUTO or model.startswith(f"{AUTO}-")


def warm_up_prompts(task: str, prompts: Sequence[Messages] | None = None) -> list[Messages]:
    """One request per distinct prefix (system prompt, pasted file) of prompts (default: the
    task's pool).

    Each keeps a pool request's prefix and asks only for "OK", so it is a prompt that no cell
    sends.
    """
    prefixes: dict[str, Messages] = {}
    for messages in PROMPTS[task] if prompts is None else prompts:
        # An edit's prefix runs to the end of its pasted file; a question's is its system prompt.
        *head, user = messages
        end = user["content"].rfind(_FILE_END)
        prefix = user["content"][: end + len(_FILE_END)] if end >= 0 else ""
        warm = (*head, {"role": "user", "content": prefix + "Reply with OK."})
        prefixes.setdefault(head[0]["content"] + prefix, warm)
    return list(prefixes.values())


def prompt_slices(
    levels: list[int], pool_sizes: dict[str, int]
) -> dict[tuple[str, int], tuple[int, int]]:
    """Each (task, level)'s (start, count) in its class's pool, more for more concurrent users.

    Every mode at a level sends the same prompts, so two cells differ only in how they were
    decoded: temperature 0 gives the same answers, and a backend chosen by auto is compared with
    itself on the same work. Levels get disjoint slices. A cell that uses up its slice starts it
    again (its own prompts only).
    """
    slices: dict[tuple[str, int], tuple[int, int]] = {}
    # Weighted by level + 2: a single stream sends fewer requests, but not 8x fewer.
    weight = sum(level + 2 for level in levels)
    for task, size in pool_sizes.items():
        start = 0
        for level in levels:
            count = max(1, size * (level + 2) // weight)
            slices[(task, level)] = (start % size, count)
            start += count
    return slices


# Edits differ only in an instruction line after a 700-1,400-token file, so a backend that has
# served a cell's edits saves the next mode about 30 tokens of prompt processing each (2-3 % of a
# request at one stream), while re-warming four files on it takes 3-4 min; new code and
# questions differ in their signature and docstring, a larger share, and re-warm in seconds.
_SHORT_PROMPT_TAILS = frozenset({"echo"})


def restart_before(task: str, mode: str, backends: list[str], kinds: dict[str, str]) -> list[str]:
    """The backends restarted before a mode's cell, so every mode at a level starts alike.

    The modes of a level send the same prompts. An n-gram backend remembers every answer it
    generated and would copy them back to the next mode: it is restarted before each cell that
    can use it (a strategy sharing an engine restarts the engine, its other strategies with it).
    Prompt caches would hand the next mode its prompts already processed: backends are
    restarted for that too, except where prompts differ in a few tokens
    (``_SHORT_PROMPT_TAILS``).
    """
    pinned = [b for b in backends if not _routed(b)]
    usable = pinned if mode not in pinned else [mode]
    if task not in _SHORT_PROMPT_TAILS:
        return usable
    return [b for b in usable if kinds.get(b, "").startswith("ngram")]


def restart_backends(opts: SweepOptions, names: list[str], patience_s: float = 300) -> list[str]:
    """Restart each backend through the proxy's admin endpoint; the ones that could not be.

    The proxy refuses while a backend has requests in flight (a cut request may still be
    leaving), so a refusal for that is retried for up to patience_s.
    """
    failed = []
    for name in names:
        deadline = time.monotonic() + patience_s
        while True:
            request = urllib.request.Request(
                f"{opts.url}/admin/backends/{name}/restart", b"", _auth(opts.api_key), method="POST"
            )
            try:
                with urllib.request.urlopen(request, timeout=900) as resp:
                    took = json.load(resp).get("took_s")
                print(f"restarted {name} ({took} s)", flush=True)
                break
            except urllib.error.HTTPError as err:
                error = json.load(err).get("error", {})
                if error.get("code") == "backend_busy" and time.monotonic() < deadline:
                    time.sleep(1)
                    continue
                print(f"could not restart {name}: {error.get('message', err.reason)}", flush=True)
            except (OSError, ValueError) as exc:
                print(f"could not restart {name}: {exc}", flush=True)
            failed.append(name)
            break
    return failed


def _short_prefix(messages: Messages) -> bool:
    """Whether the prefix is a system prompt alone (no pasted file)."""
    return _FILE_END not in messages[-1]["content"]


def warm_prompt_caches(
    opts: SweepOptions,
    task: str,
    backends: list[str],
    slots: dict[str, int],
    prompts: Sequence[Messages] | None = None,
) -> None:
    """Send each distinct prompt prefix of prompts (default: the task's pool) to each pinned
    backend, one token long; a system prompt alone to each of its slots at once.

    Every backend serves the same target model, so prompt processing says nothing about
    speculation, yet on a small CPU a cold 1,500-token file takes longer than a whole cell.
    The pool's requests differ only after their shared prefix (a system prompt, a pasted
    file), which llama-server keeps once processed (slots plus its RAM cache), so the cells
    then measure generation under load rather than who saw a file first. A backend that has
    served a class holds its system prompt in every slot, and a restarted one is given the same;
    a file is warmed once (four copies of a 1,400-token file take minutes).
    """
    headers = {"Content-Type": "application/json", **_auth(opts.api_key)}

    def send(backend: str, messages: Messages) -> str | None:
        body: dict[str, Any] = {"model": backend, "max_tokens": 1, "messages": list(messages)}
        request = urllib.request.Request(
            f"{opts.url}/v1/chat/completions", json.dumps(body).encode(), headers
        )
        try:
            with urllib.request.urlopen(request, timeout=600) as resp:
                resp.read()
        except (OSError, ValueError) as exc:
            return str(exc)
        return None

    for backend in backends:
        if _routed(backend):
            continue
        for messages in warm_up_prompts(task, prompts):
            # Sent at once, the copies take one free slot each (the proxy names no slot).
            copies = slots.get(backend, 1) if _short_prefix(messages) else 1
            with ThreadPoolExecutor(copies) as pool:
                outcomes = pool.map(send, [backend] * copies, [messages] * copies)
                errors = [e for e in outcomes if e]
            if errors:
                print(f"warm-up of {backend} failed ({errors[0]}); measuring anyway", flush=True)
                return


def _locust(opts: SweepOptions, name: str, command: list[str], run_s: int) -> None:
    """Run one cell's locust process, its output in <out>/cells/<name>.log."""
    cells = opts.out / "cells"
    # The key travels in the environment, not on a command line others can read.
    env = {**os.environ, "LOCUST_API_KEY": opts.api_key or ""}
    with (cells / f"{name}.log").open("w") as log:
        try:
            # cwd: locust puts it on sys.path, which is how the locustfile finds `loadtests`.
            subprocess.run(
                command,
                cwd=ROOT,
                env=env,
                stdout=log,
                stderr=subprocess.STDOUT,
                timeout=run_s + opts.drain + 120,
                check=False,
            )
        except subprocess.TimeoutExpired:
            print(f"locust did not stop; see {log.name}", file=log)


def session_seed(opts: SweepOptions, level: int) -> int:
    """The sessions of a level: the same for every mode there, others at other levels."""
    return opts.session_seed + 1000 * level


def _cell_files(opts: SweepOptions, task: str, backend: str, level: int) -> tuple[Path, str, Path]:
    """A cell's folder, name and (emptied) results file."""
    cells = opts.out / "cells"
    cells.mkdir(parents=True, exist_ok=True)
    name = f"{task}-{backend}-c{level}"
    results = cells / f"{name}.jsonl"
    results.unlink(missing_ok=True)
    return cells, name, results


@contextmanager
def agent_host(opts: SweepOptions, mode: str, log_path: Path) -> Iterator[str]:
    """Where a cell's agents send their turns: the proxy, or for llama-server a bare one
    started for the cell (empty caches, like the proxy's restarted backends) and stopped after."""
    if mode != BARE:
        yield opts.url
        return
    port = free_port()
    with BareServer(bare_command(opts.config, opts.ctx, port), port, log_path) as server:
        yield server.url


def run_agent_cell(opts: SweepOptions, task: str, backend: str, level: int) -> Cell:
    """`level` agents at once, each running one session to its end (or until --agent-seconds)."""
    cells, name, results = _cell_files(opts, task, backend, level)
    try:
        with agent_host(opts, backend, cells / f"{name}.llama-server.log") as host:
            command = [
                sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless",
                "--only-summary", "--host", host, "-u", str(level), "-r", str(level),
                "--run-time", f"{opts.agent_seconds}s", "--stop-timeout", str(opts.drain),
                "--json-file", str(cells / f"{name}_stats"), "--exit-code-on-error", "0",
                # llama-server serves its one model whatever the name.
                "AgentSessionUser", "--model", AUTO if backend == BARE else backend,
                "--session-shape", task.removeprefix("agent-"),
                "--session-turns", str(opts.session_turns),
                "--system-tokens", str(opts.system_tokens),
                "--session-seed", str(session_seed(opts, level)), "--sessions-per-user", "1",
                "--results-file", str(results),
            ]  # fmt: skip
            _locust(opts, name, command, opts.agent_seconds)
    except SystemExit as exc:
        # The bare llama-server did not start: a failed cell, and the other modes still run.
        summary = dataclasses.replace(summarise([]), first_error=str(exc))
        return Cell(task, backend, level, summary, agent_summary([], opts.session_turns))
    samples = read_turn_samples(results)
    plain: list[Sample] = list(samples)
    return Cell(task, backend, level, summarise(plain), agent_summary(samples, opts.session_turns))


def run_cell(
    opts: SweepOptions, task: str, backend: str, level: int, prompts: tuple[int, int]
) -> RunSummary:
    """One headless locust run on its slice of prompts; stats, log, samples go to <out>/cells/."""
    cells, name, results = _cell_files(opts, task, backend, level)
    command = [
        sys.executable, "-m", "locust", "-f", str(LOCUSTFILE), "--headless", "--only-summary",
        "--host", opts.url, "-u", str(level), "-r", str(level),
        "--run-time", f"{opts.seconds}s", "--stop-timeout", str(opts.drain),
        # The JSON stats are written at exit; locust's --csv files lag up to a second behind.
        "--json-file", str(cells / f"{name}_stats"), "--exit-code-on-error", "0",
        "SingleStreamUser" if level == 1 else "BatchedUser",
        "--model", backend, "--task", task, "--max-tokens", str(opts.max_tokens),
        "--temperature", str(opts.temperature), "--stream", "true" if opts.stream else "false",
        "--requests", str(opts.requests_per_user * level), "--results-file", str(results),
        "--prompt-start", str(prompts[0]), "--prompt-count", str(prompts[1]),
    ]  # fmt: skip
    _locust(opts, name, command, opts.seconds)
    return summarise(read_samples(results))


def _discover(
    opts: SweepOptions,
) -> tuple[list[str], dict[str, str], dict[str, int], str | None]:
    """Modes to load (llama-server first by default, pinned ones, auto last), the backends'
    kinds and slots, the baseline."""
    health = _health(opts.url)
    kinds = {n: str(b.get("spec_type") or b.get("kind") or "?") for n, b in health.items()}
    slots = {n: int(b.get("limit") or 1) for n, b in health.items()}
    if opts.backends is not None:
        backends = opts.backends
    else:
        ids = [m["id"] for m in _get_json(f"{opts.url}/v1/models", opts.api_key)["data"]]
        bare = [BARE] if any(is_agent_task(t) for t in opts.tasks) else []
        backends = bare + [i for i in ids if not _routed(i)] + [AUTO]
    # Auto goes last at each level, so the router has just measured every backend there.
    backends = sorted(backends, key=lambda b: b == AUTO)
    plain = [n for n, b in health.items() if b.get("kind") == "plain"]
    baseline = opts.baseline or (plain[0] if plain else "plain" if "plain" in backends else None)
    return backends, kinds, slots, baseline


def _describe(opts: SweepOptions, not_fresh: list[str], modes: list[str]) -> str:
    stop = f"{opts.seconds} s of new requests, then {opts.drain} s to finish"
    if opts.requests_per_user:
        stop = f"{opts.requests_per_user} requests per user or {stop}"
    stream = "streamed" if opts.stream else "not streamed"
    return (
        f"max_tokens {opts.max_tokens}, temperature {opts.temperature}, {stream}; "
        f"each cell: {stop}; every mode at a level sends the same prompts, and before each "
        f"cell the backends it can use are restarted (n-gram always, with any strategy sharing "
        f"its engine; the others except on {', '.join(sorted(_SHORT_PROMPT_TAILS))}) so no mode "
        f"gains from another's history (restarted rather than renamed: the modes of a level "
        f"send the same text, so their answers compare); a cell that uses up its prompts sends "
        f"them again with the names the answers write renamed, so no engine meets a prompt it "
        f"has answered"
        f"{'; NOT restarted: ' + ', '.join(not_fresh) if not_fresh else ''}; "
        f"{_describe_agents(opts, modes)}{time.strftime('%Y-%m-%d %H:%M')}."
    )


def _describe_agents(opts: SweepOptions, modes: list[str]) -> str:
    agents = [t for t in opts.tasks if is_agent_task(t)]
    if not agents:
        return ""
    bare = (
        f"{BARE} cells: a bare llama-server (the proxy's binary and plain model, -c {opts.ctx}) "
        "started for the cell and stopped after it, the proxy idle meanwhile; "
        if BARE in modes
        else ""
    )
    return bare + (
        f"agent cells ({', '.join(agents)}): each of the N agents runs one session of "
        f"{opts.session_turns} turns with a {opts.system_tokens}-token system prompt and its "
        f"real answers replayed (per-turn max_tokens by turn kind), every mode at a level the "
        f"same sessions, all backends it can use restarted before it and not warmed (the "
        f"first turn's prompt is part of what an agent waits for), at most "
        f"{opts.agent_seconds} s; "
    )


def _line(cell: Cell) -> str:
    s = cell.summary
    per_stream = f"{s.per_stream_tps:.1f}" if s.per_stream_tps is not None else "-"
    return (
        f"{cell.task:5} {cell.backend:>10} ×{cell.concurrency}: {s.requests} requests "
        f"({s.failures} failed, {s.cut} cut), {s.aggregate_tps:.1f} tok/s aggregate, "
        f"{per_stream} per stream, answered by {s.backends or '-'}"
        + (f"; {_agent_line(cell.agent)}" if cell.agent else "")
    )


def _agent_line(agent: AgentSummary) -> str:
    later = agent.later_cached_share
    cached = f"{later:.0%}" if later is not None else "-"
    session = f"{agent.session_s:.0f} s" if agent.session_s is not None else "-"
    return (
        f"{agent.sessions} sessions ({agent.complete} complete, mean {session}), "
        f"{cached} of later turns cached"
    )


def main(argv: list[str] | None = None) -> int:
    """Run every cell, write the report; exit 1 if any request failed."""
    opts = parse_options(argv)
    # A SIGTERM ends the sweep as Ctrl-C does: the report is written and no llama-server
    # started for a cell outlives it.
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    try:
        backends, kinds, slots, baseline = _discover(opts)
    except (OSError, ValueError, KeyError, TypeError) as exc:
        print(
            f"sweep: cannot read {opts.url}/v1/models: {exc}; is the proxy running? "
            "Start it with `make serve` and wait for 'ready' (or pass --url)",
            file=sys.stderr,
        )
        return 2
    plan = [(t, lv, b) for t in opts.tasks for lv in opts.levels for b in task_modes(t, backends)]
    # Restarted and warmed through the proxy: every mode but the bare llama-server.
    proxied = [b for b in backends if b != BARE]
    slices = prompt_slices(opts.levels, {t: len(PROMPTS[t]) for t in opts.tasks if t in PROMPTS})
    bound = (
        sum(
            (opts.agent_seconds if is_agent_task(t) else opts.seconds)
            + opts.drain
            + _CELL_OVERHEAD_S
            for t, _, _ in plan
        )
        / 60
    )
    # An agent cell ends when its agents have finished their sessions: --agent-seconds bounds it.
    about = "up to" if any(is_agent_task(t) for t in opts.tasks) else "about"
    print(
        f"{len(plan)} cells ({', '.join(backends)}): {about} {bound:.0f} min, plus what cut "
        "requests take to leave the backends' queues",
        flush=True,
    )
    started = time.monotonic()
    opts.out.mkdir(parents=True, exist_ok=True)
    cells: list[Cell] = []
    not_fresh: list[str] = []
    interrupted = False
    try:
        for i, (task, level, backend) in enumerate(plan, 1):
            agent = is_agent_task(task)
            if opts.warm_up and not agent and (i == 1 or plan[i - 2][0] != task):
                # Those restarted before their first cell are warmed then, on its prompts.
                kept = [b for b in proxied if b not in restart_before(task, b, proxied, kinds)]
                _wait_idle(opts.url, opts.idle_timeout, opts.api_key)
                print(f"warming the backends' prompt caches for {task} ...", flush=True)
                warm_prompt_caches(opts, task, kept, slots)
            # The bare llama-server starts empty; the proxy's backends only need to be idle.
            fresh = [] if backend == BARE else restart_before(task, backend, proxied, kinds)
            if fresh:
                _wait_idle(opts.url, opts.idle_timeout, opts.api_key)
                failed = restart_backends(opts, fresh)
                not_fresh += [f"{task} ×{level} {b}" for b in failed]
                if opts.warm_up and not agent:
                    start, count = slices[(task, level)]
                    sent = [m for _, m in prompt_sequence(task, start, count)]
                    warm_prompt_caches(
                        opts, task, [b for b in fresh if b not in failed], slots, sent
                    )
            if not _wait_idle(opts.url, opts.idle_timeout, opts.api_key):
                print(f"backends still busy after {opts.idle_timeout:.0f} s; measuring anyway")
            if agent:
                cell = run_agent_cell(opts, task, backend, level)
            else:
                summary = run_cell(opts, task, backend, level, slices[(task, level)])
                cell = Cell(task, backend, level, summary)
            cells.append(cell)
            print(f"[{i}/{len(plan)}] {_line(cell)}", flush=True)
            if cell.summary.first_error:
                print(f"    first failure: {cell.summary.first_error}", flush=True)
            # Rewritten after every cell, so an interrupted sweep keeps what it measured.
            write_csv(opts.out / "results.csv", cells)
    except KeyboardInterrupt:
        interrupted = True
    if cells:
        setup = SweepSetup(
            opts.url, kinds, baseline, opts.margin, _describe(opts, not_fresh, backends)
        )
        write_csv(opts.out / "results.csv", cells)
        write_markdown(opts.out / "report.md", cells, setup)
        write_plot(opts.out / "tokens_per_s.png", cells)
        took = (time.monotonic() - started) / 60
        print(f"{took:.1f} min; report: {opts.out / 'report.md'}, {opts.out / 'tokens_per_s.png'}")
    if interrupted:
        return 130
    return 1 if any(failed_cell(c.summary) for c in cells) else 0


if __name__ == "__main__":
    sys.exit(main())
