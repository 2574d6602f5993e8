"""HTTP handlers: every relayed surface (see surfaces.py), /v1/models, /health and /metrics."""

from __future__ import annotations

import asyncio
import functools
import json
import time
import uuid
from collections.abc import AsyncIterator, Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, asynccontextmanager, nullcontext
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from proxy.api.context_fit import (
    ANSWER_RESERVE,
    answer_budget,
    count_prompt_tokens,
    estimate_tokens,
    may_overflow,
    too_long,
)
from proxy.api.errors import ApiError
from proxy.api.relay import CLIENT_GONE, RelayTimeouts, relay
from proxy.api.state import CPU, METRICS, POOL, ROUTER, SESSION, SETTINGS
from proxy.api.surfaces import SURFACES, Surface
from proxy.backends.external import ExternalBackend
from proxy.backends.pool import Backend
from proxy.backends.supervisor import BackendSaturatedError, Placement, SlotUse
from proxy.llamacpp import Timings
from proxy.log import get_logger
from proxy.measurement import Measurement
from proxy.metrics import CONTENT_TYPE, RequestRecord
from proxy.routing.agent_turns import session_intent
from proxy.routing.policy import RequestCost, RoutableBackend
from proxy.routing.prefixes import Cached, PromptPrefix, session_key
from proxy.routing.router import NoBackendError, UnknownModelError, fim_outcome
from proxy.routing.scoreboard import Outcome, load_level
from proxy.tasks import AUTO_MODEL, AUTO_TASK_MODELS, FIM_TASK

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
    """Serve one request and record it in the metrics exactly once, errors included."""
    seen = RequestRecord(surface.endpoint)
    try:
        return await _serve(request, surface, seen)
    except (ApiError, web.HTTPException) as exc:
        seen.status = exc.status
        raise
    except asyncio.CancelledError:
        # "client closed request", as nginx counts it; unless it had the whole answer.
        answered = seen.measured is not None and seen.measured.answered
        seen.status = seen.measured.status if answered and seen.measured else 499
        raise
    except Exception:
        seen.status = 500
        raise
    finally:
        request.app[METRICS].observe(seen)


@dataclass
class _Route:
    """Where one attempt at a request went, and why; where its prompt was placed, once sent."""

    backend: RoutableBackend
    reason: str
    level: int
    # What the router expected the backend to hold of the prompt.
    cached: Cached
    placement: Placement | None = None
    slots: int = 1


@dataclass(frozen=True)
class _Prompt:
    """What the router knows of a request's prompt before sending it: its prefix chain and
    the client's session key."""

    prefix: PromptPrefix
    session: str | None
    # For a request that offers tools (an agent's turn), what its session asks for.
    agent: str | None = None


def _finish(
    request: web.Request,
    request_id: str,
    surface: Surface,
    body: dict[str, Any],
    task: str | None,
    route: _Route,
    prompt: _Prompt | None,
    measured: Measurement,
    seen: RequestRecord,
) -> None:
    """Record what an answer measured (a stream its client left included) and log one line."""
    backend = route.backend.name
    timings = Timings.parse(measured.timings)
    # Filed under the load it ran at: one that started alone and was joined by three more
    # decoded at four streams' speed, and would otherwise drag down the one-stream estimate.
    ran_at = (
        route.level if measured.mean_load is None else load_level(int(measured.mean_load + 0.5))
    )
    outcome = Outcome.from_timings(
        backend,
        task or "",
        ran_at,
        timings,
        measured.ttft_s,
        measured.contended,
        agent=prompt.agent if prompt is not None else None,
    )
    if task == FIM_TASK:
        outcome = fim_outcome(outcome, timings)
    router = request.app[ROUTER]
    if task is not None and measured.status == 200 and measured.error in (None, CLIENT_GONE):
        router.record(outcome)
    if prompt is not None and route.placement is not None and measured.status == 200:
        router.prefixes.record(
            backend,
            prompt.prefix,
            route.placement,
            timings.prompt_n + timings.cache_n,
            route.slots,
            prompt.session,
        )
    requested = body.get("model")
    mapped = router.resolve_model(requested) if requested else None
    log.info(
        "request",
        request_id=request_id,
        endpoint=surface.endpoint,
        model=requested,
        # What an alias such as claude-* made of the name (the header X-Specproxy-Model too).
        model_mapped_to=mapped if mapped != requested else None,
        backend=backend,
        task=task,
        route=route.reason,
        # Not `level`: that key is the log line's severity.
        load_level=route.level if task is not None else None,
        mean_load=round(measured.mean_load, 2) if measured.mean_load is not None else None,
        status=499 if measured.error == CLIENT_GONE else measured.status,
        stream=bool(body.get("stream")),
        tokens=outcome.predicted_n if surface.generates else None,
        tokens_per_s=round(outcome.tokens_per_s, 1) if outcome.tokens_per_s else None,
        acceptance=round(outcome.draft_n_accepted / outcome.draft_n, 3)
        if outcome.draft_n
        else None,
        ttft_s=round(measured.ttft_s, 3) if measured.ttft_s is not None else None,
        prompt_tokens=timings.prompt_n + timings.cache_n if surface.generates else None,
        cached_tokens=timings.cache_n if surface.generates else None,
        # What the router took the backend to hold: beside cached_tokens, how well it knew.
        expected_cached_tokens=route.cached.tokens if surface.generates else None,
        slot=route.placement.slot if route.placement is not None else None,
        contended=measured.contended or None,
        duration_s=round(measured.duration_s, 3),
        device=seen.device,
        device_wait_s=round(measured.device_wait_s, 3),
        error=measured.error,
        **({"body": body} if request.app[SETTINGS].log_prompts else {}),
    )


