"""DraftLengths: each routed request's longest draft, chosen from measured decode speed.

A speculative strategy drafts at most its process's `--spec-draft-n-max` tokens a step (64 for
ngram-mod), whatever the text. The best length depends on the text (a copied file accepts long
drafts, prose rejects them and pays for verifying them) and on the batch (every drafted token of
every sequence is verified in the one batch). Our build takes a shorter cap per request
(`speculative.n_max`), so per (strategy, class, load level) the router keeps the decode speed
each length measured and sends the fastest, trying a neighbouring length now and then. What it
measured is saved beside the scoreboard, so a restarted proxy starts from it, not from the caps.
"""

from __future__ import annotations

import json
import random
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from pathlib import Path

from proxy.json_file import write_json
from proxy.routing.scoreboard import LOAD_LEVELS

# Samples a length needs before it may become a cell's best: one prompt's acceptance says
# little of the class's.
MIN_SAMPLES = 3
# A cell with fewer samples than this tries a neighbour on every other request: from the cap
# (64 for ngram-mod) to a prose cell's best (2-4) is four steps of the ladder.
YOUNG_SAMPLES = 40
YOUNG_SHARE = 0.5
# Accepted / drafted tokens at the current length that settle the direction worth trying: a
# draft mostly accepted loses tokens per step when cut (a copied file, 0.93 at 64), and one
# mostly rejected only pays for verifying more when lengthened.
MOSTLY_ACCEPTED = 0.75
MOSTLY_REJECTED = 0.25


def ladder(cap: int) -> tuple[int, ...]:
    """The lengths tried under a cap: powers of two from 2, and the cap itself."""
    steps = {n for n in (2, 4, 8, 16, 32, 64, 128) if n < cap}
    return tuple(sorted(steps | {max(cap, 1)}))


@dataclass
class Arm:
    """What one draft length measured in one cell: decayed decode tokens/s and acceptance."""

    tokens_per_s: float = 0.0
    acceptance: float | None = None
    samples: int = 0


@dataclass(frozen=True)
class DraftChoice:
    """The length a request drafts at, and whether it was a try of a neighbouring length."""

    n_max: int
    explored: bool


@dataclass(frozen=True)
class DraftCell:
    """One cell's lengths as the status page and metrics show them."""

    backend: str
    task: str
    level: int
    best: int
    arms: dict[int, Arm]


