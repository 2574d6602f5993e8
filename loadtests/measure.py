"""Per-request samples of a load test and what one run of them adds up to."""

from __future__ import annotations

import json
import statistics
from collections import Counter
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Literal

Outcome = Literal["ok", "failed", "cut"]


@dataclass
class Sample:
    """One request as the client saw it; `cut` means the run ended while it was in flight."""

    start: float
    task: str
    model: str
    stream: bool
    end: float = 0.0
    outcome: Outcome = "cut"
    status: int | None = None
    backend: str | None = None
    routed_task: str | None = None
    route: str | None = None
    tokens: int = 0
    tokens_per_s: float | None = None
    ttft_s: float | None = None
    last_token_s: float | None = None
    draft_n: int = 0
    draft_n_accepted: int = 0
    error: str | None = None


@dataclass(frozen=True)
class RunSummary:
    """Totals of one run: aggregate tokens/s is every generated token over the run's wall time."""

    requests: int
    failures: int
    cut: int
    tokens: int
    wall_s: float
    aggregate_tps: float
    per_stream_tps: float | None
    ttft_p50_s: float | None
    acceptance: float | None
    backends: dict[str, int] = field(default_factory=dict)
    first_error: str | None = None


def write_samples(path: Path, samples: list[Sample]) -> None:
    """One JSON object per line."""
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(asdict(s)) + "\n" for s in samples))


def read_samples(path: Path) -> list[Sample]:
    """The samples write_samples wrote; none if the file is missing."""
    if not path.exists():
        return []
    return [Sample(**json.loads(line)) for line in path.read_text().splitlines() if line]


def stream_rate(sample: Sample) -> float | None:
    """Generation tokens/s of one stream: llama.cpp's own figure, else as the client saw it.

    A request cut at the end of a run carries no timings; its rate from first to last token
    received is the same quantity seen from the client, so busy cells still get a figure.
    """
    if sample.tokens_per_s is not None:
        return sample.tokens_per_s
    if sample.ttft_s is None or sample.last_token_s is None or sample.tokens < 4:
        return None
    span = sample.last_token_s - sample.ttft_s
    return (sample.tokens - 1) / span if span > 0 else None


def summarise(samples: list[Sample]) -> RunSummary:
    """Add up a run; cut requests count for tokens and wall time, not as requests."""
    finished = [s for s in samples if s.outcome != "cut"]
    ok = [s for s in finished if s.outcome == "ok"]
    # Streamed tokens of cut requests were generated inside the run, so they count.
    tokens = sum(s.tokens for s in samples if s.outcome != "failed")
    wall = max((s.end for s in samples), default=0.0) - min((s.start for s in samples), default=0.0)
    speeds = [v for s in samples if s.outcome != "failed" and (v := stream_rate(s)) is not None]
    ttfts = [s.ttft_s for s in ok if s.ttft_s is not None]
    drafted = sum(s.draft_n for s in ok)
    return RunSummary(
        requests=len(finished),
        failures=len(finished) - len(ok),
        cut=len(samples) - len(finished),
        tokens=tokens,
        wall_s=wall,
        aggregate_tps=tokens / wall if wall > 0 else 0.0,
        per_stream_tps=statistics.fmean(speeds) if speeds else None,
        ttft_p50_s=statistics.median(ttfts) if ttfts else None,
        acceptance=sum(s.draft_n_accepted for s in ok) / drafted if drafted else None,
        backends=dict(Counter(s.backend for s in samples if s.backend).most_common()),
        first_error=next((s.error for s in finished if s.error), None),
    )
