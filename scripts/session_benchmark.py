"""Session benchmark: agent sessions through auto, each backend pinned, and bare llama-server.

Replays the sessions of ``loadtests/sessions/`` (a long agent system prompt with tools, a
generated repository, scripted turns whose answers are the model's real ones) against each mode
in turn, N sessions at once for each level N of ``--concurrency`` (several agents, or an agent
and its sub-agents, on one server):

- ``auto`` through a running specproxy;
- each of its backends pinned through the proxy (model = the backend's name);
- ``llama-server``: the same llama-server binary and target GGUF the proxy uses, started here the
  way a user would (``-m``, ``--port``, ``-c``, ``-t``; ``-ngl`` only when the config offloads) and
  stopped after each round. Its defaults give it 4 slots sharing one KV cache and an 8 GiB RAM
  prompt cache, so N sessions at once batch in it as they would for a user.

Round by round, every mode replays the round's sessions in turn (the order rotating from one
round to the next), so a machine whose speed drifts over minutes shifts every mode alike and the
ratios are paired. Before each round in a proxy mode every engine is restarted through
``POST /admin/backends/{name}/restart`` (once per engine: strategies sharing one restart it
together), and the bare server is started fresh, so every mode begins with empty prompt caches
and an n-gram backend that remembers nothing of another mode's answers to the same sessions; the
proxy's scoreboard, like a running proxy's, keeps what it measured. Restarted rather than
renamed (``proxy.workload``'s ``renamed``, which the routing benchmark uses): every mode replays
the same sessions word for word, which is what makes their answers and times compare, and an
agent's prompt cache is part of what a session measures, so every mode should start it empty.
Every turn is streamed (time to first token; llama.cpp's timings come in the last chunk). Per
mode and shape it reports session wall time (mean, 95 % bootstrap interval over sessions),
median time to first token, decode tokens/s, the share of prompt tokens served from cache (all
turns, and the turns after each session's first), what auto chose, and each mode's session time
relative to bare llama-server's and to the best pinned backend's, with paired bootstrap
intervals. The modes serve one model at temperature 0, so answers mostly agree; where they do
not, later turns differ too, and the report says how many answers matched bare llama-server's
and how many tokens each mode generated.

    .venv/bin/python scripts/session_benchmark.py [--proxy http://127.0.0.1:8080] [--config FILE] \
        [--shapes edit-heavy,explain,mixed,captured-edits] [--sessions 3] [--concurrency 1,2,4] \
        [--turns 12] [--system-tokens 6000] [--edits 2] [--agents claude-code,codex,...] \
        [--modes auto,plain,draft,ngram,llama-server] [--seed 0] [--out session-results]

The shape ``captured-edits`` replays real agents' sessions instead (loadtests/edit_sessions.py):
each captured edit turn of tests/data/edit_turns/ grown into its agent's conversation, --edits
renames in one file, every request on the agent's own surface (Claude Code's Messages, Codex's
Responses, the others' chat) with the agent's own system prompt and tools, whole answers (not
streamed; no time to first token), the conversation scripted so every mode sends the same
requests. Sessions take the agents in turn (--agents: which), and --sessions rounds at level N
run N of them at once.

Not a test: timings on a shared machine are noisy. ``--report-only`` rewrites the report from
``<out>/turns.jsonl``.
"""

from __future__ import annotations

import argparse
import json
import random
import signal
import statistics
import sys
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any, cast

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtests.bare import BareServer, bare_command, free_port  # noqa: E402
from loadtests.edit_replay import send_edit_turn  # noqa: E402
from loadtests.edit_sessions import EditSession, edit_sessions  # noqa: E402
from loadtests.report import AUTO, BARE  # noqa: E402
from loadtests.sessions import (  # noqa: E402
    DEFAULT_SYSTEM_TOKENS,
    DEFAULT_TURNS,
    SHAPES,
    Session,
    Shape,
    TurnResult,
    build_sessions,
    send_turn,
)

Row = dict[str, Any]
# Real agents' captured sessions (loadtests/edit_sessions.py), beside the generated shapes.
CAPTURED = "captured-edits"