class DraftLengths:
    """Per (strategy, class, load level): decode speed by draft length, and the choice."""

    def __init__(
        self, explore_share: float = 0.1, alpha: float = 0.2, rng: random.Random | None = None
    ) -> None:
        self.explore_share = explore_share
        self.alpha = alpha
        self._rng = rng or random.Random()
        self._cells: dict[tuple[str, str, int], dict[int, Arm]] = {}
        # Each backend's own length, the incumbent a tried length must beat (learnt in choose).
        self._caps: dict[str, int] = {}

    def best(self, backend: str, task: str, level: int) -> int | None:
        """The fastest length measured at this level: among those with MIN_SAMPLES or more,
        and the backend's own length (its cap) however few it has, since that is what the
        process drafts without us; None before either."""
        arms = self._cells.get((backend, task, level), {})
        cap = self._caps.get(backend)
        sure = {n: a for n, a in arms.items() if a.samples >= MIN_SAMPLES or n == cap}
        if not sure:
            return None
        return max(sure, key=lambda n: sure[n].tokens_per_s)

    def choose(self, backend: str, task: str, level: int, cap: int) -> DraftChoice:
        """This request's length: the cell's best, else a lighter load's best shortened one
        step per doubling of the batch, else the cap; for a share of them, a neighbour on the side
        its measured acceptance leaves worth trying."""
        steps = ladder(cap)
        self._caps[backend] = steps[-1]
        current = self._current(backend, task, level, steps)
        arms = self._cells.get((backend, task, level), {})
        young = sum(a.samples for a in arms.values()) < YOUNG_SAMPLES
        share = self.explore_share
        if young and share > 0:  # 0 turns trying off altogether
            share = max(share, YOUNG_SHARE)
        if self._rng.random() >= share:
            return DraftChoice(current, False)
        neighbours = _worth_trying(steps, current, arms.get(current))
        if not neighbours:
            return DraftChoice(current, False)
        # The neighbour measured least: both sides of the best get their samples.
        fewest = min(neighbours, key=lambda n: (arms[n].samples if n in arms else 0, n))
        return DraftChoice(fewest, True)

    def _current(self, backend: str, task: str, level: int, steps: tuple[int, ...]) -> int:
        own = self.best(backend, task, level)
        if own is not None and own in steps:
            return own
        lighter = [lv for lv in LOAD_LEVELS if lv < level]
        for lv in reversed(lighter):
            found = self.best(backend, task, lv)
            if found is not None and found in steps:
                # Every sequence's drafts share one verification batch: a batch twice as wide
                # gets half the room per sequence.
                shorter = steps.index(found) - (level // lv).bit_length() + 1
                return steps[max(shorter, 0)]
        return steps[-1]

    def record(
        self,
        backend: str,
        task: str,
        level: int,
        n_max: int,
        tokens_per_s: float,
        acceptance: float | None,
    ) -> None:
        """Fold one request's decode speed (and acceptance) into its length's arm."""
        arm = self._cells.setdefault((backend, task, level), {}).setdefault(n_max, Arm())
        a = max(self.alpha, 1.0 / (arm.samples + 1))
        arm.tokens_per_s += a * (tokens_per_s - arm.tokens_per_s)
        if acceptance is not None:
            prev = arm.acceptance
            arm.acceptance = acceptance if prev is None else prev + a * (acceptance - prev)
        arm.samples += 1

    def cells(self) -> Iterator[DraftCell]:
        """Every cell measured, with its best length."""
        for (backend, task, level), arms in sorted(self._cells.items()):
            best = self.best(backend, task, level)
            if best is not None:
                yield DraftCell(backend, task, level, best, dict(sorted(arms.items())))

    def save(self, path: Path) -> None:
        """Persist every cell's lengths atomically as JSON."""
        rows = [
            {"backend": b, "task": t, "level": lv, "n_max": n, **asdict(arm)}
            for (b, t, lv), arms in sorted(self._cells.items())
            for n, arm in sorted(arms.items())
        ]
        write_json(path, {"draft_lengths": rows})

    def load(self, path: Path) -> int:
        """Read lengths saved earlier; how many were loaded (0 if none or unreadable)."""
        try:
            rows = json.loads(path.read_text())["draft_lengths"]
            cells: dict[tuple[str, str, int], dict[int, Arm]] = {}
            for row in rows:
                key = (str(row["backend"]), str(row["task"]), int(row["level"]))
                acceptance = row.get("acceptance")
                cells.setdefault(key, {})[int(row["n_max"])] = Arm(
                    float(row["tokens_per_s"]),
                    None if acceptance is None else float(acceptance),
                    int(row["samples"]),
                )
        except (OSError, ValueError, TypeError, KeyError):
            return 0
        self._cells.update(cells)
        return len(rows)


def _worth_trying(steps: tuple[int, ...], current: int, arm: Arm | None) -> list[int]:
    """The neighbours of the current length its measured acceptance leaves worth a try; none
    before the current length has a sample of its own."""
    if arm is None or arm.samples == 0:
        return []
    i = steps.index(current)
    shorter = [steps[i - 1]] if i > 0 else []
    longer = [steps[i + 1]] if i + 1 < len(steps) else []
    if arm.acceptance is None:
        return shorter + longer
    if arm.acceptance >= MOSTLY_ACCEPTED:
        return longer
    if arm.acceptance <= MOSTLY_REJECTED:
        return shorter
    return shorter + longer
