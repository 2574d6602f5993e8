"""The sweep's report: a CSV row per cell, Markdown tables with verdicts, and a PNG plot."""

from __future__ import annotations

import csv
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.lines import Line2D

from loadtests.measure import RunSummary
from loadtests.sessions import TurnSample, cached_share, is_agent_task

AUTO = "auto"
# The agent cells' baseline: a bare llama-server started for the cell, not behind the proxy.
BARE = "llama-server"
CSV_FIELDS = (
    "task",
    "backend",
    "concurrency",
    "requests",
    "failures",
    "cut",
    "tokens",
    "wall_s",
    "aggregate_tps",
    "per_stream_tps",
    "ttft_p50_s",
    "acceptance",
    "answered_by",
    "sessions",
    "session_s",
    "cached_share",
    "later_cached_share",
    "session_vs_bare",
)


@dataclass(frozen=True)
class AgentSummary:
    """What the agents of one cell went through: their sessions and the prompt cache."""

    sessions: int
    complete: int
    turns: int
    session_s: float | None
    cached_share: float | None
    # Turns after the first: how much of the conversation so far a server still had.
    later_cached_share: float | None


def agent_summary(samples: Sequence[TurnSample], turns: int | None = None) -> AgentSummary:
    """Sessions of a cell; complete ones (every turn answered, `turns` of them if given) get a
    wall time from their first request to their last answer."""
    answered = [s for s in samples if s.outcome == "ok"]
    by_session: dict[str, list[TurnSample]] = {}
    for s in samples:
        by_session.setdefault(s.session, []).append(s)
    complete = [
        group
        for group in by_session.values()
        if all(s.outcome == "ok" for s in group) and (turns is None or len(group) == turns)
    ]
    walls = [max(s.end for s in g) - min(s.start for s in g) for g in complete]
    return AgentSummary(
        sessions=len(by_session),
        complete=len(complete),
        turns=len(samples),
        session_s=statistics.fmean(walls) if walls else None,
        cached_share=cached_share(answered),
        later_cached_share=cached_share(s for s in answered if s.turn >= 1),
    )


@dataclass(frozen=True)
class Cell:
    """One measured point: a task class sent to one backend (or auto) by N concurrent users."""

    task: str
    backend: str
    concurrency: int
    summary: RunSummary
    agent: AgentSummary | None = None


@dataclass(frozen=True)
class SweepSetup:
    """What the report's header says about how the numbers were taken."""

    url: str
    kinds: dict[str, str]
    baseline: str | None
    margin: float
    description: str


def _round(value: float | None, digits: int = 2) -> str:
    return "" if value is None else f"{value:.{digits}f}"


def _shares(backends: dict[str, int]) -> str:
    total = sum(backends.values())
    return ", ".join(f"{b} {100 * n / total:.0f}%" for b, n in backends.items()) if total else ""


def write_csv(path: Path, cells: Sequence[Cell]) -> None:
    """One row per cell."""
    with path.open("w", newline="") as f:
        writer = csv.writer(f)
        writer.writerow(CSV_FIELDS)
        for c in cells:
            s = c.summary
            writer.writerow(
                [
                    c.task,
                    c.backend,
                    c.concurrency,
                    s.requests,
                    s.failures,
                    s.cut,
                    s.tokens,
                    _round(s.wall_s),
                    _round(s.aggregate_tps),
                    _round(s.per_stream_tps),
                    _round(s.ttft_p50_s, 3),
                    _round(s.acceptance, 3),
                    " ".join(f"{b}:{n}" for b, n in s.backends.items()),
                    c.agent.sessions if c.agent else "",
                    _round(c.agent.session_s) if c.agent else "",
                    _round(c.agent.cached_share, 3) if c.agent else "",
                    _round(c.agent.later_cached_share, 3) if c.agent else "",
                    _round(session_vs_bare(cells, c)),
                ]
            )


def _aggregate(cells: Sequence[Cell], task: str) -> dict[tuple[str, int], float]:
    return {
        (c.backend, c.concurrency): c.summary.aggregate_tps
        for c in cells
        if c.task == task and c.summary.aggregate_tps > 0
    }