@asynccontextmanager
async def _measuring_load(
    hold: AbstractAsyncContextManager[SlotUse], measured: Measurement
) -> AsyncIterator[SlotUse]:
    """Hold a slot and, however the hold ends, keep the mean load it saw in `measured`."""
    use: SlotUse | None = None
    try:
        async with hold as use:
            yield use
    finally:
        if use is not None:
            measured.mean_load = use.mean_load


@dataclass(frozen=True)
class _Fit:
    """The backends a request may go to, and the KV tokens it will hold on the one it takes."""

    backends: list[Backend]
    tokens: int
    prompt_tokens: int = 0


async def _backends_that_fit(
    app: web.Application, surface: Surface, body: dict[str, Any], body_bytes: int, model: str
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
    pinned = backends.get(model)
    if known and may_overflow(body_bytes, min(known)):
        ready = [b for b in pool if b.ready]
        counter = pinned if pinned is not None and pinned.ready else ready[0]
        counted = await count_prompt_tokens(app[SESSION], counter.base_url, surface.endpoint, body)
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
            return _Fit(room if pinned is None else pool, held, tokens)
        await asyncio.sleep(_ROOM_POLL_S)
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


def _choose(
    app: web.Application,
    model: str,
    task: str | None,
    fit: _Fit,
    prompt: _Prompt | None,
    budget: int | None,
) -> _Route:
    """The router's choice (by the whole request's cost for a task, else any ready backend),
    refusals as errors."""
    pool, router = app[POOL], app[ROUTER]
    held = {
        b.name: router.prefixes.cached(b.name, prompt.prefix, b.server_urls, prompt.session)
        if prompt is not None
        else Cached(0, None)
        for b in fit.backends
    }
    cost = RequestCost(
        prompt_tokens=fit.prompt_tokens,
        cached={name: c.tokens for name, c in held.items()},
        max_tokens=budget,
        quiet=app[CPU].quiet_now(),
        agent=prompt.agent if prompt is not None else None,
    )
    try:
        if task is None:
            backend, reason = router.choose_any(model, fit.backends, cost)
            return _Route(backend, reason, 0, held.get(backend.name, Cached(0, None)))
        backend, choice = router.choose(model, task, fit.backends, cost)
        return _Route(backend, choice.reason, choice.level, held[backend.name])
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


async def _serve(request: web.Request, surface: Surface, seen: RequestRecord) -> web.StreamResponse:
    """Validate, classify, choose, relay and log one request, filling in `seen` as it goes."""
    raw = await request.read()
    body = surface.check(_parse_json(raw))
    app = request.app
    router, pool, settings = app[ROUTER], app[POOL], app[SETTINGS]
    requested = body.get("model") or AUTO_MODEL
    model = router.resolve_model(requested)
    task: str | None = None
    if surface.generates:
        try:
            task = router.task_for(
                surface.view(body),
                model,
                request.headers.get("X-Specproxy-Task"),
                surface.fixed_task,
            )
        except ValueError as exc:
            raise ApiError(400, str(exc), code="invalid_task", param="X-Specproxy-Task") from None
    request_id = request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16]
    timeouts = RelayTimeouts(
        first_token_s=settings.first_token_timeout_s,
        idle_s=settings.idle_timeout_s,
        whole_answer_s=settings.request_timeout_s,
    )
    # The body as llama-server takes it (a client's shape adjusted), made once.
    shaped = surface.upstream(body)
    # Running timings in every streamed chunk: a stream its client abandons still measured
    # speed and acceptance up to that point, which the scoreboard and the metrics count.
    if not surface.generates:
        # A passthrough answers one JSON document; a `stream` flag would only confuse the relay.
        upstream_body = {k: v for k, v in shaped.items() if k != "stream"}
    elif body.get("stream"):
        upstream_body = {"timings_per_token": True, **shaped}
        if surface.stream_progress:
            upstream_body["return_progress"] = True
    else:
        upstream_body = shaped
    fit = await _backends_that_fit(app, surface, shaped, len(raw), model)
    prompt = (
        _Prompt(
            PromptPrefix.of(shaped),
            session_key(body, request.headers),
            agent=_agent_intent(surface.view(body)),
        )
        if surface.generates
        else None
    )
    budget = answer_budget(body)
    meter = app[CPU]
    # An unreachable backend received nothing, so an unpinned request may try one other.
    for attempt in (1, 2):
        route = _choose(app, model, task, fit, prompt, budget)
        supervisor = pool.get(route.backend.name)
        assert supervisor is not None
        device = supervisor.device.name
        seen.backend, seen.task, seen.route = route.backend.name, task or "", route.reason
        seen.device = device
        headers = {
            "X-Specproxy-Backend": route.backend.name,
            **({"X-Specproxy-Task": task} if task is not None else {}),
            "X-Specproxy-Route": route.reason,
            "X-Specproxy-Load-Level": str(route.level),
            "X-Request-Id": request_id,
            "X-Specproxy-Device": device,
        }
        if model != requested:
            headers["X-Specproxy-Model"] = model
        if "model" in upstream_body or surface.generates:
            upstream_body = {**upstream_body, "model": route.backend.name}
        # The metrics hold it from the start: a request cancelled mid-stream still counts
        # what it generated.
        measured = seen.measured = Measurement()
        finish = functools.partial(
            _finish, request, request_id, surface, body, task, route, prompt, measured, seen
        )
        target = ""  # the server the request went to: a replica of an external backend
        try:
            # A passthrough (tokenize, templates) decodes nothing: any server of the backend.
            unheld = SlotUse(base_url=supervisor.base_url, device=device)
            hold = (
                supervisor.slot(fit.tokens, route.cached.worth_following, surface.places_slot)
                if surface.uses_slot
                else nullcontext(unheld)
            )
            async with _measuring_load(hold, measured) as use:
                target = use.base_url
                route.placement = Placement(target, use.slot_id)
                route.slots = supervisor.limit
                sent = upstream_body
                if use.slot_id is not None:
                    # The slot the proxy knows holds the prompt's prefix, or a free one; and
                    # the cache explicitly on, whatever the server's default.
                    sent = {**upstream_body, "id_slot": use.slot_id, "cache_prompt": True}
                seen.device = use.device
                headers["X-Specproxy-Device"] = use.device
                headers["X-Specproxy-Device-Wait"] = f"{use.device_wait_s:.3f}"
                measured.device_wait_s = use.device_wait_s
                started = meter.snapshot()
                try:
                    response = await relay(
                        request,
                        app[SESSION],
                        route.backend.name,
                        target + surface.path,
                        sent,
                        headers,
                        timeouts,
                        measured,
                        surface.wire,
                    )
                except BaseException:
                    use.abandoned = True  # cancelled or failed: llama-server may still compute
                    raise
                finally:
                    measured.contended = meter.contended(started, meter.snapshot())
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
            if not measured.answered:
                measured.error = measured.error or CLIENT_GONE
            finish()
            raise
        except ApiError as exc:
            if exc.status == 502:
                supervisor.mark_down(target)
            # A pinned request may try again only on another replica of its backend.
            pinned_down = route.reason == "pinned" and not supervisor.ready
            if exc.code != "backend_unreachable" or pinned_down or attempt == 2:
                raise
    seen.status = measured.status
    finish()
    return response


