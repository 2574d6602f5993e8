"""Device: admits requests so the threads decoding at once on one device never exceed its budget.

Two llama-server processes decoding at once on the same cores do not share them gracefully: on
2 cores, two `-t 2` processes ran at 0.5-0.8 tokens/s in one round of four against 37 for one
alone (docs/devices.md). So every request takes its backend's share of the device before it is sent:
a backend already decoding is joined (its requests batch in one process, which costs no more
threads), another starts only while the shares in use leave room for its own. Requests for a
backend that does not fit wait in arrival order; no later request passes one that waits, so a
busy backend cannot starve the others.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from collections import deque
from collections.abc import Iterator
from dataclasses import dataclass

from proxy.backend_config import BackendConfig
from proxy.config import Settings
from proxy.log import get_logger

log = get_logger("devices")


@dataclass(frozen=True)
class DeviceState:
    """What a device is doing, as /health and /metrics show it."""

    capacity: int
    in_use: int
    running: dict[str, int]
    waiting: int
    busy_s: float
    waits: int
    wait_s: float


@dataclass(frozen=True)
class LoadMark:
    """A point on a device's load clock: when, and the request-seconds decoded there by then."""

    at: float
    load_s: float


class Device:
    """One compute device shared by backends: admission, in arrival order, within its capacity."""

    def __init__(self, name: str, capacity: int) -> None:
        self.name = name
        self.capacity = capacity
        self._share: dict[str, int] = {}
        # Backends that share an engine's process decode as that engine.
        self._engine_of: dict[str, str] = {}
        self._running: dict[str, int] = {}
        # Of those, the proxy's own background requests (calibration) per engine: users are
        # routed as if these were not there, and wait at most for the ones already decoding.
        self._background: dict[str, int] = {}
        self._waiters: deque[tuple[str, asyncio.Future[None]]] = deque()
        self._busy_since: float | None = None
        self._busy_s = 0.0
        self.waits = 0
        self.wait_s = 0.0
        # The time integral of the requests decoding here: a request's mean load over its life
        # is what its measured speed belongs to, not the load it happened to start at.
        self._decoding = 0
        self._load_s = 0.0
        self._load_at = time.monotonic()

    def add(self, backend: str, share: int) -> None:
        """Register a backend that needs `share` of this device while it decodes."""
        self._share[backend] = max(1, min(share, self.capacity))

    def add_to_engine(self, backend: str, engine: str) -> None:
        """Register a backend served by `engine`'s process: it is admitted as the engine."""
        self._engine_of[backend] = engine

    def engine_of(self, backend: str) -> str:
        """The process a backend decodes in, by the name this device admits it under."""
        return self._engine_of.get(backend, backend)

    def serves(self, backend: str) -> bool:
        """Whether `backend` is registered on this device."""
        return self.engine_of(backend) in self._share

    def share(self, backend: str) -> int:
        """The part of the capacity this backend takes while it decodes."""
        return self._share[self.engine_of(backend)]

    @property
    def in_use(self) -> int:
        """Capacity taken by the backends decoding now."""
        return sum(self._share[b] for b in self._running)

    @property
    def waiting(self) -> int:
        """Requests waiting for this device."""
        return len(self._waiters)

    def next_up(self) -> str | None:
        """The backend the first request waiting here is for: what the device runs next."""
        for backend, admitted in self._waiters:
            if not admitted.done():
                return backend
        return None

    def admits(self, backend: str) -> bool:
        """Whether a request for `backend` would start now, without waiting for the device."""
        return not self._waiters and self._fits(self.engine_of(backend))

    def admits_past_background(self, backend: str) -> bool:
        """Whether a request for `backend` would start now but for the background requests
        decoding here: a user's request is routed by this, and waits only for those."""
        engine = self.engine_of(backend)
        if self._waiters:
            return False
        users = [e for e, n in self._running.items() if n > self._background.get(e, 0)]
        return engine in users or sum(self._share[e] for e in users) + self._share[engine] <= (
            self.capacity
        )

    @contextlib.contextmanager
    def background(self, backend: str) -> Iterator[None]:
        """Mark one admitted request for `backend` as the proxy's own background work."""
        engine = self.engine_of(backend)
        self._background[engine] = self._background.get(engine, 0) + 1
        try:
            yield
        finally:
            left = self._background[engine] - 1
            if left:
                self._background[engine] = left
            else:
                del self._background[engine]

    def _fits(self, backend: str) -> bool:
        return backend in self._running or self.in_use + self._share[backend] <= self.capacity

    def try_admit(self, backend: str) -> bool:
        """Admit a request for `backend` now if the device has room; never waits."""
        backend = self.engine_of(backend)
        if not self.admits(backend):
            return False
        self._start(backend)
        return True

    async def admit(self, backend: str) -> float:
        """Admit a request for `backend`, waiting in arrival order; the seconds it waited.

        The check and the admission happen without a suspension point between them, so two
        requests arriving together cannot both see room that only one of them has.
        """
        backend = self.engine_of(backend)
        if self.try_admit(backend):
            return 0.0
        admitted = asyncio.get_running_loop().create_future()
        entry = (backend, admitted)
        self._waiters.append(entry)
        start = time.monotonic()
        try:
            await admitted
        except asyncio.CancelledError:
            if admitted.done() and not admitted.cancelled():
                self.release(backend)  # admitted in the same instant the waiter left
            else:
                self._waiters.remove(entry)
                self._admit_waiters()  # it may have been the one holding others back
            raise
        waited = time.monotonic() - start
        self.waits += 1
        self.wait_s += waited
        return waited

    def release(self, backend: str) -> None:
        """One request for `backend` no longer decodes; admit whoever now fits."""
        backend = self.engine_of(backend)
        left = self._running[backend] - 1
        if left:
            self._running[backend] = left
        else:
            del self._running[backend]
        if not self._running and self._busy_since is not None:
            self._busy_s += time.monotonic() - self._busy_since
            self._busy_since = None
        self._admit_waiters()

    def _start(self, backend: str) -> None:
        if not self._running:
            self._busy_since = time.monotonic()
        self._running[backend] = self._running.get(backend, 0) + 1

    def _admit_waiters(self) -> None:
        while self._waiters and self._fits(self._waiters[0][0]):
            backend, admitted = self._waiters.popleft()
            if admitted.done():  # its waiter was cancelled and is about to remove itself
                continue
            self._start(backend)
            admitted.set_result(None)

    def _load_mark(self) -> LoadMark:
        now = time.monotonic()
        self._load_s += self._decoding * (now - self._load_at)
        self._load_at = now
        return LoadMark(now, self._load_s)

    def start_decoding(self) -> LoadMark:
        """Count one more request decoding here; the mark its mean load is measured from."""
        mark = self._load_mark()
        self._decoding += 1
        return mark

    def stop_decoding(self, mark: LoadMark) -> float:
        """Count one request fewer; the mean number decoding here, it included, since `mark`."""
        now = self._load_mark()
        self._decoding = max(0, self._decoding - 1)
        span = now.at - mark.at
        return max(1.0, (now.load_s - mark.load_s) / span) if span > 0 else 1.0

    def state(self) -> DeviceState:
        """A snapshot for /health and /metrics."""
        busy = self._busy_s
        if self._busy_since is not None:
            busy += time.monotonic() - self._busy_since
        return DeviceState(
            capacity=self.capacity,
            in_use=self.in_use,
            running=dict(self._running),
            waiting=self.waiting,
            busy_s=busy,
            waits=self.waits,
            wait_s=self.wait_s,
        )


