"""HTTP handlers: every relayed surface (see surfaces.py), /v1/models, /health and /metrics."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.api import speculation
from proxy.api.context_fit import (
    ANSWER_RESERVE,
    answer_budget,
    count_prompt_tokens,
    estimate_tokens,
    may_overflow,
    too_long,
)
from proxy.api.errors import REQUEST_ID, ApiError
from proxy.api.record import record
from proxy.api.relay import RelayTimeouts, relay
from proxy.api.state import (
    CALIBRATION,
    CPU,
    METRICS,
    POOL,
    ROUTER,
    SESSION,
    SETTINGS,
    TRAFFIC,
    UPSTREAM,
)
from proxy.api.status_page import status_live, status_page
from proxy.api.surfaces import SURFACES, Surface
from proxy.backends.backend import Backend, BackendSaturatedError, SlotUse
from proxy.exchange import Admission, Exchange, Prompt, Route
from proxy.log import get_logger
from proxy.measurement import CLIENT_GONE, Measurement
from proxy.metrics import CONTENT_TYPE
from proxy.routing.agent_turns import session_intent
from proxy.routing.prefixes import PromptPrefix, session_key
from proxy.routing.router import NoBackendError, UnknownModelError
from proxy.tasks import AUTO_MODEL, AUTO_TASK_MODELS, ROUTING_MODEL_IDS

log = get_logger("request")
_ROOM_POLL_S = 0.25


def _parse_json(raw: bytes) -> Any:
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


def _handler(surface: Surface) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler of one surface."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await _complete(request, surface)

    handle.__doc__ = f"POST {surface.path}."
    return handle


async def _complete(request: web.Request, surface: Surface) -> web.StreamResponse:
    """Serve one request and record it exactly once, errors included."""
    exchange = Exchange(
        surface.endpoint,
        request.get(REQUEST_ID) or uuid.uuid4().hex[:16],
        generates=surface.generates,
    )
    try:
        with request.app[TRAFFIC].request():
            response = await _serve(request, surface, exchange)
        upstream = exchange.upstream
        # A client that left before the end got no answer, however the relay returned.
        gone = upstream is not None and upstream.error == CLIENT_GONE and not exchange.answered
        exchange.status = 499 if gone else upstream.status if upstream is not None else 200
        return response
    except (ApiError, web.HTTPException) as exc:
        exchange.status = exc.status
        raise
    except asyncio.CancelledError:
        # "client closed request", as nginx counts it; unless it had the whole answer.
        upstream = exchange.upstream
        exchange.status = upstream.status if upstream is not None and exchange.answered else 499
        raise
    except Exception:
        exchange.status = 500
        raise
    finally:
        record(request.app, exchange)


@dataclass(frozen=True)
class _Fit:
    """The backends a request may go to, and the KV tokens it will hold on the one it takes."""

    backends: list[Backend]
    tokens: int
    prompt_tokens: int = 0
    # Seconds spent waiting on others: llama-server counting the prompt, room in the cache.
    waited_s: float = 0.0


async def _backends_that_fit(
    app: web.Application,
    surface: Surface,
    body: dict[str, Any],
    body_bytes: int,
    pinned: Backend | None,
) -> _Fit:
    """The backends whose context holds this request's prompt; a clear 400 when none can.

    Only a body long enough that it might not fit is counted (by llama-server, template and
    tools included), so short requests pay nothing; theirs is estimated from their size. Where
    the slots of a backend share one KV cache, a long prompt waits until the requests in flight
    leave it room, rather than fail mid-prompt.
    """
    backends = app[POOL]
    pool = list(backends)
    if not surface.generates:
        return _Fit(pool, 0)
    known = [b.n_ctx for b in pool if b.ready and b.n_ctx is not None]
    tokens = estimate_tokens(body_bytes)
    waited = 0.0
    if known and may_overflow(body_bytes, min(known)):
        ready = [b for b in pool if b.ready]
        counter = pinned if pinned is not None and pinned.ready else ready[0]
        counting = time.monotonic()
        counted = await count_prompt_tokens(app[SESSION], counter.base_url, surface.endpoint, body)
        waited += time.monotonic() - counting
        tokens = counted if counted is not None else tokens
        # llama-server refuses a prompt of n_ctx tokens or more; the answer may use the rest.
        fit = [b for b in pool if b.n_ctx is None or b.n_ctx > tokens]
        if pinned is not None and pinned not in fit:
            raise too_long(tokens, pinned.n_ctx or 0, pinned.name)
        if not fit:
            raise too_long(tokens, max(known), None)
        pool = fit
    held = tokens + ANSWER_RESERVE
    candidates = [pinned] if pinned is not None else pool
    deadline = time.monotonic() + app[SETTINGS].request_timeout_s
    while time.monotonic() < deadline:
        # An empty backend always has room for what fits it at all.
        room = [
            b
            for b in candidates
            if b.context_free is None or b.context_free >= min(held, b.n_ctx or held)
        ]
        if room:
            return _Fit(room if pinned is None else pool, held, tokens, waited)
        await asyncio.sleep(_ROOM_POLL_S)
        waited += _ROOM_POLL_S
    raise ApiError(
        503,
        f"no backend has room for this request's {tokens} prompt tokens beside the requests "
        "in flight; retry when they finish",
        code="context_busy",
        headers={"Retry-After": "5"},
    )


def _agent_intent(view: Mapping[str, Any]) -> str | None:
    """For an agent's turn (a request offering tools), what its session's first instruction asks."""
    messages = view.get("messages")
    if not view.get("tools") or not isinstance(messages, list):
        return None
    return session_intent(messages)


def _choose(app: web.Application, exchange: Exchange, fit: _Fit, budget: int | None) -> Route:
    """The router's choice (by the whole request's cost for a task, else any ready backend),
    refusals as errors."""
    pool, model = app[POOL], exchange.model
    try:
        return app[ROUTER].route(
            exchange, fit.backends, fit.prompt_tokens, budget, app[CPU].quiet_now()
        )
    except UnknownModelError:
        ids = ", ".join([AUTO_MODEL, *AUTO_TASK_MODELS, *pool.names])
        raise ApiError(
            404,
            f"model {model!r} does not exist; use one of: {ids} "
            "(or map it to one with `model_aliases` in the config)",
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


def _parse(app: web.Application, surface: Surface, raw: bytes, exchange: Exchange) -> None:
    """Parse: the checked body and the model it names, an alias resolved."""
    exchange.body = surface.check(_parse_json(raw))
    exchange.requested_model = exchange.body.get("model")
    exchange.model = app[ROUTER].resolve_model(exchange.requested_model or AUTO_MODEL)
    exchange.pinned = app[POOL].get(exchange.model)


def _classify(
    app: web.Application,
    surface: Surface,
    headers: Mapping[str, str],
    shaped: dict[str, Any],
    exchange: Exchange,
) -> None:
    """Classify: the task class, and what the router may know of the prompt."""
    if not surface.generates:
        return  # a passthrough (tokenize, templates) has neither
    view = surface.view(exchange.body)
    try:
        exchange.task = app[ROUTER].task_for(
            view, exchange.model, headers.get("X-Specproxy-Task"), surface.fixed_task
        )
    except ValueError as exc:
        raise ApiError(400, str(exc), code="invalid_task", param="X-Specproxy-Task") from None
    exchange.prompt = Prompt(
        PromptPrefix.of(shaped), session_key(exchange.body, headers), agent=_agent_intent(view)
    )


def _upstream_body(
    surface: Surface, body: Mapping[str, Any], shaped: dict[str, Any]
) -> dict[str, Any]:
    """The body as llama-server takes it, whichever backend is chosen."""
    if not surface.generates:
        # A passthrough answers one JSON document; a `stream` flag would only confuse the relay.
        return {k: v for k, v in shaped.items() if k != "stream"}
    # Through the proxy a slot number names no particular server, and a named slot skips
    # llama-server's own search of its slots and RAM cache (docs/routing.md). A client's
    # speculation settings go only where _client_speculation checked them.
    shaped = {
        k: v for k, v in shaped.items() if k != "id_slot" and not k.startswith(speculation.PREFIX)
    }
    if not body.get("stream"):
        return shaped
    # Running timings in every streamed chunk: a stream its client abandons still measured
    # speed and acceptance up to that point, which the scoreboard and the metrics count.
    streamed = {"timings_per_token": True, **shaped}
    if surface.stream_progress:
        streamed["return_progress"] = True
    return streamed


def _client_speculation(app: web.Application, exchange: Exchange) -> dict[str, Any]:
    """A client's `speculative.*` fields, checked against the backend it pinned."""
    fields = speculation.client_fields(exchange.body)
    if not fields or not exchange.generates:
        return {}
    if exchange.model in ROUTING_MODEL_IDS:
        speculation.refuse_on_auto(fields)
    backend = exchange.pinned
    if backend is None:
        return {}  # an unknown model: choosing it answers the 404
    checked = speculation.checked(fields, backend)
    exchange.client_speculation = bool(checked)
    return checked


