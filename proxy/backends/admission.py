"""Admission: a request's seat on one of a backend's servers, with KV room and the device's share.

Supervised and external backends admit alike: a bounded queue, a server with a free seat and,
where its slots share one KV cache, room for the request's tokens beside those in flight, then
the device. A request that finds no such server waits on a condition that every hold's end
and every change of the servers signals, in arrival order.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections import deque
from collections.abc import AsyncIterator, Callable, Sequence

from proxy.backends.devices import Device
from proxy.backends.engine import BackendSaturatedError, Placement, Settled, SlotUse


class Seats:
    """One server's seats for this proxy's requests, and the KV tokens its requests hold."""

    def __init__(self, url: str, device: Device, limit: int, kv_shared: bool = False) -> None:
        self.url = url
        self.device = device
        self.limit = limit
        # Whether its slots share one KV cache (kv_unified): requests must fit in it together,
        # or llama-server fails one mid-prompt.
        self.kv_shared = kv_shared
        # Tokens one request may hold, as the server reports it (None: not yet known).
        self.n_ctx: int | None = None
        self.in_flight = 0  # requests admitted and decoding
        self.in_background = 0  # of those, the proxy's own (calibration)
        self.seated = 0  # requests holding a seat, those waiting for the device included
        self.held_tokens = 0  # KV tokens the seated requests hold
        self.last_used = 0.0

    @property
    def ready(self) -> bool:
        """Whether requests may go to this server; always, unless a subclass knows better."""
        return True

    @property
    def load(self) -> int:
        """Users' requests decoding on it (a replica adds what other proxies sent)."""
        return self.in_flight - self.in_background

    @property
    def context_free(self) -> int | None:
        """Tokens a new request may hold now; None before the server said its context."""
        if self.n_ctx is None:
            return None
        return self.n_ctx - self.held_tokens if self.kv_shared else self.n_ctx

    def has_seat(self, tokens: int) -> bool:
        """Whether a request of `tokens` KV tokens may take a seat now (an empty server always
        has room for what fits its context at all)."""
        if not self.ready or self.seated >= self.limit:
            return False
        free = self.context_free
        return free is None or free >= min(tokens, self.n_ctx or tokens)


# Called when a hold ends: give the device back, now or once the server stops computing a
# request llama-server did not finish (`abandoned`).
ReleaseDevice = Callable[[Seats, bool], None]


class AdmissionQueue:
    """One engine's admission over its servers: queue, seat and room, device."""

    def __init__(
        self,
        backend: str,
        max_queue: int,
        servers: Callable[[], Sequence[Seats]],
        release_device: ReleaseDevice | None = None,
    ) -> None:
        self.backend = backend
        self.max_queue = max_queue
        self.queued = 0
        self._servers = servers
        self._release_device = release_device
        self._waiters: deque[asyncio.Future[None]] = deque()

    def free_server(self, tokens: int = 0, prefer: str | None = None) -> Seats | None:
        """The server a request of `tokens` would take now: `prefer` (the one holding its
        prompt) when it has a seat, else the least loaded with one; None when none has."""
        free = [s for s in self._servers() if s.has_seat(tokens)]
        for s in free:
            if s.url == prefer:
                return s
        return min(free, key=lambda s: (s.load, s.in_flight, s.last_used), default=None)

    def would_wait(self) -> bool:
        """Whether a new request would wait: for a seat, or for its server's device."""
        free = self.free_server()
        return free is None or not free.device.admits(self.backend)

    @property
    def queue_full(self) -> bool:
        """Whether a new request would be refused: it would wait and the queue is full."""
        return self.would_wait() and self.queued >= self.max_queue

    def changed(self) -> None:
        """Servers or seats changed: every waiter looks again, in arrival order."""
        while self._waiters:
            future = self._waiters.popleft()
            if not future.done():
                future.set_result(None)

    async def _change(self) -> None:
        future = asyncio.get_running_loop().create_future()
        self._waiters.append(future)
        try:
            await future
        finally:
            with contextlib.suppress(ValueError):
                self._waiters.remove(future)

    @contextlib.asynccontextmanager
    async def hold(
        self,
        saturated: str,
        tokens: int = 0,
        prefer: Placement | None = None,
        settled: Settled | None = None,
        background: bool = False,
    ) -> AsyncIterator[tuple[Seats, SlotUse]]:
        """Hold a seat with room for `tokens` and the device's share for one request, waiting
        in the bounded queue; raise BackendSaturatedError(`saturated`) when the queue is full.

        With a seat free and the device admitting, nothing suspends between the caller's
        choice and the admission. A hold that `settled` says llama-server did not finish gives
        the device back through `release_device`, which may wait for the server to go idle.
        """
        if self.queue_full:
            raise BackendSaturatedError(saturated)
        url = prefer.url if prefer is not None else None
        self.queued += 1
        try:
            server = self.free_server(tokens, url)
            while server is None:
                await self._change()
                server = self.free_server(tokens, url)
            server.seated += 1
            server.held_tokens += tokens
            server.last_used = time.monotonic()
            try:
                waited = await server.device.admit(self.backend)
            except BaseException:
                self._unseat(server, tokens)
                raise
        finally:
            self.queued -= 1
        server.in_flight += 1
        server.in_background += background
        use = SlotUse(device_wait_s=waited, base_url=server.url, device=server.device.name)
        mark = server.device.start_decoding()
        # Ended before llama-server finished it (client gone, timeout, error): the server may
        # still be computing it.
        abandoned = True
        try:
            with server.device.background(self.backend) if background else contextlib.nullcontext():
                yield server, use
            abandoned = settled is not None and not settled()
        finally:
            use.mean_load = server.device.stop_decoding(mark)
            server.in_background -= background
            server.in_flight -= 1
            if self._release_device is not None:
                self._release_device(server, abandoned)
            else:
                server.device.release(self.backend)
            self._unseat(server, tokens)

    def _unseat(self, server: Seats, tokens: int) -> None:
        server.seated -= 1
        server.held_tokens -= tokens
        self.changed()


class Queued:
    """An engine's admission: its hold on a seat for one request, and what its queue tells."""

    name: str
    limit: int
    _admission: AdmissionQueue

    def _servers_said(self) -> str:
        """How its servers stand, for the error of a request refused on a full queue."""
        return ""

    @contextlib.asynccontextmanager
    async def slot(
        self,
        tokens: int = 0,
        prefer: Placement | None = None,
        settled: Settled | None = None,
        background: bool = False,
    ) -> AsyncIterator[SlotUse]:
        """Hold a seat with room for `tokens` KV tokens on a server (`prefer`'s, holding the
        request's prompt, when it has room; else the least loaded) and its share of the device,
        waiting in the bounded queue; raise BackendSaturatedError when the queue is full.

        With a seat free, nothing suspends between the caller's choice and the admission. A
        hold left by an exception, or one that `settled` says llama-server did not finish,
        gives the device back as the engine's release says (once its server is idle).
        """
        saturated = (
            f"backend {self.name!r} is at its limit of {self.limit} concurrent requests"
            f"{self._servers_said()} with {self.queued} queued"
        )
        async with self._admission.hold(saturated, tokens, prefer, settled, background) as (
            _,
            use,
        ):
            yield use

    @property
    def queued(self) -> int:
        """Requests waiting for a seat or the device."""
        return self._admission.queued

    @property
    def max_queue(self) -> int:
        """Requests that may wait before a new one is refused."""
        return self._admission.max_queue

    @property
    def queue_full(self) -> bool:
        """Whether a new request would be refused: it would wait and the queue is full."""
        return self._admission.queue_full
