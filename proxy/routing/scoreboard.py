"""Scoreboard: decayed, measured speed and acceptance per (backend, task class, load level)."""

from __future__ import annotations

import json
import os
from dataclasses import asdict, dataclass
from pathlib import Path

from proxy.llamacpp import Timings

LOAD_LEVELS = (1, 2, 4, 8)
_FAST = 0.5


def load_level(in_flight: int) -> int:
    """The load bucket for a request that will run with in_flight requests on its backend."""
    for level in LOAD_LEVELS:
        if in_flight <= level:
            return level
    return LOAD_LEVELS[-1]


@dataclass
class Estimate:
    """Exponentially decayed averages of what one backend did for one task class at one load.

    ``tokens_per_s`` is decayed generated tokens over decayed generation seconds, so an answer
    weighs as much as the time it took: what a backend gives the traffic, where a mean of
    per-request rates would let a 40-token answer count as much as a 400-token one.
    """

    tokens_per_s: float = 0.0
    tokens: float = 0.0
    seconds: float = 0.0
    ttft_s: float = 0.0
    drafted: float = 0.0
    accepted: float = 0.0
    recent_acceptance: float | None = None
    samples: int = 0

    @property
    def acceptance(self) -> float | None:
        """Long-run accepted / drafted tokens, None for a backend that drafted nothing."""
        return self.accepted / self.drafted if self.drafted > 0 else None


@dataclass(frozen=True)
class Outcome:
    """What one finished request measured."""

    backend: str
    task: str
    level: int
    tokens_per_s: float | None
    ttft_s: float | None
    predicted_n: int
    draft_n: int
    draft_n_accepted: int

    @classmethod
    def from_timings(
        cls,
        backend: str,
        task: str,
        level: int,
        timings: Timings,
        ttft_s: float | None = None,
    ) -> Outcome:
        """A sample from what llama.cpp measured."""
        return cls(
            backend=backend,
            task=task,
            level=level,
            tokens_per_s=timings.tokens_per_s if timings.measured else None,
            ttft_s=ttft_s,
            predicted_n=timings.predicted_n,
            draft_n=timings.draft_n,
            draft_n_accepted=timings.draft_n_accepted,
        )


class Scoreboard:
    """Keeps estimates; new samples weigh `alpha`, so old measurements fade."""

    def __init__(self, alpha: float = 0.2, min_tokens: int = 8) -> None:
        self.alpha = alpha
        self.min_tokens = min_tokens
        self._table: dict[tuple[str, str, int], Estimate] = {}

    def record(self, outcome: Outcome) -> None:
        """Fold one request's measurements in; very short generations say little and are skipped."""
        if not outcome.tokens_per_s or outcome.predicted_n < self.min_tokens:
            return
        est = self._table.setdefault((outcome.backend, outcome.task, outcome.level), Estimate())
        # The first samples weigh more, so a fresh estimate is not dragged toward zero.
        a = max(self.alpha, 1.0 / (est.samples + 1))
        seconds = outcome.predicted_n / outcome.tokens_per_s
        share = a if est.seconds > 0 else 1.0
        est.tokens += share * (outcome.predicted_n - est.tokens)
        est.seconds += share * (seconds - est.seconds)
        est.tokens_per_s = est.tokens / est.seconds
        if outcome.ttft_s is not None:
            est.ttft_s += a * (outcome.ttft_s - est.ttft_s)
        est.drafted += a * (outcome.draft_n - est.drafted)
        est.accepted += a * (outcome.draft_n_accepted - est.accepted)
        if outcome.draft_n > 0:
            now = outcome.draft_n_accepted / outcome.draft_n
            # A fast average beside the slow one: a collapse in acceptance shows at once.
            prev = est.recent_acceptance
            est.recent_acceptance = now if prev is None else prev + _FAST * (now - prev)
        est.samples += 1

    def get(self, backend: str, task: str, level: int) -> Estimate | None:
        """The estimate at exactly this load level, if any."""
        return self._table.get((backend, task, level))

    def measured_levels(self, backend: str, task: str) -> set[int]:
        """The load levels this backend has an estimate at for this task."""
        return {lv for lv in LOAD_LEVELS if (backend, task, lv) in self._table}

    def nearest(
        self, backend: str, task: str, level: int, among: set[int] | None = None
    ) -> Estimate | None:
        """The estimate at this load level, else at the closest measured level (of `among`)."""
        measured = self.measured_levels(backend, task)
        if among is not None:
            measured &= among
        if not measured:
            return None
        best = min(measured, key=lambda lv: (abs(lv - level), lv))
        return self._table[(backend, task, best)]

    def items(self) -> list[tuple[tuple[str, str, int], Estimate]]:
        """All estimates, sorted by key."""
        return sorted(self._table.items())

    def save(self, path: Path) -> None:
        """Persist atomically as JSON."""
        path.parent.mkdir(parents=True, exist_ok=True)
        rows = [
            {"backend": b, "task": t, "level": lv, **asdict(e)} for (b, t, lv), e in self.items()
        ]
        tmp = path.with_name(path.name + ".tmp")
        tmp.write_text(json.dumps(rows, indent=1))
        os.replace(tmp, path)

    def load(self, path: Path) -> int:
        """Read estimates saved earlier; returns how many were loaded (0 if none or unreadable)."""
        try:
            rows = json.loads(path.read_text())
            for row in rows:
                key = (str(row.pop("backend")), str(row.pop("task")), int(row.pop("level")))
                self._table[key] = Estimate(**row)
        except (OSError, ValueError, TypeError, KeyError, AttributeError):
            return 0
        return len(rows)