def log(message: str) -> None:
    """Progress goes to stderr; the table to stdout."""
    print(message, file=sys.stderr, flush=True)


# --------------------------------------------------------------------------- statistics


def bootstrap_interval(
    values: Sequence[float],
    statistic: Callable[[Sequence[float]], float] = statistics.fmean,
    rounds: int = 2000,
    seed: int = 0,
) -> tuple[float, float]:
    """The 95 % bootstrap interval of a statistic over values (resampled with replacement)."""
    if not values:
        return (float("nan"), float("nan"))
    rng = random.Random(seed)
    stats = sorted(statistic(rng.choices(values, k=len(values))) for _ in range(rounds))
    return stats[int(rounds * 0.025)], stats[min(int(rounds * 0.975), rounds - 1)]


def ratio_interval(
    mine: dict[str, float], theirs: dict[str, float], rounds: int = 2000, seed: int = 0
) -> tuple[float, float, float] | None:
    """Total time of mine over theirs on the sessions both completed, with a paired 95 %
    bootstrap interval (the same sessions resampled for both); None without common sessions."""
    common = sorted(set(mine) & set(theirs))
    if not common:
        return None
    rng = random.Random(seed)

    def ratio(keys: Sequence[str]) -> float:
        below = sum(theirs[k] for k in keys)
        return sum(mine[k] for k in keys) / below if below else float("nan")

    ratios = sorted(ratio(rng.choices(common, k=len(common))) for _ in range(rounds))
    return ratio(common), ratios[int(rounds * 0.025)], ratios[min(int(rounds * 0.975), rounds - 1)]


@dataclass(frozen=True)
class ModeShape:
    """What one mode did on one shape's sessions."""

    mode: str
    shape: str
    concurrency: int
    session_s: dict[str, float]
    failed_sessions: int
    turns: int
    failed_turns: int
    ttft_p50_s: float | None
    first_ttft_p50_s: float | None
    decode_tps: float | None
    cached_share: float | None
    # The same over turns after each session's first: what the cache kept between turns.
    later_cached_share: float | None
    tokens: dict[str, int]
    answers: dict[tuple[str, int], str]
    backends: dict[str, int]
    routes: dict[str, int]
    text_tool_calls: int
    tool_calls: int

    @property
    def mean_s(self) -> float | None:
        """Mean session wall time over completed sessions."""
        return statistics.fmean(self.session_s.values()) if self.session_s else None


def concurrency_of(row: Row) -> int:
    """How many sessions ran at once beside this turn's (1 in reports of older runs)."""
    return int(row.get("concurrency", 1))


def _cached_share(turns: Sequence[Row]) -> float | None:
    prompt = sum(r["prompt_n"] + r["cache_n"] for r in turns)
    return sum(r["cache_n"] for r in turns) / prompt if prompt else None


def summarise(rows: Sequence[Row], mode: str, shape: str, concurrency: int = 1) -> ModeShape:
    """Add up one mode's turns of one shape at one concurrency; a session with a failed turn
    has no time."""
    mine = [
        r
        for r in rows
        if r["mode"] == mode and r["shape"] == shape and concurrency_of(r) == concurrency
    ]
    by_session: dict[str, list[Row]] = {}
    for r in mine:
        by_session.setdefault(r["session"], []).append(r)
    failed = {s for s, turns in by_session.items() if any(t["error"] for t in turns)}
    session_s = {
        s: sum(t["seconds"] for t in turns) for s, turns in by_session.items() if s not in failed
    }
    ok = [r for r in mine if not r["error"]]
    ttfts = [r["ttft_s"] for r in ok if r["ttft_s"] is not None]
    # A session's first turn processes the whole system prompt and tools, unless a server
    # still holds them from an earlier session.
    firsts = [r["ttft_s"] for r in ok if r["ttft_s"] is not None and r["turn"] == 0]
    timed = [r for r in ok if r["predicted_per_second"] and r["predicted_n"]]
    decode_s = sum(r["predicted_n"] / r["predicted_per_second"] for r in timed)
    return ModeShape(
        mode=mode,
        shape=shape,
        concurrency=concurrency,
        session_s=session_s,
        failed_sessions=len(failed),
        turns=len(mine),
        failed_turns=len(mine) - len(ok),
        ttft_p50_s=statistics.median(ttfts) if ttfts else None,
        first_ttft_p50_s=statistics.median(firsts) if firsts else None,
        decode_tps=sum(r["predicted_n"] for r in timed) / decode_s if decode_s else None,
        cached_share=_cached_share(ok),
        later_cached_share=_cached_share([r for r in ok if r["turn"] > 0]),
        tokens={
            s: sum(t["predicted_n"] for t in turns)
            for s, turns in by_session.items()
            if s not in failed
        },
        answers={(r["session"], r["turn"]): r["answer"] for r in ok},
        backends=dict(Counter(r["backend"] for r in ok if r["backend"]).most_common()),
        routes=dict(Counter(r["route"] for r in ok if r["route"]).most_common()),
        text_tool_calls=sum(1 for r in ok if r.get("tool_style") == "text"),
        tool_calls=sum(1 for r in ok if r.get("tools_called")),
    )