def _headers(exchange: Exchange, route: Route) -> dict[str, str]:
    """The X-Specproxy-* headers that tell the client where its request went."""
    headers = {
        "X-Specproxy-Backend": route.backend.name,
        **({"X-Specproxy-Task": exchange.task} if exchange.task is not None else {}),
        "X-Specproxy-Route": route.reason,
        "X-Specproxy-Load-Level": str(route.level),
        "X-Request-Id": exchange.request_id,
        "X-Specproxy-Device": route.backend.device.name,
    }
    if exchange.requested_model is not None and exchange.model != exchange.requested_model:
        headers["X-Specproxy-Model"] = exchange.model
    return headers


async def _serve(request: web.Request, surface: Surface, exchange: Exchange) -> web.StreamResponse:
    """parse → classify → choose → admit → relay; the record step reads `exchange` after."""
    app = request.app
    reading = time.monotonic()
    raw = await request.read()
    exchange.body_wait_s = time.monotonic() - reading
    _parse(app, surface, raw, exchange)
    # Refused before any wait for room: a bad setting is the client's to fix at once.
    client_speculation = _client_speculation(app, exchange)
    # The body as llama-server takes it (a client's shape adjusted), made once.
    shaped = surface.upstream(exchange.body)
    _classify(app, surface, request.headers, shaped, exchange)
    fit = await _backends_that_fit(app, surface, shaped, len(raw), exchange.pinned)
    exchange.fit_wait_s = fit.waited_s
    body = _upstream_body(surface, exchange.body, shaped)
    budget = answer_budget(exchange.body)
    # An unreachable backend received nothing, so an unpinned request may try one other.
    for attempt in (1, 2):
        route = exchange.route = _choose(app, exchange, fit, budget)
        try:
            # A backend sharing its process says how its requests decode there.
            chosen = speculation.merged(route.backend.speculation, client_speculation)
            sent = {**body, **chosen} if surface.generates else body
            return await _admit_and_relay(request, surface, exchange, route, fit, sent)
        except ApiError as exc:
            # A pinned request may try again only on another replica of its backend.
            pinned_down = exchange.pinned is not None and not route.backend.ready
            if exc.code != "backend_unreachable" or pinned_down or attempt == 2:
                raise
    raise AssertionError("unreachable")