def speedups(
    cells: Sequence[Cell], task: str, backend: str, baseline: str, levels: Sequence[int]
) -> dict[int, float | None]:
    """Aggregate tokens/s of backend over baseline's at each level; None where one is missing."""
    agg = _aggregate(cells, task)
    out: dict[int, float | None] = {}
    for level in levels:
        mine, base = agg.get((backend, level)), agg.get((baseline, level))
        out[level] = mine / base if mine and base else None
    return out


def pays_up_to(ratios: dict[int, float | None], margin: float) -> int | None:
    """The highest level such that speculation pays at it and every level below; None if not."""
    highest = None
    for level in sorted(ratios):
        ratio = ratios[level]
        if ratio is None or ratio < 1 + margin:
            break
        highest = level
    return highest


def _streams(n: int) -> str:
    return f"{n} concurrent stream" + ("" if n == 1 else "s")


def _backend_verdict(ratios: dict[int, float | None], margin: float) -> str:
    paying = [lv for lv, r in ratios.items() if r is not None and r >= 1 + margin]
    up_to = pays_up_to(ratios, margin)
    if not paying:
        return "never pays"
    if up_to == max(ratios):
        return "pays at every level"
    if up_to is not None and paying == [lv for lv in ratios if lv <= up_to]:
        return f"pays up to {_streams(up_to)}"
    return "pays at " + ", ".join(str(lv) for lv in paying) + " only"


def verdict(
    cells: Sequence[Cell],
    task: str,
    baseline: str,
    speculative: Sequence[str],
    levels: Sequence[int],
    margin: float,
) -> list[str]:
    """A headline, then one line per speculative backend: where it beats the baseline."""
    ratios = {b: speedups(cells, task, b, baseline, levels) for b in speculative}
    reached = {b: lv for b, r in ratios.items() if (lv := pays_up_to(r, margin)) is not None}
    measured = [v for r in ratios.values() for v in r.values() if v is not None]
    if reached:
        best = max(reached.values())
        who = ", ".join(b for b, lv in reached.items() if lv == best)
        if best == max(levels):
            head = f"Speculation pays at every concurrency tested, up to {best} ({who})."
        else:
            head = (
                f"Speculation pays up to {_streams(best)} on this hardware ({who}); "
                f"from there on {baseline} is as fast or faster."
            )
    elif any(v >= 1 + margin for v in measured):
        head = f"Speculation does not pay at {_streams(min(levels))}; see where it does below."
    elif measured:
        head = f"Speculation does not pay at any concurrency tested: {baseline} is the one to use."
    else:
        head = "Not enough measurements for a verdict."
    lines = [f"**{head}** (pays = at least {margin:.0%} more aggregate tokens/s than {baseline})"]
    lines.append("")
    for b, r in ratios.items():
        shown = ", ".join(f"×{v:.2f} at {lv}" for lv, v in r.items() if v is not None)
        lines.append(f"- {b}: {shown or 'not measured'} → {_backend_verdict(r, margin)}")
    return lines


def auto_lines(cells: Sequence[Cell], task: str, levels: Sequence[int]) -> list[str]:
    """Per level: which backends auto chose, and its aggregate against the best pinned one."""
    agg = _aggregate(cells, task)
    by_key = {(c.backend, c.concurrency): c for c in cells if c.task == task}
    lines = []
    for level in levels:
        cell = by_key.get((AUTO, level))
        if cell is None:
            continue
        pinned = {b: v for (b, lv), v in agg.items() if lv == level and b not in (AUTO, BARE)}
        text = f"- auto at {level}: chose {_shares(cell.summary.backends) or 'nothing'}"
        if pinned and cell.summary.aggregate_tps > 0:
            best = max(pinned, key=lambda b: pinned[b])
            share = cell.summary.aggregate_tps / pinned[best]
            text += f"; {share:.0%} of the best pinned backend ({best}, {pinned[best]:.1f} tok/s)"
            answered = cell.summary.backends
            main = max(answered, key=lambda b: answered[b]) if answered else None
            # Same prompts, same backend: how far two cells of one backend differ here.
            if main in pinned and main != best and answered[main] == sum(answered.values()):
                text += f", {cell.summary.aggregate_tps / pinned[main]:.0%} of {main} pinned"
        lines.append(text)
    return lines


