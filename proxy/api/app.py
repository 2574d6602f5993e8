"""The aiohttp application: routes, error middleware and the lifetime of backends."""

from __future__ import annotations

from collections.abc import AsyncIterator

import aiohttp
from aiohttp import web

from proxy.api.errors import openai_errors
from proxy.api.routes import add_routes
from proxy.api.state import POOL, ROUTER, SESSION, SETTINGS
from proxy.backends.launch import LaunchSpec
from proxy.backends.pool import BackendPool
from proxy.config import Settings
from proxy.routing.classifier import TaskClassifier
from proxy.routing.policy import RoutePolicy
from proxy.routing.router import Router
from proxy.routing.scoreboard import Scoreboard


def build_app(settings: Settings, specs: list[LaunchSpec]) -> web.Application:
    """An application that starts the backends on startup and stops them on cleanup."""
    app = web.Application(middlewares=[openai_errors], client_max_size=settings.max_body_bytes)
    app[SETTINGS] = settings
    scoreboard = Scoreboard()
    app[ROUTER] = Router(TaskClassifier(), RoutePolicy(scoreboard), scoreboard)

    async def backends_ctx(app: web.Application) -> AsyncIterator[None]:
        timeout = aiohttp.ClientTimeout(total=None, connect=settings.connect_timeout_s)
        # No per-host limit: concurrency is the backends' business, not the connection pool's.
        connector = aiohttp.TCPConnector(limit=0)
        async with aiohttp.ClientSession(timeout=timeout, connector=connector) as session:
            app[SESSION] = session
            app[POOL] = BackendPool(specs, settings, session)
            app[POOL].start()
            try:
                yield
            finally:
                await app[POOL].stop()

    app.cleanup_ctx.append(backends_ctx)
    add_routes(app)
    return app