def _seconds(value: float | None, digits: int = 1) -> str:
    return "-" if value is None else f"{value:.{digits}f}"


def _ratio(interval: tuple[float, float, float] | None) -> str:
    if interval is None:
        return "-"
    ratio, low, high = interval
    return f"{ratio:.2f} ({low:.2f}-{high:.2f})"


def _counts(counts: dict[str, int]) -> str:
    return " ".join(f"{k}:{n}" for k, n in counts.items()) or "-"


def best_pinned(summaries: Sequence[ModeShape]) -> ModeShape | None:
    """The pinned backend with the shortest mean session time among these summaries."""
    pinned = [s for s in summaries if s.mode not in (AUTO, BARE) and s.mean_s is not None]
    return min(pinned, key=lambda s: s.mean_s or 0.0) if pinned else None


def agreement(mine: ModeShape, reference: ModeShape) -> tuple[int, int]:
    """(answers identical to the reference's, turns both answered) for the same session turns."""
    common = set(mine.answers) & set(reference.answers)
    return sum(mine.answers[k] == reference.answers[k] for k in common), len(common)


def markdown(rows: Sequence[Row], modes: Sequence[str], shapes: Sequence[str]) -> str:
    """The report: a table per shape, then the notes that say how to read it."""
    out = [
        "# Agent sessions: auto, each backend pinned, and bare llama-server",
        "",
        "Session s: wall time of a whole session (sum of its turns, first byte sent to last "
        "byte received), mean over the sessions every turn of which succeeded, with a 95 % "
        "bootstrap interval over sessions. Ratios: total session time over bare llama-server's "
        "and over the best pinned backend's on the same sessions (paired 95 % bootstrap "
        "interval); below 1 is faster. Every mode replays the same sessions word for word, each "
        "round from restarted engines (a fresh bare llama-server), so no mode's n-gram memory or "
        "prompt cache holds another mode's answers to them. "
        "Answers = bare: turns whose answer (text and tool calls) "
        "was identical to bare llama-server's; after the first difference a session's "
        "conversations differ, so its later turns are not the same work. Cached: the share of "
        "prompt tokens llama-server found in its cache, over all turns and over the turns after "
        "each session's first (what was kept between a session's turns while the others ran).",
    ]
    levels = sorted({concurrency_of(r) for r in rows})
    for shape, level in ((shape, level) for shape in shapes for level in levels):
        summaries = [summarise(rows, m, shape, level) for m in modes]
        summaries = [s for s in summaries if s.turns]
        if not summaries:
            continue
        bare = next((s for s in summaries if s.mode == BARE), None)
        best = best_pinned(summaries)
        at_once = f"{level} session{'s' if level > 1 else ''} at once"
        out += [
            "",
            f"## {shape}, {at_once}",
            "",
            "| mode | sessions | session s (95% CI) | TTFT p50 s | 1st TTFT s | decode t/s | "
            "cached | later turns cached | tokens/session | vs llama-server | vs best pinned | "
            "answers = bare | backends | routes |",
            "| --- |" + " ---: |" * 11 + " --- | --- |",
        ]
        for s in summaries:
            low, high = bootstrap_interval(list(s.session_s.values()))
            mean = s.mean_s
            session = "-" if mean is None else f"{mean:.1f} ({low:.1f}-{high:.1f})"
            cached = "-" if s.cached_share is None else f"{s.cached_share:.0%}"
            later = "-" if s.later_cached_share is None else f"{s.later_cached_share:.0%}"
            tokens = statistics.fmean(s.tokens.values()) if s.tokens else None
            vs_bare = ratio_interval(s.session_s, bare.session_s) if bare else None
            vs_best = ratio_interval(s.session_s, best.session_s) if best else None
            same = "-"
            if bare is not None and s is not bare:
                matched, total = agreement(s, bare)
                same = f"{matched}/{total}" if total else "-"
            failed = f" ({s.failed_sessions} failed)" if s.failed_sessions else ""
            out.append(
                f"| {s.mode} | {len(s.session_s)}{failed} | {session} | "
                f"{_seconds(s.ttft_p50_s, 2)} | {_seconds(s.first_ttft_p50_s, 2)} | "
                f"{_seconds(s.decode_tps)} | {cached} | {later} | "
                f"{_seconds(tokens, 0)} | {_ratio(vs_bare)} | {_ratio(vs_best)} | {same} | "
                f"{_counts(s.backends)} | {_counts(s.routes)} |"
            )
        notes = []
        if best is not None:
            notes.append(f"best pinned backend: {best.mode}")
        for s in summaries:
            if s.text_tool_calls:
                notes.append(
                    f"{s.mode}: {s.text_tool_calls} of {s.tool_calls} tool calls written as text"
                )
            if s.failed_turns:
                first = next(
                    r["error"]
                    for r in rows
                    if r["mode"] == s.mode
                    and r["shape"] == shape
                    and concurrency_of(r) == level
                    and r["error"]
                )
                notes.append(f"{s.mode}: {s.failed_turns} failed turns, first: `{first[:160]}`")
        stale = {
            (r["mode"], r.get("session"))
            for r in rows
            if r.get("fresh") is False and r["shape"] == shape and concurrency_of(r) == level
        }
        if stale:
            notes.append(
                f"{len(stale)} sessions ran on engines that could not be restarted before their "
                "round (the log names them): their modes may have met another mode's answers"
            )
        if notes:
            out += ["", *(f"- {n}" for n in notes)]
    out += classes(rows)
    return "\n".join(out) + "\n"