def session_ratios(
    cells: Sequence[Cell], task: str, backend: str, baseline: str, levels: Sequence[int]
) -> dict[int, float | None]:
    """Mean agent session time of backend over baseline's at each level (below 1 is faster)."""
    times = {
        (c.backend, c.concurrency): c.agent.session_s
        for c in cells
        if c.task == task and c.agent is not None and c.agent.session_s
    }
    out: dict[int, float | None] = {}
    for level in levels:
        mine, base = times.get((backend, level)), times.get((baseline, level))
        out[level] = mine / base if mine and base else None
    return out


def session_vs_bare(cells: Sequence[Cell], cell: Cell) -> float | None:
    """A cell's mean session time over the llama-server cell's at its task and level."""
    level = cell.concurrency
    return session_ratios(cells, cell.task, cell.backend, BARE, [level])[level]


def agent_lines(
    cells: Sequence[Cell], task: str, backends: Sequence[str], baseline: str | None
) -> list[str]:
    """A table of session time, time to first token and later turns' cached share, then
    session times relative to bare llama-server's (the baseline's where it did not run)."""
    levels = sorted({c.concurrency for c in cells if c.task == task})
    by_key = {(c.backend, c.concurrency): c for c in cells if c.task == task}
    reference = BARE if any(b == BARE for b, _ in by_key) else baseline
    out = [
        "",
        "Agent sessions: mean session wall time (first request to last answer, complete "
        "sessions only), median time to first token, share of the prompt tokens of later turns "
        "(all but each session's first) served from cache.",
        "",
        "| backend | " + " | ".join(f"×{lv}" for lv in levels) + " |",
        "| --- |" + " ---: |" * len(levels),
    ]
    for b in backends:
        row = []
        for lv in levels:
            cell = by_key.get((b, lv))
            agent = cell.agent if cell else None
            if cell is None or agent is None:
                row.append("")
                continue
            session = f"{agent.session_s:.0f} s" if agent.session_s is not None else "-"
            ttft = _round(cell.summary.ttft_p50_s, 1) or "-"
            later = agent.later_cached_share
            cached = f"{later:.0%}" if later is not None else "-"
            partial = (
                f" ({agent.complete}/{agent.sessions})" if agent.complete < agent.sessions else ""
            )
            row.append(f"{session}{partial}, TTFT {ttft} s, {cached}")
        out.append(f"| {b} | " + " | ".join(row) + " |")
    if reference is not None and reference in backends:
        out.append("")
        for b in backends:
            if b == reference:
                continue
            ratios = session_ratios(cells, task, b, reference, levels)
            shown = ", ".join(f"×{v:.2f} at {lv}" for lv, v in ratios.items() if v is not None)
            out.append(f"- {b}: session time {shown or 'not measured'} of {reference}'s")
    return out


def failed_cell(summary: RunSummary) -> bool:
    """A cell with failed requests, or one that produced no token at all."""
    return bool(summary.failures) or summary.tokens == 0


