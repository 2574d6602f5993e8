"""BackendPool: every configured backend (supervised or external) and the devices they share."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Iterator

import aiohttp

from proxy.backends.backend import Backend
from proxy.backends.devices import Device, build_devices, device_for
from proxy.backends.discovery import Resolver, SystemResolver
from proxy.backends.external import ExternalBackend
from proxy.backends.launch import LaunchSpec, engine_spec
from proxy.backends.prompt_keeper import keeps_prompts
from proxy.backends.strategy import Strategy
from proxy.backends.supervisor import BackendSupervisor
from proxy.config import Settings


class BackendPool:
    """The backends by name, in configuration order."""

    def __init__(
        self,
        specs: list[LaunchSpec],
        settings: Settings,
        session: aiohttp.ClientSession,
        resolver: Resolver | None = None,
    ):
        self.devices: dict[str, Device] = build_devices(settings)
        archive = settings.prompt_archive_path()
        if archive is not None:
            archive.mkdir(parents=True, exist_ok=True, mode=0o700)

        def kept(spec: LaunchSpec) -> LaunchSpec:
            """The spec with llama-server's slot files on, where its prompts are kept."""
            if archive is None or not keeps_prompts(spec):
                return spec
            return dataclasses.replace(spec, slot_save_path=archive)

        self._by_name: dict[str, Backend] = {}
        # One process per shared engine, serving each of its backends as a Strategy.
        self._engines: list[BackendSupervisor] = []
        sharing: dict[str, list[LaunchSpec]] = {}
        for s in specs:
            if s.config.engine is not None:
                sharing.setdefault(s.config.engine, []).append(s)
        engines: dict[str, BackendSupervisor] = {}
        for engine, members in sharing.items():
            spec = kept(engine_spec(engine, members))
            device = self.devices[spec.config.device_name]
            engines[engine] = BackendSupervisor(spec, settings.supervision(), session, device)
            self._engines.append(engines[engine])
        for s in specs:
            name = s.config.name
            if s.config.engine is not None:
                self._by_name[name] = Strategy(s, engines[s.config.engine])
                continue
            if s.config.supervised:
                device = self.devices[s.config.device_name]
                self._by_name[name] = BackendSupervisor(
                    kept(s), settings.supervision(), session, device
                )
                continue
            self._by_name[name] = ExternalBackend(
                s,
                settings.supervision(),
                session,
                functools.partial(
                    device_for, devices=self.devices, backend=name, settings=settings
                ),
                resolver or SystemResolver(),
            )

    def __iter__(self) -> Iterator[Backend]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> Backend | None:
        """The backend with this name, if configured."""
        return self._by_name.get(name)

    @property
    def names(self) -> list[str]:
        """Backend names in configuration order."""
        return list(self._by_name)

    @property
    def engines(self) -> list[BackendSupervisor]:
        """The processes that serve several backends each."""
        return list(self._engines)

    @property
    def keeping_prompts(self) -> list[BackendSupervisor]:
        """The processes whose long prompts are kept on disk across restarts."""
        processes = [*self._engines, *self]
        return [
            p
            for p in processes
            if isinstance(p, BackendSupervisor) and p.spec.slot_save_path is not None
        ]

    def start(self) -> None:
        """Start supervising every backend and engine."""
        for backend in self:
            backend.start()
        for engine in self._engines:
            engine.start()

    async def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every backend is ready; False if timeout passes first."""
        results = await asyncio.gather(*(b.wait_ready(timeout) for b in self))
        return all(results)

    async def stop(self) -> None:
        """Stop every backend (in parallel, each with its grace period)."""
        await asyncio.gather(*(b.stop() for b in self), *(e.stop() for e in self._engines))
