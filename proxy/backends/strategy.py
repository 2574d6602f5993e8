"""Strategy: one way to decode (plain, n-gram, a draft model), routed onto an engine."""

from __future__ import annotations

from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

from proxy.backends.engine import Engine, Placement, Settled, SlotUse
from proxy.backends.launch import LaunchSpec


class Strategy:
    """A routed backend: its name, kind and speculation, the requests it sent, and the engine
    whose process, slots, device and prompt cache serve it.

    An engine may serve several strategies (`shares`): each request then carries its strategy's
    speculation fields, and a strategy counts only the requests it sent, so the load on a
    device still sums to what its processes hold. An engine serving one strategy runs its
    speculation for every request, and its load (other proxies' requests on a replica
    included) is the strategy's.
    """

    def __init__(self, spec: LaunchSpec, engine: Engine, shares: bool = False) -> None:
        self.spec = spec
        self.name = spec.config.name
        self.engine = engine
        self.shares = shares
        self.in_flight = 0
        self.in_background = 0  # of those, the proxy's own (calibration)

    @property
    def spec_type(self) -> str | None:
        """The speculation its requests use (None for plain decoding)."""
        return self.spec.config.spec_type

    @property
    def draft_n_max(self) -> int:
        """Tokens drafted per step (llama-server's default is 3)."""
        return self.spec.config.n_max

    @property
    def speculation(self) -> dict[str, Any]:
        """The fields each request carries to choose its speculation on a shared engine: its
        speculators alone, at its draft length; none for plain decoding. On an engine of its
        own, which runs its speculation for every request, only a speculator that drafts for
        requests naming it alone (copy-json) is named."""
        speculators = self.spec.config.speculators
        if not self.shares:
            return (
                {"speculative.types": speculators} if self.spec.config.names_its_speculators else {}
            )
        if not speculators:
            return {"speculative.n_max": 0}
        fields: dict[str, Any] = {"speculative.types": speculators}
        if self.spec.draft_path is not None:
            fields["speculative.n_max"] = self.spec.config.n_max
        return fields

    @property
    def draft_cap(self) -> int:
        """The longest draft its process makes (0 for plain decoding)."""
        return self.spec.config.draft_cap

    @property
    def tunes_draft_length(self) -> bool:
        """Whether the router may choose its requests' draft length: it speculates, on our
        build, which takes a shorter draft per request."""
        return self.spec.our_build and self.draft_cap > 0

    def speculation_at(self, n_max: int | None) -> dict[str, Any]:
        """Its speculation fields, drafting at most n_max tokens a step where one is given."""
        if n_max is None:
            return self.speculation
        return {**self.speculation, "speculative.n_max": n_max}

    @property
    def load(self) -> int:
        """Users' requests where its next request would go: on a shared engine those it sent."""
        if self.shares:
            return self.in_flight - self.in_background
        return self.engine.load

    @asynccontextmanager
    async def slot(
        self,
        tokens: int = 0,
        prefer: Placement | None = None,
        settled: Settled | None = None,
        background: bool = False,
    ) -> AsyncIterator[SlotUse]:
        """The engine's admission, counted as this strategy's request while held."""
        async with self.engine.slot(tokens, prefer, settled, background) as use:
            self.in_flight += 1
            self.in_background += background
            try:
                yield use
            finally:
                self.in_flight -= 1
                self.in_background -= background

    def health_view(self) -> dict[str, Any]:
        """Its part of GET /health: its engine's, with its own kind, speculation and requests."""
        return {
            **self.engine.health_view(),
            "kind": self.spec.config.kind,
            "spec_type": self.spec_type,
            "in_flight": self.in_flight,
            "load": self.load,
        }
