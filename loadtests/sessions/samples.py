"""Agent turns as the load tests record them, and the prompt-cache share they add up to."""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

from loadtests.measure import Sample
from loadtests.sessions.client import TurnResult


@dataclass
class TurnSample(Sample):
    """A load-test Sample of one agent turn, with its session and prompt-cache counts."""

    session: str = ""
    turn: int = 0
    kind: str = ""
    prompt_n: int = 0
    cache_n: int = 0


def turn_sample(result: TurnResult, model: str, start: float, end: float) -> TurnSample:
    """A TurnResult as the load tests record their requests."""
    ok = result.ok
    return TurnSample(
        start=start,
        task=f"agent-{result.shape}",
        model=model,
        stream=True,
        end=end,
        outcome="ok" if ok else "failed",
        status=result.status,
        backend=result.backend,
        route=result.route,
        tokens=result.predicted_n,
        tokens_per_s=result.predicted_per_second,
        ttft_s=result.ttft_s,
        draft_n=result.draft_n,
        draft_n_accepted=result.draft_n_accepted,
        error=result.error,
        session=result.session,
        turn=result.turn,
        kind=result.kind,
        prompt_n=result.prompt_n,
        cache_n=result.cache_n,
    )


def read_turn_samples(path: Path) -> list[TurnSample]:
    """The samples an agent cell wrote; none if the file is missing."""
    if not path.exists():
        return []
    return [TurnSample(**json.loads(line)) for line in path.read_text().splitlines() if line]


def cached_share(samples: Iterable[TurnSample]) -> float | None:
    """Prompt tokens served from cache over all prompt tokens, for turns that have timings."""
    cached = prompt = 0
    for s in samples:
        cached += s.cache_n
        prompt += s.prompt_n + s.cache_n
    return cached / prompt if prompt else None
