"""ReplicatedEngine: llama-servers run elsewhere (`url`, `urls`), as replicas of one engine.

Every replica serves the same configuration. Each is health-checked on its own and asked how many
requests it holds (its `/metrics`, else `/slots`), so requests that other proxies send it count in
this proxy's load levels: N proxies in front of the same servers route as one would. A request
goes to the ready replica with the fewest requests; a failing replica is taken out of routing
while the others serve, and comes back when its health check passes again. Host names in `urls`
are resolved again periodically, so a Kubernetes headless Service's pods come and go.
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Callable
from typing import Any, Literal

import aiohttp

from proxy.backends.admission import AdmissionQueue, Queued, Seats
from proxy.backends.devices import Device
from proxy.backends.discovery import Resolver, discover, names_a_host
from proxy.backends.engine import (
    BackendState,
    engine_health,
    wait_for,
)
from proxy.backends.launch import LaunchSpec
from proxy.backends.supervisor import read_slot_context
from proxy.config import Supervision
from proxy.llamacpp import requests_held, slots_processing
from proxy.log import get_logger

ReplicaState = Literal["starting", "ready", "unhealthy", "gone"]
LoadSource = Literal["metrics", "slots", "none"]
_UNHEALTHY_AFTER = 3
_STARTING_POLL_S = 0.25
_PROBE_TIMEOUT_S = 2.0
# llama-server answers /metrics and /slots between two batch steps, which on a CPU can take
# seconds (a long prompt): the poll waits that long rather than drop a busy server's report.
_LOAD_TIMEOUT_S = 10.0
log = get_logger("backend")


class Replica(Seats):
    """One server of an external backend: its address, health and the requests on it."""

    def __init__(self, url: str, origin: str, device: Device, limit: int) -> None:
        # How another server shares its KV cache is unknown: no room is reserved there.
        super().__init__(url, device, limit, kv_shared=False)
        self.origin = origin  # the configured URL it was found from
        self.state: ReplicaState = "starting"
        self.reported: int | None = None  # requests it said it held at the last poll
        self.load_source: LoadSource | None = None
        self.failed_health_checks = 0
        self.others = 0  # requests other proxies have on it, from its latest report

    @property
    def ready(self) -> bool:
        """Whether new requests may go to this replica."""
        return self.state == "ready"

    @property
    def load(self) -> int:
        """Requests on it now: this proxy's own count, plus the others' from its last report."""
        return self.in_flight - self.in_background + self.others

    def report(self, held: int | None, own: int = 0) -> None:
        """Fold in a report of `held` requests, `own` of which may be this proxy's (None: forget
        the last report, as when the replica comes back)."""
        self.reported = held
        self.others = 0 if held is None else max(0, held - own)


class ReplicatedEngine(Queued):
    """One backend served by llama-servers the proxy does not run: balanced, checked, measured."""

    def __init__(
        self,
        spec: LaunchSpec,
        settings: Supervision,
        session: aiohttp.ClientSession,
        device_for: Callable[[str], Device],
        resolver: Resolver,
    ) -> None:
        self.spec = spec
        self.name = spec.config.name
        self.settings = settings
        self.session = session
        self.limit = spec.config.max_concurrency or spec.config.parallel  # per replica
        self.restarts = 0
        self.pid: int | None = None
        self.replicas: list[Replica] = []
        self.resolve_errors: dict[str, str] = {}
        self._device_for = device_for
        self._resolver = resolver
        self._failed_gone = 0  # health checks failed by replicas no longer listed
        self._was_ready = False
        self._stopped = False
        self._ready = asyncio.Event()
        self._admission = AdmissionQueue(
            self.name, settings.max_queue, self._ready_replicas, self._done
        )
        self._watchers: dict[Replica, asyncio.Task[None]] = {}
        self._task: asyncio.Task[None] | None = None
        # What the policy sees before any replica is found: a device nobody else uses.
        self._nowhere = Device(f"url:{self.name}", 1)
        self._nowhere.add(self.name, 1)

    # --- what routing, /health and /metrics read -------------------------------------------

    @property
    def restartable(self) -> bool:
        """False: its servers run elsewhere."""
        return False

    def scrape_targets(self) -> list[tuple[str, dict[str, str]]]:
        """Each ready replica's /metrics, labelled with the replica."""
        return [(r.url, {"replica": r.url}) for r in self.replicas if r.ready]

    def health_view(self) -> dict[str, Any]:
        """Its part of GET /health, with its replicas."""
        shown = engine_health(self)
        shown["replicas"] = [
            {
                "url": r.url,
                "state": r.state,
                "in_flight": r.in_flight,
                "reported": r.reported,
                "load": r.load,
                "load_source": r.load_source,
                "failed_health_checks": r.failed_health_checks,
                "device": r.device.name,
            }
            for r in self.replicas
        ]
        if self.resolve_errors:
            shown["resolve_errors"] = self.resolve_errors
        return shown

    @property
    def state(self) -> BackendState:
        """ready while any replica serves; unhealthy once none does; starting before."""
        if self._stopped:
            return "stopped"
        if any(r.ready for r in self.replicas):
            return "ready"
        return "unhealthy" if self._was_ready else "starting"

    @property
    def ready(self) -> bool:
        """Whether requests may be sent to this backend now."""
        return self.state == "ready"

    @property
    def n_ctx(self) -> int | None:
        """Tokens one request may hold on any ready replica (the smallest); None if unknown."""
        known = [r.n_ctx for r in self.replicas if r.ready and r.n_ctx is not None]
        return min(known) if known else None

    @property
    def in_flight(self) -> int:
        """This proxy's requests on every replica."""
        return sum(r.in_flight for r in self.replicas)

    @property
    def failed_health_checks(self) -> int:
        """Health checks failed by its replicas, those no longer listed included."""
        return self._failed_gone + sum(r.failed_health_checks for r in self.replicas)

    @property
    def server_urls(self) -> frozenset[str]:
        """The replicas' URLs: where a prompt this backend processed may be held."""
        return frozenset(r.url for r in self.replicas)

    @property
    def base_url(self) -> str:
        """The replica the next request would go to (the first configured URL before any)."""
        nxt = self._next_replica()
        return nxt.url if nxt else self.spec.config.replica_urls[0]

    @property
    def load(self) -> int:
        """Requests on the replica the next request would go to, other proxies' included."""
        nxt = self._next_replica()
        return nxt.load if nxt else 0

    @property
    def device(self) -> Device:
        """The device of the replica the next request would go to."""
        nxt = self._next_replica()
        return nxt.device if nxt else self._nowhere

    @property
    def saturated(self) -> bool:
        """Whether every ready replica holds its limit, counting other proxies' requests."""
        return all(r.load >= self.limit for r in self.replicas if r.ready)

    def _ready_replicas(self) -> list[Replica]:
        return [r for r in self.replicas if r.ready]

    def _next_replica(self) -> Replica | None:
        ready = self._ready_replicas()
        free = self._admission.free_server()
        if isinstance(free, Replica):
            return free
        return min(ready, key=lambda r: (r.load, r.in_flight, r.last_used), default=None)

    # --- requests --------------------------------------------------------------------------

    @property
    def context_free(self) -> int | None:
        """Tokens a new request may hold: n_ctx (how another server shares its KV is unknown)."""
        return self.n_ctx

    def _servers_said(self) -> str:
        """How many replicas serve, for the error of a request refused on a full queue."""
        return f" on each of {sum(r.ready for r in self.replicas)} ready replicas"

    def _done(self, server: Seats, abandoned: bool) -> None:
        """A request left a replica: another proxy's llama-server, nothing to learn from
        waiting for it to go idle; a retired replica leaves with its last request."""
        server.device.release(self.name)
        if isinstance(server, Replica) and server.state == "gone" and server.seated <= 1:
            self._forget(server)

    def mark_down(self, base_url: str | None = None) -> None:
        """Take the replica a request just failed on out of routing (its health check decides
        when it comes back); the backend serves on while another replica is ready."""
        for replica in self.replicas:
            if replica.url == base_url and replica.ready:
                self._set_state(replica, "unhealthy")

    # --- lifetime --------------------------------------------------------------------------

    def start(self) -> None:
        """Find the replicas and begin checking them in the background."""
        self._task = asyncio.create_task(self._run(), name=f"replicas-{self.name}")

    async def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until a replica is ready; False if timeout passes first."""
        return await wait_for(self._ready, timeout)

    async def restart(self, timeout: float | None = None) -> bool:
        """Never: the servers are not the proxy's (`restartable` is False)."""
        raise RuntimeError(f"backend {self.name!r} is an external server; restart it where it runs")

    async def stop(self) -> None:
        """Stop checking replicas (they are not the proxy's to stop)."""
        self._stopped = True
        tasks = [t for t in (self._task, *self._watchers.values()) if t is not None]
        for task in tasks:
            task.cancel()
        for task in tasks:
            with contextlib.suppress(asyncio.CancelledError):
                await task
        self._ready.clear()

    async def _run(self) -> None:
        urls = self.spec.config.replica_urls
        while True:
            await self.refresh()
            if not any(names_a_host(u) for u in urls):
                return  # fixed addresses: nothing to resolve again
            await asyncio.sleep(self.settings.resolve_interval_s)

    async def refresh(self) -> None:
        """Resolve the configured URLs again: add new replicas, retire those no longer listed.

        A name that fails to resolve keeps the replicas it had: a DNS hiccup is not an outage.
        """
        found = await discover(self.spec.config.replica_urls, self._resolver)
        wanted: dict[str, str] = {}  # replica URL -> configured URL
        for origin, urls in found.items():
            if isinstance(urls, str):
                if self.resolve_errors.get(origin) != urls:
                    log.warning("replica discovery failed", backend=self.name, error=urls)
                self.resolve_errors[origin] = urls
                wanted |= {r.url: origin for r in self.replicas if r.origin == origin}
                continue
            self.resolve_errors.pop(origin, None)
            wanted |= dict.fromkeys(urls, origin)
        have = {r.url: r for r in self.replicas if r.state != "gone"}
        for url, origin in wanted.items():
            if url not in have:
                self._add(url, origin)
        for url, replica in have.items():
            if url not in wanted:
                self._retire(replica)

    def _add(self, url: str, origin: str) -> None:
        cfg = self.spec.config
        device = self._device_for(cfg.device or f"url:{url}")
        replica = Replica(url, origin, device, self.limit)
        self.replicas.append(replica)
        self._watchers[replica] = asyncio.create_task(
            self._watch(replica), name=f"replica-{self.name}-{url}"
        )
        log.info("replica found", backend=self.name, replica=url)

    def _retire(self, replica: Replica) -> None:
        """No longer listed: no new requests; it leaves once its requests finish."""
        task = self._watchers.pop(replica, None)
        if task is not None:
            task.cancel()
        self._set_state(replica, "gone")
        if replica.seated == 0:
            self._forget(replica)

    def _forget(self, replica: Replica) -> None:
        if replica in self.replicas:
            self.replicas.remove(replica)
            self._failed_gone += replica.failed_health_checks

    def _set_state(self, replica: Replica, state: ReplicaState) -> None:
        if state == replica.state:
            return
        log.info(
            "replica state",
            backend=self.name,
            replica=replica.url,
            state=state,
            previous=replica.state,
        )
        was = self.state
        if state == "ready":
            replica.report(None)  # what it held before it was out says nothing now
        replica.state = state
        if self.ready:
            self._was_ready = True
            self._ready.set()
        else:
            self._ready.clear()
        if self.state != was:
            log.info("backend state", backend=self.name, state=self.state, previous=was)
        self._admission.changed()

    # --- checks ----------------------------------------------------------------------------

    async def _watch(self, replica: Replica) -> None:
        """Health-check the replica and read the requests it holds, until it is retired."""
        failures = 0
        next_health = 0.0
        while True:
            if time.monotonic() >= next_health:
                if await self._healthy(replica):
                    failures = 0
                    if replica.state != "ready":
                        # A replica that comes back may have been restarted with another -c.
                        replica.n_ctx = await read_slot_context(self.session, replica.url)
                    self._set_state(replica, "ready")
                elif replica.state != "starting":
                    failures += 1
                    replica.failed_health_checks += 1
                    if failures >= _UNHEALTHY_AFTER:
                        self._set_state(replica, "unhealthy")
                starting = replica.state == "starting"
                interval = _STARTING_POLL_S if starting else self.settings.health_interval_s
                next_health = time.monotonic() + interval
            if replica.ready:
                await self._read_load(replica)
            pause = min(self.settings.load_interval_s, next_health - time.monotonic())
            await asyncio.sleep(max(pause, 0.0))

    async def _healthy(self, replica: Replica) -> bool:
        try:
            async with self.session.get(
                f"{replica.url}/health", timeout=aiohttp.ClientTimeout(total=_PROBE_TIMEOUT_S)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def _read_load(self, replica: Replica) -> None:
        """Ask the replica how many requests it holds, every proxy's together."""
        own = replica.in_flight
        held = await self._held(replica)
        if held is None:
            return
        # A request of ours that started or ended during the poll may or may not be counted:
        # take the larger own count, so no request is counted twice.
        replica.report(held, max(own, replica.in_flight))

    async def _held(self, replica: Replica) -> int | None:
        """What the replica says it holds; None when it did not say (its last report stands)."""
        timeout = aiohttp.ClientTimeout(total=_LOAD_TIMEOUT_S)
        try:
            if replica.load_source in (None, "metrics"):
                async with self.session.get(f"{replica.url}/metrics", timeout=timeout) as resp:
                    if resp.status == 200:
                        replica.load_source = "metrics"
                        return requests_held(await resp.text())
                    if resp.status not in (404, 501):
                        return None
                # Started without --metrics (501): /slots, on by default, tells processing.
                replica.load_source = "slots"
            if replica.load_source == "slots":
                async with self.session.get(f"{replica.url}/slots", timeout=timeout) as resp:
                    if resp.status == 200:
                        return slots_processing(await resp.json())
                log.warning(
                    "replica reports no load (started with --no-slots and without --metrics); "
                    "other proxies' requests on it are not counted",
                    backend=self.name,
                    replica=replica.url,
                )
                replica.load_source = "none"
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return None
