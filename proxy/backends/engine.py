"""Engine: a llama-server process or a set of its replicas, as routing and metrics see it."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from contextlib import AbstractAsyncContextManager
from dataclasses import dataclass
from typing import Any, Literal, Protocol

from proxy.backends.devices import Device
from proxy.backends.launch import LaunchSpec

BackendState = Literal["starting", "ready", "unhealthy", "restarting", "stopped"]


class BackendSaturatedError(Exception):
    """All of a backend's slots are busy and its queue is full."""


@dataclass(frozen=True)
class Placement:
    """Where a prompt was processed: the server (an external backend's replica).

    Never a llama-server slot: with slots sharing one KV cache, llama-server saves an idle
    slot's prompt to its RAM cache and clears the slot whenever another request starts, and
    finds it again by prefix only for a request that names no slot (docs/routing.md).
    """

    url: str


@dataclass
class SlotUse:
    """One request's hold on a backend, as the backend admitted it; the backend writes it."""

    device_wait_s: float = 0.0
    # Where the request goes: the server (a replica of an external backend) and its device.
    base_url: str = ""
    device: str = ""
    # How many requests decoded on the device at once, on average, while this one held its
    # slot (itself included); set when the hold ends. None for a request that held none.
    mean_load: float | None = None


# Asked when a hold ends without an exception: whether llama-server finished the request (an
# answer relayed to its end). One it did not finish may still be computing on the device.
Settled = Callable[[], bool]


class ReplicaView(Protocol):
    """One server of a backend, as /health and /metrics show it."""

    @property
    def url(self) -> str: ...

    @property
    def state(self) -> str: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def reported(self) -> int | None: ...

    @property
    def failed_health_checks(self) -> int: ...

    @property
    def device(self) -> Device: ...

    @property
    def ready(self) -> bool: ...

    @property
    def load(self) -> int: ...


class DeviceView(Protocol):
    """What routing needs to know about the device a backend decodes on."""

    def admits(self, backend: str) -> bool: ...

    def admits_past_background(self, backend: str) -> bool:
        """Whether it would start now but for the proxy's own background requests."""
        ...

    def next_up(self) -> str | None: ...

    def engine_of(self, backend: str) -> str: ...


class EngineView(Protocol):
    """What the routing policy needs to know about the engine a strategy runs on."""

    @property
    def name(self) -> str:
        """The process (or set of replicas) by name: where the prompts it processed are cached."""
        ...

    @property
    def device(self) -> DeviceView: ...

    @property
    def ready(self) -> bool: ...

    @property
    def saturated(self) -> bool: ...

    @property
    def queue_full(self) -> bool: ...


class RoutableBackend(Protocol):
    """What the routing policy needs to know about a strategy."""

    name: str

    @property
    def engine(self) -> EngineView: ...

    @property
    def load(self) -> int:
        """Users' requests in flight where its next request would go, other proxies' included."""
        ...

    @property
    def spec_type(self) -> str | None: ...

    @property
    def draft_n_max(self) -> int: ...


class Engine(Protocol):
    """A llama-server process, or a set of replicas of one, serving one or more strategies."""

    spec: LaunchSpec

    # --- what it is and where ---------------------------------------------------------------
    @property
    def name(self) -> str: ...

    @property
    def device(self) -> Device: ...

    @property
    def base_url(self) -> str: ...

    @property
    def server_urls(self) -> frozenset[str]: ...

    @property
    def replicas(self) -> Sequence[ReplicaView]:
        """The servers it balances over; empty for an engine that is one process."""
        ...

    @property
    def pid(self) -> int | None: ...

    @property
    def n_ctx(self) -> int | None: ...

    @property
    def context_free(self) -> int | None: ...

    # --- health -----------------------------------------------------------------------------
    @property
    def state(self) -> str: ...

    @property
    def ready(self) -> bool: ...

    @property
    def restarts(self) -> int: ...

    @property
    def failed_health_checks(self) -> int: ...

    def mark_down(self, base_url: str | None = None) -> None: ...

    def health_view(self) -> dict[str, Any]:
        """Its part of GET /health."""
        ...

    # --- admission --------------------------------------------------------------------------
    @property
    def limit(self) -> int: ...

    @property
    def max_queue(self) -> int: ...

    @property
    def queued(self) -> int: ...

    @property
    def in_flight(self) -> int: ...

    @property
    def load(self) -> int:
        """Users' requests where its next request would go, other proxies' included."""
        ...

    @property
    def saturated(self) -> bool: ...

    @property
    def queue_full(self) -> bool: ...

    def slot(
        self,
        tokens: int = 0,
        prefer: Placement | None = None,
        settled: Settled | None = None,
        background: bool = False,
    ) -> AbstractAsyncContextManager[SlotUse]:
        """Its device's share and a concurrency slot, held for one request; `background` for
        the proxy's own requests (calibration), which routing looks past."""
        ...

    # --- metrics ----------------------------------------------------------------------------
    def scrape_targets(self) -> list[tuple[str, dict[str, str]]]:
        """Where its llama-server metrics are read, with the labels each server adds."""
        ...

    # --- lifecycle --------------------------------------------------------------------------
    @property
    def restartable(self) -> bool:
        """Whether the proxy can give it a fresh process (it runs one)."""
        ...

    def start(self) -> None: ...

    async def wait_ready(self, timeout: float | None = None) -> bool: ...

    async def stop(self) -> None: ...

    async def restart(self, timeout: float | None = None) -> bool: ...


async def wait_for(event: asyncio.Event, timeout: float | None) -> bool:
    """Wait until the event is set; False if timeout passes first."""
    try:
        await asyncio.wait_for(event.wait(), timeout)
    except TimeoutError:
        return False
    return True


def engine_health(e: Engine) -> dict[str, Any]:
    """What /health shows of every engine, whatever runs it."""
    return {
        "state": e.state,
        "url": e.base_url,
        "pid": e.pid,
        "restarts": e.restarts,
        "in_flight": e.in_flight,
        "load": e.load,
        "queued": e.queued,
        "limit": e.limit,
        "device": e.device.name,
        # The process that serves it: strategies sharing an engine name the same one.
        "engine": e.name,
        # Tokens one request may hold (prompt and answer), as llama-server reports it.
        "n_ctx": e.n_ctx,
    }