async def _admit_and_relay(
    request: web.Request,
    surface: Surface,
    exchange: Exchange,
    route: Route,
    fit: _Fit,
    body: dict[str, Any],
) -> web.StreamResponse:
    """Admit: hold the backend's device and slot; relay: send the request, relay its answer."""
    app = request.app
    settings = app[SETTINGS]
    backend = route.backend
    headers = _headers(exchange, route)
    if "model" in body or surface.generates:
        body = {**body, "model": backend.name}
    # The metrics hold it from the start: a request cancelled mid-stream still counts what
    # it generated.
    exchange.retry()
    upstream = exchange.upstream = Measurement()
    if surface.uses_slot:
        hold = backend.slot(fit.tokens, route.cached.worth_following, lambda: upstream.settled)
    else:
        # A passthrough (tokenize, templates) decodes nothing: any server of the backend.
        hold = nullcontext(SlotUse(base_url=backend.base_url, device=backend.device.name))
    timeouts = RelayTimeouts(
        first_token_s=settings.first_token_timeout_s,
        idle_s=settings.idle_timeout_s,
        whole_answer_s=settings.request_timeout_s,
    )
    meter = app[CPU]
    use: SlotUse | None = None
    target = ""  # the server the request went to: a replica of an external backend
    router = app[ROUTER]
    shares = surface.uses_slot
    computing = router.computing(exchange, fit.prompt_tokens) if shares else nullcontext(0.0)
    try:
        async with computing as prefix_wait_s:
            exchange.prefix_wait_s += prefix_wait_s
            asked = time.monotonic()
            async with hold as use:
                exchange.admit_wait_s += time.monotonic() - asked
                admission = exchange.admission = Admission.of(use, backend.limit)
                target = admission.placement.url
                headers["X-Specproxy-Device"] = admission.device
                headers["X-Specproxy-Device-Wait"] = f"{admission.device_wait_s:.3f}"
                started = meter.snapshot()
                try:
                    response = await relay(
                        request,
                        app[UPSTREAM],
                        backend.name,
                        target + surface.path,
                        body,
                        headers,
                        timeouts,
                        upstream,
                        surface.wire,
                        reuse=backend.spec.our_build,
                    )
                finally:
                    exchange.contended = meter.contended(started, meter.snapshot())
    except BackendSaturatedError as exc:
        raise ApiError(
            429,
            f"{exc}; retry after a moment, or raise max_concurrency / max_queue in the config",
            code="backend_saturated",
            headers={"Retry-After": "1"},
        ) from None
    finally:
        if use is not None:
            exchange.mean_load = use.mean_load
        # Only a lost connection says the server may be gone, and only until its health check
        # says otherwise; a bad answer or a slow connect is this request's failure alone.
        if upstream.connection_lost:
            backend.mark_down(target)
    return response


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: the routing ids, every backend by name and the exact model aliases."""
    created = int(time.time())
    pool = request.app[POOL]
    router = request.app[ROUTER]
    # Exact aliases too, for clients that check their model is listed; patterns are not ids.
    aliases = router.exact_aliases()
    ids = [AUTO_MODEL, *AUTO_TASK_MODELS, *pool.names, *aliases]
    contexts = {b.name: b.n_ctx for b in pool}
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
    ready = sum(1 for b in pool if b.ready)
    replica_down = any(r.state == "unhealthy" for b in pool for r in b.replicas)
    everything = ready == len(pool) and not replica_down
    status = "ok" if everything else "degraded" if ready else "unavailable"
    progress = request.app[CALIBRATION]
    calibration = {"state": progress.state, "requests": progress.requests}
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
            # The 90 % interval the router compares by, and whether only a busy machine
            # measured this cell.
            "interval": [round(x, 2) for x in m.interval],
            "contended": m.estimate.contended,
        }
        for m in router.measured()
    ]
    prompt = {
        name: round(tps, 1)
        for name in request.app[POOL].names
        if (tps := router.prompt_speed(name)) is not None
    }
    return web.json_response({"estimates": rows, "prompt_tokens_per_s": prompt})


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
    if not backend.restartable:
        raise ApiError(
            409,
            f"backend {name!r} is an external server; restart it where it runs",
            code="not_restartable",
        )
    if backend.in_flight or backend.queued:
        raise ApiError(
            409,
            f"backend {name!r} has {backend.in_flight} requests in flight and {backend.queued} "
            "queued; retry once it is idle (GET /health shows it)",
            code="backend_busy",
        )
    started = time.monotonic()
    timeout = request.app[SETTINGS].ready_timeout_s
    if not await backend.restart(timeout):
        raise ApiError(
            504,
            f"backend {name!r} was restarted but is not ready after {timeout:.0f} s; "
            "GET /health shows its state, and the proxy log its llama-server output",
            code="backend_not_ready",
        )
    took = round(time.monotonic() - started, 2)
    log.info("backend restarted", backend=name, took_s=took)
    return web.json_response(
        {"backend": name, "state": backend.state, "pid": backend.pid, "took_s": took}
    )


async def metrics(request: web.Request) -> web.Response:
    """GET /metrics: Prometheus text for the proxy, its router and every ready backend."""
    app = request.app
    pool = app[POOL]
    body = await app[METRICS].render(pool, pool.devices, app[SESSION], pool.engines)
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


def add_routes(app: web.Application) -> None:
    """Register every endpoint."""
    app.router.add_get("/", index)
    for surface in SURFACES:
        app.router.add_post(surface.path, _handler(surface))
    app.router.add_get("/v1/models", list_models)
    app.router.add_get("/health", health)
    app.router.add_get("/metrics", metrics)
    app.router.add_get("/scoreboard", scoreboard)
    app.router.add_get("/ui", status_page)
    app.router.add_get("/ui/live", status_live)
    app.router.add_post("/admin/backends/{name}/restart", restart_backend)
