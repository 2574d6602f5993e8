"""BackendPool: every configured backend as a strategy on its engine, and the devices they share."""

from __future__ import annotations

import asyncio
import dataclasses
import functools
from collections.abc import Iterator

import aiohttp

from proxy.backends.devices import Device, build_devices, device_for
from proxy.backends.discovery import Resolver, SystemResolver
from proxy.backends.engine import Engine
from proxy.backends.external import ReplicatedEngine
from proxy.backends.launch import LaunchSpec, engine_spec
from proxy.backends.prompt_keeper import keeps_prompts
from proxy.backends.strategy import Strategy
from proxy.backends.supervisor import SupervisedEngine
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

        # One engine per process (or set of replicas); every configured backend is a Strategy
        # on one, and those naming a shared `engine` are served together by its process.
        self._by_name: dict[str, Strategy] = {}
        self._engines: list[Engine] = []
        sharing: dict[str, list[LaunchSpec]] = {}
        for s in specs:
            if s.config.engine is not None:
                sharing.setdefault(s.config.engine, []).append(s)
        shared: dict[str, SupervisedEngine] = {}
        for name, members in sharing.items():
            spec = kept(engine_spec(name, members))
            device = self.devices[spec.config.device_name]
            shared[name] = SupervisedEngine(spec, settings.supervision(), session, device)
            self._engines.append(shared[name])
        for s in specs:
            name = s.config.name
            if s.config.engine is not None:
                self._by_name[name] = Strategy(s, shared[s.config.engine], shares=True)
                continue
            engine: Engine
            if s.config.supervised:
                device = self.devices[s.config.device_name]
                engine = SupervisedEngine(kept(s), settings.supervision(), session, device)
            else:
                engine = ReplicatedEngine(
                    s,
                    settings.supervision(),
                    session,
                    functools.partial(
                        device_for, devices=self.devices, backend=name, settings=settings
                    ),
                    resolver or SystemResolver(),
                )
            self._engines.append(engine)
            self._by_name[name] = Strategy(s, engine)

    def __iter__(self) -> Iterator[Strategy]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> Strategy | None:
        """The backend with this name, if configured."""
        return self._by_name.get(name)

    @property
    def names(self) -> list[str]:
        """Backend names in configuration order."""
        return list(self._by_name)

    @property
    def engines(self) -> list[Engine]:
        """Every engine, in configuration order: the processes and sets of replicas."""
        return list(self._engines)

    @property
    def keeping_prompts(self) -> list[SupervisedEngine]:
        """The processes whose long prompts are kept on disk across restarts."""
        return [
            e
            for e in self._engines
            if isinstance(e, SupervisedEngine) and e.spec.slot_save_path is not None
        ]

    def start(self) -> None:
        """Start supervising every engine."""
        for engine in self._engines:
            engine.start()

    async def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every engine is ready; False if timeout passes first."""
        results = await asyncio.gather(*(e.wait_ready(timeout) for e in self._engines))
        return all(results)

    async def stop(self) -> None:
        """Stop every engine (in parallel, each with its grace period)."""
        await asyncio.gather(*(e.stop() for e in self._engines))
