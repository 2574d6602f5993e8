"""The lab table from bench runs: Markdown, CSV, a PNG chart and a recommendation."""

from __future__ import annotations

import csv
import statistics
from dataclasses import dataclass
from pathlib import Path

from proxy.bench.runner import Run


@dataclass(frozen=True)
class Cell:
    """Median measurements of one variant on one task at one temperature."""

    variant: str
    task: str
    temperature: float
    tokens_per_s: float
    speedup: float | None
    acceptance: float | None
    mean_accepted_length: float | None
    same_text: str
    predicted_n: int
    sweep: bool


def first_difference(a: str, b: str) -> int | None:
    """Index of the first differing character, None when the texts are equal."""
    if a == b:
        return None
    for i, (x, y) in enumerate(zip(a, b, strict=False)):
        if x != y:
            return i
    return min(len(a), len(b))


def _same_text(text: str, plain: str | None) -> str:
    if plain is None:
        return "n/a"
    diff = first_difference(text, plain)
    return "yes" if diff is None else f"no (from char {diff}: {text[diff : diff + 12]!r})"


def _median(values: list[float | None]) -> float | None:
    present = [v for v in values if v is not None]
    return statistics.median(present) if present else None


def summarise(runs: list[Run]) -> list[Cell]:
    """One cell per (variant, task, temperature), compared with plain at the same task and T."""
    groups: dict[tuple[str, str, float], list[Run]] = {}
    for run in runs:
        groups.setdefault((run.variant, run.task, run.temperature), []).append(run)
    plain = {(t, temp): rs for (v, t, temp), rs in groups.items() if v == "plain"}
    cells = []
    for (variant, task, temp), rs in groups.items():
        tps = statistics.median(r.tokens_per_s for r in rs)
        base = plain.get((task, temp))
        base_tps = statistics.median(r.tokens_per_s for r in base) if base else None
        cells.append(
            Cell(
                variant=variant,
                task=task,
                temperature=temp,
                tokens_per_s=tps,
                speedup=tps / base_tps if base_tps else None,
                acceptance=_median([r.acceptance for r in rs]),
                mean_accepted_length=_median([r.mean_accepted_length for r in rs]),
                same_text=_same_text(rs[0].text, base[0].text if base else None),
                predicted_n=rs[0].predicted_n,
                sweep=rs[0].sweep,
            )
        )
    return cells


def best_n_max(cells: list[Cell], task: str) -> Cell | None:
    """The fastest draft-simple n-max on a task at temperature 0."""
    drafts = [
        c
        for c in cells
        if c.task == task and c.temperature == 0 and c.variant.startswith("draft-simple")
    ]
    return max(drafts, key=lambda c: c.tokens_per_s) if drafts else None


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"


def markdown(cells: list[Cell], tasks: list[str], temperatures: list[float], note: str) -> str:
    """The lab's deliverable: rows task × configuration, one column group per temperature."""
    head = "| task | configuration |"
    rule = "| --- | --- |"
    for t in temperatures:
        head += f" t/s (T={t:g}) | speedup | acceptance | mean acc. len | same text as plain |"
        rule += " ---: | ---: | ---: | ---: | --- |"
    lines = [note, "", head, rule]
    by = {(c.variant, c.task, c.temperature): c for c in cells}
    variants = list(dict.fromkeys(c.variant for c in cells))
    for task in tasks:
        best = best_n_max(cells, task)
        for variant in variants:
            label = variant + (" **(best n-max)**" if best and best.variant == variant else "")
            row = f"| {task} | {label} |"
            for t in temperatures:
                c = by.get((variant, task, t))
                if c is None:
                    row += " | | | | |"
                    continue
                row += (
                    f" {c.tokens_per_s:.1f} | {_fmt(c.speedup, '.2f', '×')} |"
                    f" {_fmt(c.acceptance, '.2f')} | {_fmt(c.mean_accepted_length, '.2f')} |"
                    f" {c.same_text} |"
                )
            lines.append(row)
    return "\n".join(lines) + "\n"


def recommendation(cells: list[Cell]) -> str:
    """Which configuration to use for a coding assistant, general chat and edits, and why."""
    lines = []
    for task, use in (
        ("code", "a coding assistant"),
        ("prose", "general chat"),
        ("echo", "short rewrites"),
        ("edit", "whole-file edits"),
    ):
        options = [c for c in cells if c.task == task and c.temperature == 0]
        if not options:
            continue
        best = max(options, key=lambda c: c.tokens_per_s)
        why = f"{best.tokens_per_s:.1f} t/s, {_fmt(best.speedup, '.2f', '×')} plain"
        if best.acceptance is not None:
            why += f", acceptance {best.acceptance:.2f}"
        lines.append(f"For {use} ({task}): {best.variant} — {why}.")
    return "\n".join(lines)


def write_csv(cells: list[Cell], path: Path) -> None:
    """Long format: one row per variant, task and temperature."""
    with path.open("w", newline="") as fh:
        writer = csv.writer(fh)
        writer.writerow(
            [
                "task", "configuration", "temperature", "tokens_per_s", "speedup",
                "acceptance", "mean_accepted_length", "same_text_as_plain", "predicted_n",
            ]
        )  # fmt: skip
        for c in cells:
            writer.writerow(
                [
                    c.task, c.variant, c.temperature, f"{c.tokens_per_s:.2f}",
                    _fmt(c.speedup, ".3f"), _fmt(c.acceptance, ".3f"),
                    _fmt(c.mean_accepted_length, ".3f"), c.same_text, c.predicted_n,
                ]
            )  # fmt: skip


def write_chart(cells: list[Cell], tasks: list[str], path: Path, title: str) -> None:
    """Grouped bars: tokens/s at temperature 0 per task, one bar per configuration."""
    try:
        import matplotlib
    except ImportError:
        # Serving never plots, so the base install (and the container image) leaves it out.
        print(f"no {path.name}: matplotlib is missing; pip install 'specproxy[loadtest]' for it")
        return

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    variants = list(dict.fromkeys(c.variant for c in cells))
    by = {(c.variant, c.task): c.tokens_per_s for c in cells if c.temperature == 0}
    fig, ax = plt.subplots(figsize=(max(6, 1.6 * len(tasks) * len(variants) / 3), 4))
    width = 0.8 / len(variants)
    for i, variant in enumerate(variants):
        xs = [t + i * width for t in range(len(tasks))]
        ax.bar(xs, [by.get((variant, task), 0.0) for task in tasks], width, label=variant)
    ax.set_xticks([t + 0.4 - width / 2 for t in range(len(tasks))], tasks)
    ax.set_ylabel("generation tokens/s (T=0)")
    ax.set_title(title, fontsize=9)
    ax.legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