# The generated sessions' edit tools, then the captured agents' (Claude Code, opencode).
_EDIT_TOOLS = ("write_file", "edit", "Write", "Edit", "write")


def classes(rows: Sequence[Row]) -> list[str]:
    """How the proxy classed each turn (X-Specproxy-Task) against what the answer really was:
    an edit (a write_file or edit call, which copies the file: echo-shaped) or not."""
    counts: Counter[tuple[str, str]] = Counter()
    for r in rows:
        if r.get("task") and r.get("status") == 200:
            edit = any(t in _EDIT_TOOLS for t in r.get("tools_called") or [])
            counts[("edit" if edit else "other", str(r["task"]))] += 1
    if not counts:
        return []
    tasks = sorted({t for _, t in counts})
    out = [
        "",
        "## How the proxy classed the turns",
        "",
        "Every turn the proxy served (auto and pinned), by what the answer really was.",
        "",
        "| answer | " + " | ".join(tasks) + " |",
        "| --- |" + " ---: |" * len(tasks),
    ]
    for kind in ("edit", "other"):
        out.append(f"| {kind} | " + " | ".join(str(counts[(kind, t)]) for t in tasks) + " |")
    return out


# --------------------------------------------------------------------------- the modes


def _auth(api_key: str | None) -> dict[str, str]:
    return {"Authorization": f"Bearer {api_key}"} if api_key else {}


