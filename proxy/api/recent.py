"""The last requests the proxy finished, as the status page lists them: never their text."""

from __future__ import annotations

import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from proxy.exchange import Exchange
from proxy.llamacpp import Timings

KEPT = 50


@dataclass(frozen=True)
class RecentRequest:
    """One finished request: where it went and why, how it ended, how fast it decoded."""

    at: float  # wall-clock time it finished
    endpoint: str
    model: str
    backend: str
    task: str
    route: str
    status: int
    # Prompt tokens, and how many of them llama-server found in its cache.
    prompt_tokens: int
    cached_tokens: int
    tokens: int
    tokens_per_s: float
    ttft_s: float | None
    duration_s: float
    # The longest draft the router chose for it; None where it drafted at its backend's own.
    draft_n_max: int | None = None


class RecentRequests:
    """A ring of the last KEPT requests, newest first."""

    def __init__(self, kept: int = KEPT) -> None:
        self._ring: deque[RecentRequest] = deque(maxlen=kept)
        self.total = 0

    def add(self, exchange: Exchange, now: float) -> None:
        """Keep what the page shows of a finished request (its body is never kept)."""
        route, upstream = exchange.route, exchange.measured
        timings = Timings.parse(upstream.timings if upstream is not None else None)
        self.total += 1
        self._ring.appendleft(
            RecentRequest(
                at=time.time(),
                endpoint=exchange.endpoint,
                model=exchange.requested_model or "",
                backend=route.backend.name if route is not None else "",
                task=exchange.task or "",
                route=route.reason if route is not None else "",
                status=exchange.status,
                prompt_tokens=timings.prompt_n + timings.cache_n,
                cached_tokens=timings.cache_n,
                tokens=timings.predicted_n,
                tokens_per_s=timings.tokens_per_s,
                ttft_s=upstream.ttft_s if upstream is not None else None,
                duration_s=now - exchange.started,
                draft_n_max=route.draft_n_max if route is not None else None,
            )
        )

    def __iter__(self) -> Iterator[RecentRequest]:
        return iter(self._ring)