def write_markdown(path: Path, cells: Sequence[Cell], setup: SweepSetup) -> None:
    """Per task class: a table of tokens/s, the verdict and what auto did."""
    levels = sorted({c.concurrency for c in cells})
    backends = list(dict.fromkeys(c.backend for c in cells))
    kinds = ", ".join(
        f"{b} ({setup.kinds.get(b, 'bare' if b == BARE else '?')})" for b in backends if b != AUTO
    )
    out = [
        "# Does speculation help under batching?",
        "",
        f"Proxy {setup.url}; backends {kinds}. {setup.description}",
        "",
        "Each cell: aggregate tokens/s (all generated tokens / wall time of the cell), "
        "then the mean per-stream generation speed in parentheses (llama.cpp "
        "`predicted_per_second`; for a stream cut at the end of the cell, its tokens over the "
        "time from its first to its last token).",
    ]
    speculative = [b for b in backends if b not in (AUTO, BARE, setup.baseline)]
    for task in dict.fromkeys(c.task for c in cells):
        by_key = {(c.backend, c.concurrency): c.summary for c in cells if c.task == task}
        # llama-server runs agent cells only: no empty row under the other classes.
        measured = [b for b in backends if any(k[0] == b for k in by_key)]
        out += ["", f"## {task}", "", "| backend | " + " | ".join(f"×{lv}" for lv in levels) + " |"]
        out.append("| --- |" + " ---: |" * len(levels))
        for b in measured:
            row = []
            for lv in levels:
                s = by_key.get((b, lv))
                row.append(
                    "" if s is None else f"{s.aggregate_tps:.1f} ({_round(s.per_stream_tps, 1)})"
                )
            out.append(f"| {b} | " + " | ".join(row) + " |")
        out.append("")
        if setup.baseline not in backends:
            out.append("No plain backend measured to compare with (see --baseline); no verdict.")
        elif not speculative:
            out.append(f"No speculative backend measured besides {setup.baseline}; no verdict.")
        else:
            out += verdict(cells, task, setup.baseline, speculative, levels, setup.margin)
        out += auto_lines(cells, task, levels)
        if is_agent_task(task):
            out += agent_lines(cells, task, measured, setup.baseline)
    failed = [c for c in cells if failed_cell(c.summary)]
    if failed:
        out += ["", "## Failures", ""]
        out += [
            f"- {c.task} / {c.backend} / ×{c.concurrency}: {c.summary.failures} failed of "
            f"{c.summary.requests}, {c.summary.tokens} tokens, first error: "
            f"`{c.summary.first_error}` (see cells/{c.task}-{c.backend}-c{c.concurrency}.log)"
            for c in failed
        ]
    path.write_text("\n".join(out) + "\n")


def write_plot(path: Path, cells: Sequence[Cell]) -> None:
    """Aggregate (solid) and per-stream (dashed) tokens/s against concurrency, a panel per task."""
    tasks = list(dict.fromkeys(c.task for c in cells))
    backends = list(dict.fromkeys(c.backend for c in cells))
    levels = sorted({c.concurrency for c in cells})
    colours = {b: f"C{i % 10}" for i, b in enumerate(backends)}
    fig = Figure(figsize=(4.5 * len(tasks) + 1.5, 4), layout="constrained")
    FigureCanvasAgg(fig)  # Agg renders the PNG without a display
    for ax, task in zip(fig.subplots(1, len(tasks), squeeze=False)[0], tasks, strict=True):
        for b in backends:
            mine = sorted(
                (c for c in cells if c.task == task and c.backend == b), key=lambda c: c.concurrency
            )
            ax.plot(
                [c.concurrency for c in mine],
                [c.summary.aggregate_tps for c in mine],
                "o-",
                color=colours[b],
            )
            timed = [c for c in mine if c.summary.per_stream_tps is not None]
            ax.plot(
                [c.concurrency for c in timed],
                [c.summary.per_stream_tps for c in timed],
                "x--",
                color=colours[b],
            )
        ax.set_xscale("log", base=2)
        ax.set_xticks(levels, [str(lv) for lv in levels])
        ax.set_title(task)
        ax.set_xlabel("concurrent streams")
        ax.set_ylabel("tokens/s")
        ax.set_ylim(bottom=0)
        ax.grid(alpha=0.3)
    handles = [Line2D([], [], color=colours[b], label=b) for b in backends] + [
        Line2D([], [], color="black", linestyle="-", marker="o", label="aggregate"),
        Line2D([], [], color="black", linestyle="--", marker="x", label="per stream"),
    ]
    fig.legend(handles=handles, loc="outside right center")
    fig.savefig(path, dpi=100)
