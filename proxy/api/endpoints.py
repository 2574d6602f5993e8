"""The read-only endpoints: /, /v1/models, /health, /scoreboard, /metrics."""

from __future__ import annotations

import time
from typing import Any

from aiohttp import web

from proxy.api.state import CALIBRATION, METRICS, POOL, ROUTER, SESSION
from proxy.api.surfaces import SURFACES
from proxy.metrics import CONTENT_TYPE
from proxy.tasks import AUTO_MODEL, AUTO_TASK_MODELS


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: the routing ids, every backend by name and the exact model aliases."""
    created = int(time.time())
    pool = request.app[POOL]
    router = request.app[ROUTER]
    # Exact aliases too, for clients that check their model is listed; patterns are not ids.
    aliases = router.exact_aliases()
    ids = [AUTO_MODEL, *AUTO_TASK_MODELS, *pool.names, *aliases]
    contexts = {b.name: b.engine.n_ctx for b in pool}
    # A routing id may go to any backend that holds the prompt: the largest context is its own.
    routed = max((n for n in contexts.values() if n is not None), default=None)

    def context_of(model_id: str) -> int | None:
        target = router.resolve_model(model_id)
        return contexts.get(target, routed)

    data = []
    for i in ids:
        n_ctx = context_of(i)
        entry: dict[str, Any] = {"id": i, "object": "model", "created": created}
        entry["owned_by"] = "specproxy"
        if n_ctx is not None:
            # llama-server's own field, and the one OpenAI-compatible clients read.
            entry["meta"] = {"n_ctx": n_ctx}
            entry["context_length"] = n_ctx
        data.append(entry)
    return web.json_response({"object": "list", "data": data})


async def health(request: web.Request) -> web.Response:
    """GET /health: the proxy's state and each backend's; 200 if any backend is ready."""
    pool = request.app[POOL]
    backends = {b.name: b.health_view() for b in pool}
    devices = {}
    for name, device in pool.devices.items():
        state = device.state()
        devices[name] = {
            "capacity": state.capacity,
            "in_use": state.in_use,
            "running": state.running,
            "waiting": state.waiting,
            "busy_s": round(state.busy_s, 3),
            "waits": state.waits,
            "wait_s": round(state.wait_s, 3),
        }
    ready = sum(1 for b in pool if b.engine.ready)
    replica_down = any(r.state == "unhealthy" for b in pool for r in b.engine.replicas)
    everything = ready == len(pool) and not replica_down
    status = "ok" if everything else "degraded" if ready else "unavailable"
    calibration = request.app[CALIBRATION].view()
    return web.json_response(
        {"status": status, "backends": backends, "devices": devices, "calibration": calibration},
        status=200 if ready else 503,
    )


async def scoreboard(request: web.Request) -> web.Response:
    """GET /scoreboard: what the router has measured, per backend, task class and load level."""
    router = request.app[ROUTER]
    rows = [
        {
            "backend": m.backend,
            "task": m.task,
            "level": m.level,
            "tokens_per_s": round(m.estimate.tokens_per_s, 2),
            "ttft_s": round(m.estimate.ttft_s, 4),
            "acceptance": None
            if m.estimate.acceptance is None
            else round(m.estimate.acceptance, 4),
            "recent_acceptance": m.estimate.recent_acceptance,
            "samples": m.estimate.samples,
            # With those a busy machine measured, which the cell keeps apart from quiet ones.
            "all_samples": m.all_samples,
            # The 90 % interval the router compares by, and whether only a busy machine
            # measured this cell.
            "interval": [round(x, 2) for x in m.interval],
            "contended": m.estimate.contended,
        }
        for m in router.measured()
    ]
    # Per backend, each its engine's: strategies sharing a process share its prompt speed.
    prompt = {
        b.name: round(tps, 1)
        for b in request.app[POOL]
        if (tps := router.prompt_speed(b.engine.name)) is not None
    }
    return web.json_response({"estimates": rows, "prompt_tokens_per_s": prompt})


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text for the proxy, its router and every ready backend."""
    app = request.app
    pool = app[POOL]
    body = await app[METRICS].render(pool, pool.devices, app[SESSION])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def index(request: web.Request) -> web.Response:
    """GET / (and HEAD /, which Claude Code sends first): what this server is, where to go;
    a browser is sent to the status page."""
    if "text/html" in request.headers.get("Accept", ""):
        raise web.HTTPFound("/ui")
    return web.json_response(
        {
            "service": "specproxy",
            "models": "/v1/models",
            "health": "/health",
            "metrics": "/metrics",
            "scoreboard": "/scoreboard",
            "status_page": "/ui",
            "apis": [s.path for s in SURFACES],
        }
    )