def host_cores() -> int:
    """The cores this process may run on (its CPU affinity, not the machine's total)."""
    return len(os.sched_getaffinity(0))


def device_capacity(device: str, settings: Settings) -> int:
    """A device's budget: configured, else the cores for `cpu` and one process for anything else.

    On a GPU, llama-server processes time-slice the same SMs and memory bandwidth, and one
    process batching several streams beats two decoding side by side, so by default one
    process decodes at a time; raise `capacity` for a device measured to run more.
    """
    configured = settings.devices.get(device)
    if configured is not None:
        return configured.capacity
    return host_cores() if device == "cpu" else 1


def device_for(name: str, devices: dict[str, Device], backend: str, settings: Settings) -> Device:
    """The device `name` from the registry, made (with `backend`'s share) if it is new there."""
    device = devices.get(name)
    if device is None:
        device = devices[name] = Device(name, device_capacity(name, settings))
    if not device.serves(backend):
        device.add(backend, 1)
    return device


def backend_share(cfg: BackendConfig, device: str, capacity: int) -> int:
    """What one backend takes of its device: its threads on `cpu` (all cores when unset), else 1."""
    if device == "cpu":
        return cfg.threads or capacity
    return 1


def build_devices(settings: Settings) -> dict[str, Device]:
    """Every device the configured backends run on, with each backend's share registered."""
    devices: dict[str, Device] = {}
    for cfg in settings.backends:
        if cfg.urls is not None and cfg.device is None:
            continue  # each replica is a device of its own, added as it is found
        name = cfg.device_name
        if name not in devices:
            devices[name] = Device(name, device_capacity(name, settings))
        device = devices[name]
        share = backend_share(cfg, name, device.capacity)
        if share > device.capacity:
            log.warning(
                "backend has more threads than its device has cores; it oversubscribes them "
                "alone: lower `threads` or raise the device's capacity",
                backend=cfg.name,
                threads=share,
                device=name,
                capacity=device.capacity,
            )
        if cfg.engine is None:
            device.add(cfg.name, share)
        else:
            device.add(cfg.engine, share)
            device.add_to_engine(cfg.name, cfg.engine)
    return devices
