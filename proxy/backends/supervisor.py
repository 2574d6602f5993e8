"""SupervisedEngine: keeps one llama-server running, health-checked and restarted on exit."""

from __future__ import annotations

import asyncio
import contextlib
import ctypes
import os
import signal
import time
from collections import deque
from collections.abc import Sequence
from typing import Any

import aiohttp

from proxy.backends.admission import AdmissionQueue, Queued, Seats
from proxy.backends.devices import Device
from proxy.backends.engine import (
    BackendState,
    ReplicaView,
    engine_health,
    wait_for,
)
from proxy.backends.launch import LaunchSpec, free_port
from proxy.config import Supervision
from proxy.llamacpp import slot_context, slots_processing
from proxy.log import get_logger

_PR_SET_PDEATHSIG = 1
_UNHEALTHY_AFTER = 3
_STABLE_AFTER_S = 60.0
log = get_logger("backend")


def _die_with_parent() -> None:
    # Runs in the child before exec: the kernel kills it when the proxy dies, even by SIGKILL.
    libc = ctypes.CDLL("libc.so.6", use_errno=True)
    libc.prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)


class SupervisedEngine(Queued):
    """Owns one llama-server process: starts it, checks its health, restarts it with backoff."""

    def __init__(
        self,
        spec: LaunchSpec,
        settings: Supervision,
        session: aiohttp.ClientSession,
        device: Device,
    ):
        self.spec = spec
        self.device = device
        self.name = spec.config.name
        self.settings = settings
        self.session = session
        self.state: BackendState = "starting"
        self.limit = spec.config.max_concurrency or spec.config.parallel
        # Its one server: the process, at the port it has now.
        self._seats = Seats("", device, self.limit, spec.config.kv_unified)
        self._admission = AdmissionQueue(
            self.name, settings.max_queue, lambda: (self._seats,), self._release_device
        )
        self.restarts = 0
        self.failed_health_checks = 0
        self.process: asyncio.subprocess.Process | None = None
        self.last_lines: deque[str] = deque(maxlen=40)
        self._ready = asyncio.Event()
        self._stopping = False
        self._restart_asked = False
        self._spawned = asyncio.Event()
        self._task: asyncio.Task[None] | None = None
        self._pump_task: asyncio.Task[None] | None = None
        self._background: set[asyncio.Task[None]] = set()

    @property
    def ready(self) -> bool:
        """Whether requests may be sent to this backend now."""
        return self.state == "ready"

    @property
    def base_url(self) -> str:
        """Its process's address (a restart moves the port)."""
        return self._seats.url

    @property
    def n_ctx(self) -> int | None:
        """Tokens one request may hold, as the running llama-server reports it (None: not yet)."""
        return self._seats.n_ctx

    @n_ctx.setter
    def n_ctx(self, tokens: int | None) -> None:
        self._seats.n_ctx = tokens

    @property
    def in_flight(self) -> int:
        """Requests admitted and decoding."""
        return self._seats.in_flight

    @property
    def in_background(self) -> int:
        """Of those, the proxy's own (calibration): not load a user's request would share."""
        return self._seats.in_background

    @property
    def held_tokens(self) -> int:
        """KV tokens the requests seated here hold."""
        return self._seats.held_tokens

    @property
    def load(self) -> int:
        """Users' requests on the backend: its own process serves only this proxy."""
        return self._seats.load

    @property
    def server_urls(self) -> frozenset[str]:
        """Where a prompt this backend processed may be held: its process, at its port now."""
        return frozenset({self.base_url})

    @property
    def saturated(self) -> bool:
        """Whether every slot is busy (a new request would wait in the queue)."""
        return self.in_flight >= self.limit

    @property
    def context_free(self) -> int | None:
        """Tokens a new request may hold now: all of n_ctx unless the slots share one KV cache
        that requests in flight already fill; None before llama-server said its context."""
        return self._seats.context_free

    def _release_device(self, seats: Seats, abandoned: bool) -> None:
        """Give the device back; for a request llama-server may still compute, once it is idle."""
        if abandoned and self.process is not None:
            task = asyncio.create_task(self._release_device_when_idle())
            self._background.add(task)
            task.add_done_callback(self._background.discard)
        else:
            self.device.release(self.name)

    async def _release_device_when_idle(self) -> None:
        """Give the device back once llama-server stops working on abandoned requests.

        A request whose client left is cancelled upstream, but llama-server finishes its batch
        step first (seconds for a long verification on a CPU) and b11434 keeps generating a
        non-streamed answer to the end; the device is not free before that.
        """
        deadline = time.monotonic() + self.settings.abandoned_grace_s
        try:
            while time.monotonic() < deadline and self.ready:
                busy = await self._busy_slots()
                if busy is None or busy <= self.in_flight:
                    return
                await asyncio.sleep(0.05)
        finally:
            self.device.release(self.name)

    async def _busy_slots(self) -> int | None:
        """Slots llama-server is processing now; None when it cannot tell (stopped, no /slots)."""
        try:
            async with self.session.get(
                f"{self.base_url}/slots", timeout=aiohttp.ClientTimeout(total=2)
            ) as resp:
                if resp.status != 200:
                    return None
                slots = await resp.json()
        except (aiohttp.ClientError, TimeoutError, ValueError):
            return None
        return slots_processing(slots)

    @property
    def replicas(self) -> Sequence[ReplicaView]:
        """None to balance over: the backend is its one process."""
        return ()

    @property
    def restartable(self) -> bool:
        """True: the proxy runs its process."""
        return True

    def scrape_targets(self) -> list[tuple[str, dict[str, str]]]:
        """Its process's /metrics, while it serves."""
        return [(self.base_url, {})] if self.ready else []

    def health_view(self) -> dict[str, Any]:
        """Its part of GET /health."""
        return engine_health(self)

    @property
    def pid(self) -> int | None:
        """The llama-server process id, if the proxy runs one."""
        return self.process.pid if self.process and self.process.returncode is None else None

    def start(self) -> None:
        """Begin supervising in the background."""
        self._task = asyncio.create_task(self._run(), name=f"supervise-{self.name}")

    async def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until the backend is ready; False if timeout passes first."""
        return await wait_for(self._ready, timeout)

    async def stop(self) -> None:
        """Stop supervising and end the process: SIGTERM, then SIGKILL after the grace period."""
        self._stopping = True
        if self._task is not None:
            self._task.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await self._task
        await self._terminate()
        self._set_state("stopped")

    async def restart(self, timeout: float | None = None) -> bool:
        """Replace llama-server with a fresh process and wait until it is ready; False on timeout.

        What the old process kept goes with it: prompt caches, and an n-gram backend's memory of
        every answer it generated.
        """
        if self._task is None:
            raise RuntimeError(f"backend {self.name!r} has no process of this proxy's to restart")
        self._restart_asked = True
        self._spawned.clear()
        self._set_state("restarting")
        await self._terminate()

        async def fresh_and_ready() -> None:
            # A health check in flight while the old process ended may have flagged it ready.
            await self._spawned.wait()
            await self._ready.wait()

        try:
            await asyncio.wait_for(fresh_and_ready(), timeout)
        except TimeoutError:
            return False
        return True

    def _set_state(self, state: BackendState) -> None:
        if state != self.state:
            log.info("backend state", backend=self.name, state=state, previous=self.state)
        self.state = state
        if state == "ready":
            self._ready.set()
        else:
            self._ready.clear()

    async def _run(self) -> None:
        backoff = self.settings.restart_backoff_initial_s
        while not self._stopping:
            await self._spawn()
            ready_at = time.monotonic()
            if await self._wait_healthy():
                ready_at = time.monotonic()
                self.n_ctx = await read_slot_context(self.session, self.base_url)
                self._set_state("ready")
                await self._watch()
            if self._stopping:
                return
            if self._restart_asked:
                # Asked for, not a crash: no backoff, and the restart counter stays for crashes.
                self._restart_asked = False
                log.info("backend restarted on request", backend=self.name)
                continue
            await self._terminate()
            if time.monotonic() - ready_at > _STABLE_AFTER_S:
                backoff = self.settings.restart_backoff_initial_s
            self._set_state("restarting")
            log.warning(
                "backend exited; restarting",
                backend=self.name,
                exit_code=self.process.returncode if self.process else None,
                restarts=self.restarts + 1,
                backoff_s=backoff,
                last_lines=list(self.last_lines)[-8:],
            )
            await asyncio.sleep(backoff)
            backoff = min(backoff * 2, self.settings.restart_backoff_max_s)
            self.restarts += 1

    async def _spawn(self) -> None:
        port = free_port(self.settings.backend_host)
        self.n_ctx = None
        self._seats.url = f"http://{self.settings.backend_host}:{port}"
        argv = self.spec.argv(self.settings.backend_host, port)
        self.last_lines.clear()
        self._set_state("starting")
        log.info("starting llama-server", backend=self.name, port=port, argv=argv)
        self.process = await asyncio.create_subprocess_exec(
            *argv,
            stdin=asyncio.subprocess.DEVNULL,
            stdout=asyncio.subprocess.PIPE,
            stderr=asyncio.subprocess.STDOUT,
            # Own session: Ctrl+C reaches only the proxy, which then stops backends in order.
            start_new_session=True,
            preexec_fn=_die_with_parent,
        )
        self._pump_task = asyncio.create_task(
            self._pump_output(self.process), name=f"log-{self.name}"
        )
        self._spawned.set()

    async def _pump_output(self, process: asyncio.subprocess.Process) -> None:
        assert process.stdout is not None
        async for raw in process.stdout:
            line = raw.decode("utf-8", errors="replace").rstrip()
            if not line:
                continue
            self.last_lines.append(line)
            lowered = line.lower()
            if "error" in lowered or "failed" in lowered:
                log.warning("llama-server", backend=self.name, line=line)
            else:
                log.debug("llama-server", backend=self.name, line=line)

    def _exited(self) -> bool:
        return self.process is not None and self.process.returncode is not None

    async def _healthy(self) -> bool:
        try:
            async with self.session.get(
                f"{self.base_url}/health", timeout=aiohttp.ClientTimeout(total=3)
            ) as resp:
                return resp.status == 200
        except (aiohttp.ClientError, TimeoutError):
            return False

    async def _wait_healthy(self) -> bool:
        """Poll /health while the model loads, with progress; False on exit or timeout."""
        start = time.monotonic()
        last_report = start
        while not self._exited():
            if await self._healthy():
                log.info(
                    "backend ready", backend=self.name, load_s=round(time.monotonic() - start, 1)
                )
                return True
            now = time.monotonic()
            if now - start > self.settings.ready_timeout_s:
                log.error(
                    "backend did not become ready in time; raise ready_timeout_s for big models",
                    backend=self.name,
                    waited_s=round(now - start),
                )
                return False
            if now - last_report >= 10:
                last_report = now
                log.info(
                    "backend loading",
                    backend=self.name,
                    waited_s=round(now - start),
                    last_line=self.last_lines[-1] if self.last_lines else "",
                )
            await asyncio.sleep(0.25)
        return False

    async def _watch(self) -> None:
        """Health-check periodically until the process exits (supervised) or forever (external)."""
        failures = 0
        while not self._exited():
            await self._sleep_or_exit(self.settings.health_interval_s)
            if self._exited():
                return
            if await self._healthy():
                failures = 0
                self._set_state("ready")
                continue
            failures += 1
            self.failed_health_checks += 1
            if failures >= _UNHEALTHY_AFTER:
                self._set_state("unhealthy")

    async def _sleep_or_exit(self, seconds: float) -> None:
        if self.process is None:
            await asyncio.sleep(seconds)
            return
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(asyncio.shield(self.process.wait()), seconds)

    def mark_down(self, base_url: str | None = None) -> None:
        """Take the backend out of routing at once after a failed request (health decides after)."""
        if self.state == "ready":
            self._set_state("unhealthy")

    async def _terminate(self) -> None:
        process = self.process
        if process is None or process.returncode is not None:
            return
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGTERM)
        try:
            await asyncio.wait_for(process.wait(), self.settings.shutdown_grace_s)
        except TimeoutError:
            log.warning("llama-server ignored SIGTERM; killing it", backend=self.name)
            with contextlib.suppress(ProcessLookupError):
                os.killpg(process.pid, signal.SIGKILL)
            await process.wait()


async def read_slot_context(session: aiohttp.ClientSession, base_url: str) -> int | None:
    """A llama-server's per-request context from its /props; None when it does not answer."""
    try:
        async with session.get(f"{base_url}/props", timeout=aiohttp.ClientTimeout(total=5)) as resp:
            return slot_context(await resp.json()) if resp.status == 200 else None
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
