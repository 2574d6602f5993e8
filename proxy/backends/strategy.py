"""Strategy: a backend served by an engine's llama-server that it shares with other backends."""

from __future__ import annotations

from collections.abc import AsyncIterator, Sequence
from contextlib import asynccontextmanager
from typing import Any

from proxy.backends.backend import Placement, ReplicaView, Settled, SlotUse, common_health
from proxy.backends.devices import Device
from proxy.backends.launch import LaunchSpec
from proxy.backends.supervisor import BackendSupervisor


class Strategy:
    """One way to decode (plain, n-gram, a draft model) on a shared engine: its own name, kind
    and requests, the engine's process, slots, device and prompt cache.

    The engine's supervisor owns the process and admission; a strategy counts only the requests
    it sent, so the load on a device still sums to what its processes hold.
    """

    def __init__(self, spec: LaunchSpec, engine: BackendSupervisor) -> None:
        self.spec = spec
        self.name = spec.config.name
        self._engine = engine
        self.in_flight = 0
        self.in_background = 0  # of those, the proxy's own (calibration)

    @property
    def speculation(self) -> dict[str, Any]:
        """Its speculators alone, at its draft length; none at all for plain decoding."""
        speculators = self.spec.config.speculators
        if not speculators:
            return {"speculative.n_max": 0}
        fields: dict[str, Any] = {"speculative.types": speculators}
        if self.spec.draft_path is not None:
            fields["speculative.n_max"] = self.spec.config.n_max
        return fields

    @property
    def engine(self) -> str:
        """The process it runs in: where its prompts are cached and its device admits it."""
        return self._engine.name

    @property
    def spec_type(self) -> str | None:
        """The speculation its requests use (None for plain decoding)."""
        return self.spec.config.spec_type

    @property
    def draft_n_max(self) -> int:
        """Tokens drafted per step."""
        return self.spec.config.n_max

    @property
    def load(self) -> int:
        """Users' requests it sent that the engine holds."""
        return self.in_flight - self.in_background

    @property
    def limit(self) -> int:
        return self._engine.limit

    @property
    def max_queue(self) -> int:
        return self._engine.max_queue

    @property
    def queued(self) -> int:
        return self._engine.queued

    @property
    def restarts(self) -> int:
        return self._engine.restarts

    @property
    def state(self) -> str:
        return self._engine.state

    @property
    def ready(self) -> bool:
        return self._engine.ready

    @property
    def saturated(self) -> bool:
        return self._engine.saturated

    @property
    def queue_full(self) -> bool:
        return self._engine.queue_full

    @property
    def failed_health_checks(self) -> int:
        return self._engine.failed_health_checks

    @property
    def device(self) -> Device:
        return self._engine.device

    @property
    def n_ctx(self) -> int | None:
        return self._engine.n_ctx

    @property
    def context_free(self) -> int | None:
        return self._engine.context_free

    @property
    def base_url(self) -> str:
        return self._engine.base_url

    @property
    def server_urls(self) -> frozenset[str]:
        return self._engine.server_urls

    @property
    def pid(self) -> int | None:
        return self._engine.pid

    @property
    def replicas(self) -> Sequence[ReplicaView]:
        return self._engine.replicas

    @property
    def restartable(self) -> bool:
        return self._engine.restartable

    @asynccontextmanager
    async def slot(
        self,
        tokens: int = 0,
        prefer: Placement | None = None,
        settled: Settled | None = None,
        background: bool = False,
    ) -> AsyncIterator[SlotUse]:
        """The engine's admission, counted as this strategy's request while held."""
        async with self._engine.slot(tokens, prefer, settled, background) as use:
            self.in_flight += 1
            self.in_background += background
            try:
                yield use
            finally:
                self.in_flight -= 1
                self.in_background -= background

    def mark_down(self, base_url: str | None = None) -> None:
        self._engine.mark_down(base_url)

    def scrape_targets(self) -> list[tuple[str, dict[str, str]]]:
        """None: the engine's counters mix its strategies; /metrics reads them per engine."""
        return []

    def health_view(self) -> dict[str, Any]:
        """Its part of GET /health, naming the engine whose process serves it."""
        return {**common_health(self), "engine": self._engine.name}

    def start(self) -> None:
        """Nothing: the pool starts the engine."""

    async def wait_ready(self, timeout: float | None = None) -> bool:
        return await self._engine.wait_ready(timeout)

    async def stop(self) -> None:
        """Nothing: the pool stops the engine."""

    async def restart(self, timeout: float | None = None) -> bool:
        return await self._engine.restart(timeout)
