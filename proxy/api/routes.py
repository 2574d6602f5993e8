"""HTTP handlers: the OpenAI endpoints, /v1/models, /health and /metrics."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from typing import Any

from aiohttp import web

from proxy.api.errors import ApiError
from proxy.api.relay import CLIENT_GONE, Measurement, RelayTimeouts, relay
from proxy.api.state import METRICS, POOL, ROUTER, SESSION, SETTINGS
from proxy.api.validation import Endpoint, validate_body
from proxy.backends.external import ExternalBackend
from proxy.backends.pool import Backend
from proxy.backends.supervisor import BackendSaturatedError
from proxy.llamacpp import Timings
from proxy.log import get_logger
from proxy.metrics import CONTENT_TYPE, RequestRecord
from proxy.routing.policy import RoutableBackend, RouteChoice
from proxy.routing.router import (
    AUTO_MODEL,
    AUTO_TASK_MODELS,
    NoBackendError,
    UnknownModelError,
)
from proxy.routing.scoreboard import Outcome

log = get_logger("request")
_PATHS: dict[Endpoint, str] = {"chat": "/v1/chat/completions", "completions": "/v1/completions"}


async def _read_json(request: web.Request) -> Any:
    raw = await request.read()
    try:
        return json.loads(raw.decode("utf-8"))
    except UnicodeDecodeError:
        raise ApiError(
            400, "the request body is not valid UTF-8", code="invalid_encoding"
        ) from None
    except ValueError as exc:
        raise ApiError(
            400, f"the request body is not valid JSON: {exc}", code="invalid_json"
        ) from None


async def _complete(request: web.Request, endpoint: Endpoint) -> web.StreamResponse:
    """Serve one completion and record it in the metrics exactly once, errors included."""
    seen = RequestRecord(endpoint)
    try:
        return await _serve(request, endpoint, seen)
    except (ApiError, web.HTTPException) as exc:
        seen.status = exc.status
        raise
    except asyncio.CancelledError:
        seen.status = 499  # "client closed request", as nginx counts it
        raise
    except Exception:
        seen.status = 500
        raise
    finally:
        request.app[METRICS].observe(seen)


def _finish(
    request: web.Request,
    request_id: str,
    endpoint: Endpoint,
    body: dict[str, Any],
    backend: str,
    task: str,
    choice: RouteChoice,
    measured: Measurement,
    seen: RequestRecord,
) -> None:
    """Record what an answer measured (a stream its client left included) and log one line."""
    outcome = Outcome.from_timings(
        backend, task, choice.level, Timings.parse(measured.timings), measured.ttft_s
    )
    if measured.status == 200 and measured.error in (None, CLIENT_GONE):
        request.app[ROUTER].record(outcome)
    log.info(
        "request",
        request_id=request_id,
        endpoint=endpoint,
        backend=backend,
        task=task,
        route=choice.reason,
        # Not `level`: that key is the log line's severity.
        load_level=choice.level,
        status=499 if measured.error == CLIENT_GONE else measured.status,
        stream=bool(body.get("stream")),
        tokens=outcome.predicted_n,
        tokens_per_s=round(outcome.tokens_per_s, 1) if outcome.tokens_per_s else None,
        acceptance=round(outcome.draft_n_accepted / outcome.draft_n, 3)
        if outcome.draft_n
        else None,
        ttft_s=round(measured.ttft_s, 3) if measured.ttft_s is not None else None,
        device=seen.device,
        device_wait_s=round(measured.device_wait_s, 3),
        duration_s=round(measured.duration_s, 3),
        error=measured.error,
        **({"body": body} if request.app[SETTINGS].log_prompts else {}),
    )


def _choose(app: web.Application, model: str, task: str) -> tuple[RoutableBackend, RouteChoice]:
    """The router's choice, with its refusals turned into OpenAI errors."""
    pool = app[POOL]
    try:
        return app[ROUTER].choose(model, task, list(pool))
    except UnknownModelError:
        ids = ", ".join([AUTO_MODEL, *AUTO_TASK_MODELS, *pool.names])
        raise ApiError(
            404,
            f"model {model!r} does not exist; use one of: {ids}",
            code="model_not_found",
            param="model",
        ) from None
    except NoBackendError as exc:
        raise ApiError(
            503,
            f"{exc}; retry shortly (see GET /health)",
            code="backend_unavailable",
            headers={"Retry-After": "2"},
        ) from None