def _health_backends(proxy: str, api_key: str | None) -> dict[str, Any]:
    """/health's backends: name -> what it says of each."""
    resp = requests.get(f"{proxy}/health", headers=_auth(api_key), timeout=10)
    backends = resp.json().get("backends")
    if not isinstance(backends, dict) or not backends:
        raise ValueError(f"{proxy}/health lists no backends: {resp.text[:200]}")
    return dict(backends)


def one_per_engine(backends: dict[str, Any]) -> list[str]:
    """One backend name per engine (/health's ``engine``): restarting it restarts the process
    that the engine's other strategies share, so once is enough."""
    first: dict[str, str] = {}
    for name, about in backends.items():
        engine = about.get("engine") if isinstance(about, dict) else None
        first.setdefault(str(engine or name), name)
    return list(first.values())


def wait_until_idle(
    proxy: str, api_key: str | None, quiet_s: float = 5, patience_s: float = 1800
) -> bool:
    """Wait until every backend is ready with no request in flight or queued for quiet_s;
    False on timeout.

    A bare llama-server session started during the proxy's start-up calibration would share
    the cores with it and be measured slow, which flatters every proxy mode; calibration
    starts once the backends are ready.
    """
    deadline = time.monotonic() + patience_s
    quiet_since: float | None = None
    announced = False
    while time.monotonic() < deadline:
        backends = requests.get(f"{proxy}/health", headers=_auth(api_key), timeout=10).json()
        busy = [
            name
            for name, b in backends.get("backends", {}).items()
            if b.get("in_flight", 0) or b.get("queued", 0) or b.get("state") != "ready"
        ]
        now = time.monotonic()
        if busy:
            quiet_since = None
            if not announced:
                log(f"waiting for the proxy to go idle ({', '.join(busy)} busy or starting)")
                announced = True
        elif quiet_since is None:
            quiet_since = now
        elif now - quiet_since >= quiet_s:
            return True
        time.sleep(1)
    return False


def restart_backends(
    proxy: str, names: Sequence[str], api_key: str | None, patience_s: float = 1800
) -> list[str]:
    """Restart each backend through the proxy (empty caches); the ones that could not be.

    The proxy refuses while a backend has requests in flight or queued (start-up calibration,
    a turn still leaving): that refusal is retried for up to patience_s.
    """
    failed = []
    for name in names:
        deadline = time.monotonic() + patience_s
        waiting = False
        while True:
            try:
                resp = requests.post(
                    f"{proxy}/admin/backends/{name}/restart", headers=_auth(api_key), timeout=1800
                )
            except requests.RequestException as exc:
                log(f"could not restart {name}: {exc}")
                failed.append(name)
                break
            if resp.status_code == 200:
                log(f"restarted {name} ({resp.json().get('took_s')} s)")
                break
            error = resp.json().get("error", {}) if resp.content else {}
            if error.get("code") == "backend_busy" and time.monotonic() < deadline:
                if not waiting:
                    log(f"{name} is busy; waiting to restart it")
                    waiting = True
                time.sleep(2)
                continue
            log(f"could not restart {name}: HTTP {resp.status_code} {error.get('message', '')}")
            failed.append(name)
            break
    return failed


def _turns(
    http: requests.Session, url: str, session: Session | EditSession, model: str, timeout: float
) -> Iterator[TurnResult]:
    """A session's turns as they are made: a generated session until done, a captured one
    request by request until one fails."""
    if isinstance(session, EditSession):
        for index in range(len(session.turns)):
            result = send_edit_turn(http, url, session, index, model, timeout_s=timeout)
            yield result
            if not result.ok:
                return
        return
    while (made := send_turn(http, url, session, model, timeout)) is not None:
        yield made