async def list_models(request: web.Request) -> web.Response:
    """GET /v1/models: the routing ids, every backend by name and the exact model aliases."""
    created = int(time.time())
    pool = request.app[POOL]
    router = request.app[ROUTER]
    # Exact aliases too, for clients that check their model is listed; patterns are not ids.
    aliases = list(router.aliases.exact)
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
        # Tokens one request may hold (prompt and answer), as llama-server reports it.
        "n_ctx": b.n_ctx,
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
    board = request.app[ROUTER].scoreboard
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
            # The 90 % interval the router compares by, and whether only a busy machine
            # measured this cell.
            "interval": [round(x, 2) for x in est.interval(board.alpha)],
            "contended": est.contended,
        }
        for (backend, task, level), est in board.items()
    ]
    prompt = {
        name: round(rate.tokens_per_s, 1)
        for name in request.app[POOL].names
        if (rate := board.prompt_speed(name)) is not None
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
    if isinstance(backend, ExternalBackend):
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
    body = await app[METRICS].render(pool, pool.devices, app[SESSION])
    return web.Response(body=body, headers={"Content-Type": CONTENT_TYPE})


async def index(request: web.Request) -> web.Response:
    """GET / (and HEAD /, which Claude Code sends first): what this server is, where to go."""
    return web.json_response(
        {
            "service": "specproxy",
            "models": "/v1/models",
            "health": "/health",
            "metrics": "/metrics",
            "scoreboard": "/scoreboard",
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
    app.router.add_post("/admin/backends/{name}/restart", restart_backend)
