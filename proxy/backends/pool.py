"""BackendPool: every configured backend's supervisor and the devices they share."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator

import aiohttp

from proxy.backends.devices import Device, build_devices
from proxy.backends.launch import LaunchSpec
from proxy.backends.supervisor import BackendSupervisor
from proxy.config import Settings


class BackendPool:
    """The backends by name, in configuration order."""

    def __init__(self, specs: list[LaunchSpec], settings: Settings, session: aiohttp.ClientSession):
        self.devices: dict[str, Device] = build_devices(settings)
        self._by_name = {
            s.config.name: BackendSupervisor(
                s, settings.supervision(), session, self.devices[s.config.device_name]
            )
            for s in specs
        }

    def __iter__(self) -> Iterator[BackendSupervisor]:
        return iter(self._by_name.values())

    def __len__(self) -> int:
        return len(self._by_name)

    def get(self, name: str) -> BackendSupervisor | None:
        """The backend with this name, if configured."""
        return self._by_name.get(name)

    @property
    def names(self) -> list[str]:
        """Backend names in configuration order."""
        return list(self._by_name)

    def start(self) -> None:
        """Start supervising every backend."""
        for backend in self:
            backend.start()

    async def wait_ready(self, timeout: float | None = None) -> bool:
        """Wait until every backend is ready; False if timeout passes first."""
        results = await asyncio.gather(*(b.wait_ready(timeout) for b in self))
        return all(results)

    async def stop(self) -> None:
        """Stop every backend (in parallel, each with its grace period)."""
        await asyncio.gather(*(b.stop() for b in self))