def replay(
    url: str,
    mode: str,
    session: Session | EditSession,
    label: str,
    args: argparse.Namespace,
    headers: dict[str, str],
) -> Iterator[Row]:
    """One session through one mode, one turn at a time."""
    model = AUTO if mode == BARE else mode
    with requests.Session() as http:
        http.headers.update(headers)
        for result in _turns(http, url, session, model, args.timeout):
            total = len(session.turns) if isinstance(session, EditSession) else args.turns
            what = ",".join(result.tools_called) or "text"
            log(
                f"[{mode}] {label} turn {result.turn + 1}/{total} {result.kind}: "
                f"{result.seconds:.1f} s (TTFT {_seconds(result.ttft_s)}), {result.prompt_n}+"
                f"{result.cache_n} prompt, {result.predicted_n} tokens, {what}"
                + (f", {result.backend}/{result.route}" if result.backend else "")
                + (f" -- {result.error}" if result.error else "")
            )
            yield {"mode": mode, **asdict(result)}


def together(
    url: str,
    mode: str,
    sessions: Sequence[Session | EditSession],
    label: str,
    args: argparse.Namespace,
    headers: dict[str, str],
) -> list[Row]:
    """Sessions run at once, each in its own thread, as several agents (or an agent and its
    sub-agents) share one server; every turn tagged with how many ran."""

    def one(session: Session | EditSession) -> list[Row]:
        return list(replay(url, mode, session, label, args, headers))

    with ThreadPoolExecutor(max_workers=len(sessions)) as pool:
        done = list(pool.map(one, sessions))
    return [{**row, "concurrency": len(sessions)} for turns in done for row in turns]


def sessions_of(shape: str, count: int, args: argparse.Namespace) -> list[Session | EditSession]:
    """`count` sessions of a shape: generated, or real agents' captured ones."""
    if shape == CAPTURED:
        return list(edit_sessions(count, args.edits, args.agents, first_variant=args.seed))
    generated = build_sessions(cast(Shape, shape), count, args.seed, args.system_tokens, args.turns)
    return list(generated)


def run(args: argparse.Namespace) -> list[Row]:
    """Round by round, every mode in turn from empty caches, N sessions at once at each level
    of --concurrency; every turn is appended to <out>/turns.jsonl.

    Modes are interleaved, not run one after another: this machine's speed drifts over
    minutes, and a mode run half an hour after another would be compared on another machine.
    Each round's modes start one place later in the order, so none always goes first.
    """
    headers = _auth(args.api_key)
    health = _health_backends(args.proxy, args.api_key)
    backends, engines = list(health), one_per_engine(health)
    modes = args.modes or [BARE, *backends, AUTO]
    unknown = [m for m in modes if m not in (AUTO, BARE, *backends)]
    if unknown:
        raise SystemExit(f"unknown modes {unknown}; the proxy's backends are {backends}")
    if not wait_until_idle(args.proxy, args.api_key):
        raise SystemExit(f"{args.proxy} stayed busy for 30 minutes; nothing was measured")
    args.out.mkdir(parents=True, exist_ok=True)
    turns_path = args.out / "turns.jsonl"
    rows: list[Row] = []
    # Round r at level n runs sessions r*n .. r*n+n-1: n different sessions at once.
    plan = [
        (shape, level, r)
        for shape in args.shapes
        for level in args.concurrency
        for r in range(args.sessions)
    ]
    with turns_path.open("w") as sink:
        for k, (shape, level, r) in enumerate(plan):
            order = modes[k % len(modes) :] + modes[: k % len(modes)]
            for mode in order:
                # Fresh copies for each mode: the same scripts, each mode its own answers.
                group = sessions_of(shape, level * args.sessions, args)[r * level : (r + 1) * level]
                label = f"{shape} x{level} {r + 1}/{args.sessions}"
                if mode == BARE:
                    port = free_port()
                    argv = bare_command(args.config, args.ctx, port)
                    with BareServer(argv, port, args.out / "llama-server.log") as server:
                        turns = together(server.url, mode, group, label, args, {})
                    fresh = True
                else:
                    failed = restart_backends(args.proxy, engines, args.api_key)
                    if failed:
                        log(f"NOT restarted before {mode}: {', '.join(failed)} (caches warm)")
                    fresh = not failed
                    turns = together(args.proxy, mode, group, label, args, headers)
                for row in turns:
                    # Whether the round began on restarted engines: the report counts those that
                    # did not.
                    row["fresh"] = fresh
                    rows.append(row)
                    sink.write(json.dumps(row) + "\n")
                sink.flush()
    return rows