async def _serve(
    request: web.Request, endpoint: Endpoint, seen: RequestRecord
) -> web.StreamResponse:
    """Validate, classify, choose, relay and log one completion, filling in `seen` as it goes."""
    body = validate_body(await _read_json(request), endpoint)
    app = request.app
    router, pool, settings = app[ROUTER], app[POOL], app[SETTINGS]
    model = body.get("model") or AUTO_MODEL
    try:
        task = router.task_for(body, model, request.headers.get("X-Specproxy-Task"))
    except ValueError as exc:
        raise ApiError(400, str(exc), code="invalid_task", param="X-Specproxy-Task") from None
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16]
    timeouts = RelayTimeouts(
        first_token_s=settings.first_token_timeout_s,
        idle_s=settings.idle_timeout_s,
        whole_answer_s=settings.request_timeout_s,
    )
    # Running timings in every streamed chunk: a stream its client abandons still measured
    # speed and acceptance up to that point, which the scoreboard learns from.
    upstream_body = {"timings_per_token": True, **body} if body.get("stream") else body
    # An unreachable backend received nothing, so an unpinned request may try one other.
    for attempt in (1, 2):
        backend, choice = _choose(app, model, task)
        supervisor = pool.get(backend.name)
        assert supervisor is not None
        seen.backend, seen.task, seen.route = backend.name, task, choice.reason
        seen.device = supervisor.device.name
        headers = {
            "X-Specproxy-Backend": backend.name,
            "X-Specproxy-Task": task,
            "X-Specproxy-Route": choice.reason,
            "X-Specproxy-Load-Level": str(choice.level),
            "X-Request-Id": request_id,
        }
        measured = Measurement()
        finish = functools.partial(
            _finish,
            request,
            request_id,
            endpoint,
            body,
            backend.name,
            task,
            choice,
            measured,
            seen,
        )
        target = ""  # the server the request went to: a replica of an external backend
        try:
            async with supervisor.slot() as use:
                target = use.base_url
                seen.device = use.device
                headers["X-Specproxy-Device"] = use.device
                headers["X-Specproxy-Device-Wait"] = f"{use.device_wait_s:.3f}"
                try:
                    response = await relay(
                        request,
                        app[SESSION],
                        backend.name,
                        target + _PATHS[endpoint],
                        {**upstream_body, "model": backend.name},
                        headers,
                        timeouts,
                        measured,
                    )
                except BaseException:
                    use.abandoned = True  # cancelled or failed: llama-server may still compute
                    raise
                finally:
                    measured.device_wait_s = use.device_wait_s
                use.abandoned = measured.error is not None or measured.status != 200
            if measured.status == 502:  # failed mid-stream
                supervisor.mark_down(target)
            break
        except BackendSaturatedError as exc:
            raise ApiError(
                429,
                f"{exc}; retry after a moment, or raise max_concurrency / max_queue in the config",
                code="backend_saturated",
                headers={"Retry-After": "1"},
            ) from None
        except asyncio.CancelledError:
            measured.error = measured.error or CLIENT_GONE
            finish()
            raise
        except ApiError as exc:
            if exc.status == 502:
                supervisor.mark_down(target)
            # A pinned request may try again only on another replica of its backend.
            pinned_down = choice.reason == "pinned" and not supervisor.ready
            if exc.code != "backend_unreachable" or pinned_down or attempt == 2:
                raise
    seen.measured, seen.status = measured, measured.status
    finish()
    return response


async def chat_completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/chat/completions."""
    return await _complete(request, "chat")


async def completions(request: web.Request) -> web.StreamResponse:
    """POST /v1/completions."""
    return await _complete(request, "completions")


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: the routing ids and every backend by name."""
    created = int(time.time())
    pool = request.app[POOL]
    ids = [AUTO_MODEL, *AUTO_TASK_MODELS, *pool.names]
    data = [{"id": i, "object": "model", "created": created, "owned_by": "specproxy"} for i in ids]
    return web.json_response({"object": "list", "data": data})


def _backend_health(b: Backend) -> dict[str, Any]:
    """One backend's part of /health; an external one lists its replicas."""
    shown: dict[str, Any] = {
        "state": b.state,
        "kind": b.spec.config.kind,
        "spec_type": b.spec_type,
        "url": b.base_url,
        "pid": b.pid,
        "restarts": b.restarts,
        "in_flight": b.in_flight,
        "load": b.load,
        "queued": b.queued,
        "limit": b.limit,
        "device": b.device.name,
    }
    if isinstance(b, ExternalBackend):
        shown["replicas"] = [
            {
                "url": r.url,
                "state": r.state,
                "in_flight": r.in_flight,
                "reported": r.reported,
                "load": r.load,
                "load_source": r.load_source,
                "failed_health_checks": r.failed_health_checks,
                "device": r.device.name,
            }
            for r in b.replicas
        ]
        if b.resolve_errors:
            shown["resolve_errors"] = b.resolve_errors
    return shown


async def health(request: web.Request) -> web.Response:
    """GET /health: the proxy's state and each backend's; 200 if any backend is ready."""
    pool = request.app[POOL]
    backends = {b.name: _backend_health(b) for b in pool}
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
    ready = sum(1 for b in pool if b.ready)
    replica_down = any(
        r.state == "unhealthy" for b in pool if isinstance(b, ExternalBackend) for r in b.replicas
    )
    everything = ready == len(pool) and not replica_down
    status = "ok" if everything else "degraded" if ready else "unavailable"
    return web.json_response(
        {"status": status, "backends": backends, "devices": devices},
        status=200 if ready else 503,
    )


async def scoreboard(request: web.Request) -> web.Response:
    """GET /scoreboard: what the router has measured, per backend, task class and load level."""
    rows = [
        {
            "backend": backend,
            "task": task,
            "level": level,
            "tokens_per_s": round(est.tokens_per_s, 2),
            "ttft_s": round(est.ttft_s, 4),
            "acceptance": None if est.acceptance is None else round(est.acceptance, 4),
            "recent_acceptance": est.recent_acceptance,
            "samples": est.samples,
        }
        for (backend, task, level), est in request.app[ROUTER].scoreboard.items()
    ]
    return web.json_response({"estimates": rows})


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text for the proxy, its router and every ready backend."""
    app = request.app
    pool = app[POOL]
    body = await app[METRICS].render(pool, pool.devices, app[SESSION])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


def add_routes(app: web.Application) -> None:
    """Register every endpoint."""
    app.router.add_post("/v1/chat/completions", chat_completions)
    app.router.add_post("/v1/completions", completions)
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/scoreboard", scoreboard)
