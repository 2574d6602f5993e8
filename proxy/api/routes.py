"""The URL table: every endpoint and the handler that serves it."""

from __future__ import annotations

from aiohttp import web

from proxy.api.admin import restart_backend
from proxy.api.endpoints import health, index, list_models, metrics, scoreboard
from proxy.api.pipeline import handler
from proxy.api.status_page import status_live, status_page
from proxy.api.surfaces import SURFACES


def add_routes(app: web.Application) -> None:
    """Register every endpoint."""
    app.router.add_get("/", index)
    for surface in SURFACES:
        app.router.add_post(surface.path, handler(surface))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/scoreboard", scoreboard)
    app.router.add_get("/ui", status_page)
    app.router.add_get("/ui/live", status_live)
    app.router.add_post("/admin/backends/{name}/restart", restart_backend)
