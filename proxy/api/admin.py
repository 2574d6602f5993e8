"""The admin endpoints: restarting a backend."""

from __future__ import annotations

import time

from aiohttp import web

from proxy.api.errors import ApiError
from proxy.api.state import POOL, SETTINGS
from proxy.log import get_logger

log = get_logger("request")


async def restart_backend(request: web.Request) -> web.Response:
    """POST /admin/backends/{name}/restart: a fresh llama-server, once nothing is in flight.

    Load tests use it to give every mode the same history: an n-gram backend remembers every
    answer it generated, and prompt caches keep every prompt.
    """
    name = request.match_info["name"]
    backend = request.app[POOL].get(name)
    if backend is None:
        known = ", ".join(request.app[POOL].names)
        raise ApiError(404, f"no backend {name!r}; the backends are {known}", code="not_found")
    # A strategy sharing its engine restarts the process it shares.
    engine = backend.engine
    if not engine.restartable:
        raise ApiError(
            409,
            f"backend {name!r} is an external server; restart it where it runs",
            code="not_restartable",
        )
    if engine.in_flight or engine.queued:
        raise ApiError(
            409,
            f"backend {name!r} has {engine.in_flight} requests in flight and {engine.queued} "
            "queued; retry once it is idle (GET /health shows it)",
            code="backend_busy",
        )
    started = time.monotonic()
    timeout = request.app[SETTINGS].ready_timeout_s
    if not await engine.restart(timeout):
        raise ApiError(
            504,
            f"backend {name!r} was restarted but is not ready after {timeout:.0f} s; "
            "GET /health shows its state, and the proxy log its llama-server output",
            code="backend_not_ready",
        )
    took = round(time.monotonic() - started, 2)
    log.info("backend restarted", backend=name, took_s=took)
    return web.json_response(
        {"backend": name, "state": engine.state, "pid": engine.pid, "took_s": took}
    )
