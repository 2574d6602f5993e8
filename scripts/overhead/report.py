"""The overhead benchmark's report: its rows, their markdown tables, what the run is stamped
with, and the proxy's profile."""

from __future__ import annotations

import os
import pstats
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from . import ROOT


@dataclass
class LoopRow:
    setting: str
    clients: int
    mode: str
    result: dict[str, Any]


@dataclass
class StreamRow:
    setting: str
    streams: int
    result: dict[str, Any]
    rss_before_kib: int | None = None
    rss_peak_kib: int | None = None


def fmt(value: float | None, digits: int = 1) -> str:
    if value is None or value != value:  # None or nan
        return "—"
    return f"{value:,.{digits}f}"


def loop_table(rows: list[LoopRow]) -> str:
    by = {(r.setting, r.clients, r.mode): r.result for r in rows}
    lines = [
        "| setting | clients | mode | req/s | p50 ms | p99 ms | added p50 ms vs direct "
        "| specproxy / LiteLLM req/s | errors |",
        "|---|---:|---|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        res = r.result
        direct = by.get(("direct", r.clients, r.mode))
        added = (
            res["p50_ms"] - direct["p50_ms"]
            if direct is not None and r.setting != "direct"
            else None
        )
        litellm = by.get(("LiteLLM", r.clients, r.mode))
        ratio = (
            res["rps"] / litellm["rps"]
            if litellm and litellm["rps"] > 0 and r.setting.startswith("specproxy")
            else None
        )
        mode = "streamed" if r.mode == "stream" else "not streamed"
        lines.append(
            f"| {r.setting} | {r.clients} | {mode} | {fmt(res['rps'])} | {fmt(res['p50_ms'], 2)} "
            f"| {fmt(res['p99_ms'], 2)} | {fmt(added, 2)} | {fmt(ratio, 2)} | {res['errors']} |"
        )
    return "\n".join(lines)


def stream_table(rows: list[StreamRow]) -> str:
    walls = {(r.setting, r.streams): r.result["wall_s"] for r in rows}
    lines = [
        "| setting | streams | completed | peak open | wall s | wall / direct | p50 stream s "
        "| p99 stream s | RSS before MiB | RSS peak MiB | KiB per stream |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        res = r.result
        direct = walls.get(("direct", r.streams))
        vs = res["wall_s"] / direct if direct and r.setting != "direct" else None
        before = r.rss_before_kib / 1024 if r.rss_before_kib is not None else None
        peak = r.rss_peak_kib / 1024 if r.rss_peak_kib is not None else None
        per = (
            (r.rss_peak_kib - r.rss_before_kib) / r.streams
            if r.rss_peak_kib is not None and r.rss_before_kib is not None
            else None
        )
        lines.append(
            f"| {r.setting} | {r.streams} | {res['completed']} | {res['peak_open']} "
            f"| {fmt(res['wall_s'], 2)} | {fmt(vs, 2)} | {fmt(res['p50_s'], 2)} "
            f"| {fmt(res['p99_s'], 2)} | {fmt(before)} | {fmt(peak)} | {fmt(per)} |"
        )
    return "\n".join(lines)


def git_head() -> str:
    try:
        done = subprocess.run(
            ["git", "rev-parse", "--short", "HEAD"],
            cwd=ROOT,
            capture_output=True,
            text=True,
            check=True,
        )
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=ROOT,
            capture_output=True,
            text=True,
        ).stdout.strip()
        return done.stdout.strip() + (" (with uncommitted changes)" if dirty else "")
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def litellm_version(venv: Path) -> str:
    done = subprocess.run(
        [
            str(venv / "bin" / "python"),
            "-c",
            "import importlib.metadata as m;print(m.version('litellm'))",
        ],
        capture_output=True,
        text=True,
    )
    return done.stdout.strip() or "unknown"


def print_profile(path: Path, top: int = 15) -> None:
    """The proxy's own functions by cumulative time."""
    stats = pstats.Stats(str(path))
    rows = []
    # Stats.stats, the raw table pstats documents, is not in typeshed's stub of Stats.
    table = stats.stats  # type: ignore[attr-defined]
    for (filename, line, func), (_cc, nc, _tt, ct, _callers) in table.items():
        if f"{os.sep}proxy{os.sep}" in filename and str(ROOT) in filename:
            rows.append((ct, nc, f"{Path(filename).relative_to(ROOT)}:{line}({func})"))
    rows.sort(reverse=True)
    print(f"\ntop {top} cumulative functions in proxy/ ({path}):", file=sys.stderr)
    for ct, nc, where in rows[:top]:
        print(f"  {ct:8.3f} s  {nc:>9} calls  {where}", file=sys.stderr)
