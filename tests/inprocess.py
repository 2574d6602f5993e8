"""The proxy built in-process in front of llama-server doubles: the fast tier's harness."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import openai
from aiohttp.test_utils import TestClient, TestServer

from proxy.api.app import build_app
from proxy.api.state import POOL
from proxy.backends.discovery import Resolver
from proxy.backends.launch import prepare_backends
from proxy.config import Settings
from tests.llama_double import Behaviour, LlamaServerDouble, start_double


@dataclass
class FastProxy:
    """An in-process proxy, its doubles by backend name, and clients for it."""

    http: TestClient[Any, Any]
    doubles: dict[str, LlamaServerDouble]
    clients: list[openai.AsyncOpenAI] = field(default_factory=list)

    @property
    def url(self) -> str:
        return str(self.http.make_url("")).rstrip("/")

    def openai(self, **kw: Any) -> openai.AsyncOpenAI:
        """The official async client pointed at the proxy."""
        client = openai.AsyncOpenAI(
            base_url=f"{self.url}/v1", api_key=kw.pop("api_key", "unused"), max_retries=0, **kw
        )
        self.clients.append(client)
        return client


@asynccontextmanager
async def proxy_in_front(
    tmp_path: Path,
    backends: list[dict[str, Any]],
    doubles: dict[str, LlamaServerDouble] | None = None,
    resolver: Resolver | None = None,
    wait_ready: bool = True,
    **settings: Any,
) -> AsyncIterator[FastProxy]:
    """The proxy in-process in front of servers already running (each call: its own proxy)."""
    defaults: dict[str, Any] = {
        "calibration_requests": 0,
        "health_interval_s": 0.2,
        "scoreboard_file": tmp_path / f"scoreboard-{uuid.uuid4().hex[:8]}.json",
        "cache_dir": tmp_path / "cache",
    }
    config = Settings(backends=backends, **{**defaults, **settings})
    app = build_app(config, prepare_backends(config), resolver)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    try:
        if wait_ready:
            assert await app[POOL].wait_ready(10), "doubles did not become ready"
        proxy = FastProxy(client, doubles or {})
        yield proxy
        for c in proxy.clients:
            await c.close()
    finally:
        await client.close()


@asynccontextmanager
async def fast_proxy(
    tmp_path: Path, backends: dict[str, dict[str, Any]] | None = None, **settings: Any
) -> AsyncIterator[FastProxy]:
    """Doubles for `backends` (name -> extra backend config) and the proxy in front, ready."""
    backends = backends or {"plain": {}, "ngram": {"kind": "ngram"}}
    doubles = {name: await start_double(Behaviour()) for name in backends}
    configs = [{"name": n, "url": doubles[n].url, **extra} for n, extra in backends.items()]
    try:
        async with proxy_in_front(tmp_path, configs, doubles, **settings) as proxy:
            yield proxy
    finally:
        for double in doubles.values():
            await double.stop()
