"""The proxy built in-process in front of llama-server stubs (proxy/testing/llama_double.py):
the fast tier's harness (tests/fast/). No llama-server, no model, no subprocess; the integration
tier's harness, `specproxy serve` as a subprocess, is tests/subprocess_proxy.py."""

from __future__ import annotations

import uuid
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import anthropic
import openai
from aiohttp import web
from aiohttp.test_utils import TestClient, TestServer

from proxy.api.app import build_app
from proxy.api.state import POOL
from proxy.backends.discovery import Resolver
from proxy.backends.launch import prepare_backends
from proxy.config import Settings
from proxy.testing.llama_double import Behaviour, LlamaServerDouble, start_double
from tests.helpers import eventually, without_specproxy_env


@dataclass
class FastProxy:
    """An in-process proxy, its stub backends by name, and SDK clients for it (closed with it)."""

    http: TestClient[web.Request, web.Application]
    doubles: dict[str, LlamaServerDouble]
    clients: list[openai.AsyncOpenAI | anthropic.AsyncAnthropic] = field(default_factory=list)

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

    def anthropic(self, **kw: Any) -> anthropic.AsyncAnthropic:
        """The official async Anthropic client pointed at the proxy (it appends /v1/messages)."""
        client = anthropic.AsyncAnthropic(
            base_url=self.url, api_key=kw.pop("api_key", "unused"), max_retries=0, **kw
        )
        self.clients.append(client)
        return client

    async def wait_calibrated(self, timeout: float) -> dict[str, Any]:
        """Wait until the proxy finished its start-up calibration; what /health says of it (the
        in-process twin of tests/subprocess_proxy.py's wait_calibrated)."""

        async def done() -> dict[str, Any] | None:
            health = await (await self.http.get("/health")).json()
            progress: dict[str, Any] = health["calibration"]
            return progress if progress["state"] == "done" else None

        return await eventually(done, timeout, "calibration", interval=0.2)


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
    # Module-scoped fixtures start before tests/fast/conftest.py's per-test removal of the
    # caller's SPECPROXY_* variables, so the harness removes them itself: only `settings`
    # configure this proxy.
    with without_specproxy_env():
        config = Settings(backends=backends, **{**defaults, **settings})
    app = build_app(config, prepare_backends(config), resolver)
    client = TestClient(TestServer(app, host="127.0.0.1"))
    await client.start_server()
    proxy = FastProxy(client, doubles or {})
    try:
        if wait_ready:
            assert await app[POOL].wait_ready(10), "the stubs did not become ready"
        yield proxy
    finally:
        for sdk in proxy.clients:
            await sdk.close()
        await client.close()


# One short calibration round: one prompt per class and backend, 8-token answers.
SHORT_CALIBRATION: dict[str, Any] = {
    "calibration_requests": 1,
    "calibration_prompts": 1,
    "calibration_max_tokens": 8,
    "calibration_echo_tokens": 8,
}


@asynccontextmanager
async def fast_proxy(
    tmp_path: Path, backends: dict[str, dict[str, Any]] | None = None, **settings: Any
) -> AsyncIterator[FastProxy]:
    """Stubs for `backends` (name -> extra backend config) and the proxy in front, ready."""
    backends = backends or {"plain": {}, "ngram": {"kind": "ngram"}}
    doubles = {name: await start_double(Behaviour()) for name in backends}
    configs = [{"name": n, "url": doubles[n].url, **extra} for n, extra in backends.items()]
    try:
        async with proxy_in_front(tmp_path, configs, doubles, **settings) as proxy:
            yield proxy
    finally:
        for double in doubles.values():
            await double.stop()