def _levels(text: str) -> list[int]:
    try:
        levels = [int(x) for x in _csv(text)]
    except ValueError:
        levels = []
    if not levels or any(n < 1 for n in levels):
        raise argparse.ArgumentTypeError("concurrency is a list of positive counts, e.g. 1,2,4")
    return levels


def _csv(text: str) -> list[str]:
    return [item.strip() for item in text.split(",") if item.strip()]


def _shapes(text: str) -> list[str]:
    shapes = _csv(text)
    if not shapes or any(s not in (*SHAPES, CAPTURED) for s in shapes):
        raise argparse.ArgumentTypeError(f"shapes are {', '.join((*SHAPES, CAPTURED))}")
    return shapes


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    """The command line."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--proxy", default="http://127.0.0.1:8080", help="the running specproxy")
    p.add_argument(
        "--config",
        type=Path,
        help="the config the proxy was started with (default: the embedded CPU config); "
        "bare llama-server serves its plain backend's model with its threads",
    )
    p.add_argument("--shapes", type=_shapes, default=list(SHAPES), help="session shapes")
    p.add_argument("--sessions", type=int, default=3, help="rounds per shape, level and mode")
    p.add_argument(
        "--concurrency",
        type=_levels,
        default=[1],
        help="sessions at once, per level (e.g. 1,2,4): each round runs that many together",
    )
    p.add_argument("--turns", type=int, default=DEFAULT_TURNS, help="requests per session")
    p.add_argument("--system-tokens", type=int, default=DEFAULT_SYSTEM_TOKENS)
    p.add_argument("--edits", type=int, default=2, help=f"renames per {CAPTURED} session")
    p.add_argument(
        "--agents", type=_csv, default=[], help=f"the agents {CAPTURED} replays (default: all)"
    )
    p.add_argument(
        "--modes",
        type=_csv,
        help=f"{BARE}, backend names, auto, run in this order (default: {BARE}, every "
        "backend, then auto)",
    )
    p.add_argument(
        "--seed",
        type=int,
        default=0,
        help=f"which sessions (the same in every mode); for {CAPTURED}, the first variant: "
        "0 starts from each captured request word for word, others name the new functions anew",
    )
    p.add_argument("--out", type=Path, default=Path("session-results"), help="report folder")
    # Agents resend up to 20 k tokens; on two CPU cores a cold one takes minutes.
    p.add_argument("--ctx", type=int, default=32768, help="bare llama-server's -c")
    p.add_argument("--timeout", type=float, default=1800, help="seconds one turn may take")
    p.add_argument("--api-key", help="for a proxy with api_keys")
    p.add_argument(
        "--report-only", action="store_true", help="rewrite the report from <out>/turns.jsonl"
    )
    a = p.parse_args(argv)
    a.proxy = a.proxy.rstrip("/")
    return a


def main(argv: list[str] | None = None) -> int:
    """Replay every mode, then print and write the report; 1 if any turn failed."""
    args = parse_args(argv)
    # A SIGTERM runs the finally blocks too, so the bare llama-server never outlives the script.
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(143))
    if args.report_only:
        turns = args.out / "turns.jsonl"
        if not turns.is_file():
            log(f"{turns} does not exist; run the benchmark with --out {args.out} first")
            return 2
        rows = [json.loads(line) for line in turns.read_text().splitlines() if line]
    else:
        try:
            rows = run(args)
        except requests.RequestException as exc:
            log(f"cannot reach the proxy at {args.proxy}: {exc}; start it with `make serve`")
            return 2
    modes = list(dict.fromkeys(r["mode"] for r in rows))
    report = markdown(rows, modes, args.shapes)
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "report.md").write_text(report)
    print(report)
    log(f"report: {args.out / 'report.md'}, every turn: {args.out / 'turns.jsonl'}")
    return 1 if any(r["error"] for r in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
