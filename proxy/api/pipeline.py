"""The request pipeline of every relayed surface: parse, classify, choose, admit, relay, record."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import Awaitable, Callable, Mapping
from contextlib import AbstractAsyncContextManager, nullcontext
from dataclasses import dataclass
from typing import Any

import aiohttp
from aiohttp import web

from proxy.api import speculation
from proxy.api.call_repair import CallRepair
from proxy.api.context_fit import BUDGET_KEYS, Fit, answer_budget, backends_that_fit
from proxy.api.errors import REQUEST_ID, ApiError
from proxy.api.progress import ProgressWatch
from proxy.api.record import Recorder
from proxy.api.relay import RelayTimeouts, UpstreamCall, UpstreamSessions, relay
from proxy.api.surfaces import Surface
from proxy.api.text_calls import ToolCatalog
from proxy.backends.contention import CpuMeter
from proxy.backends.engine import BackendSaturatedError, SlotUse
from proxy.backends.pool import BackendPool
from proxy.backends.strategy import Strategy
from proxy.exchange import Admitted, Exchange, Prompt, Route
from proxy.measurement import CLIENT_GONE, Measurement
from proxy.routing.agent_turns import session_intent
from proxy.routing.prefixes import Cached, PromptPrefix, session_key
from proxy.routing.router import NoBackendError, Router, UnknownModelError
from proxy.routing.scoreboard import load_level
from proxy.tasks import AUTO_MODEL, AUTO_TASK_MODELS, ROUTING_MODEL_IDS
from proxy.traffic import UserTraffic


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


def handler(surface: Surface) -> Callable[[web.Request], Awaitable[web.StreamResponse]]:
    """The aiohttp handler of one surface."""

    async def handle(request: web.Request) -> web.StreamResponse:
        return await request.app[PIPELINE].serve(request, surface)

    handle.__doc__ = f"POST {surface.path}."
    return handle


def _agent_intent(view: Mapping[str, Any]) -> str | None:
    """For an agent's turn (a request offering tools), what its session's first instruction asks."""
    messages = view.get("messages")
    if not view.get("tools") or not isinstance(messages, list):
        return None
    return session_intent(messages)


def _capped(
    surface: Surface, shaped: dict[str, Any], cap: int | None, default: int | None
) -> dict[str, Any]:
    """The body with no answer budget above `cap` (a larger one lowered), and one where it set
    none: `default`, or `cap` if lower."""
    given = {
        k: v
        for k, v in shaped.items()
        if k in BUDGET_KEYS and isinstance(v, int) and not isinstance(v, bool) and v > 0
    }
    if given:
        return shaped if cap is None else {**shaped, **{k: min(v, cap) for k, v in given.items()}}
    budgets = [b for b in (cap, default) if b is not None]
    return {**shaped, surface.budget_key: min(budgets)} if budgets else shaped


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


def _repair(surface: Surface, exchange: Exchange, backend: Strategy) -> CallRepair | None:
    """The repair of calls written as text, for a user's request declaring tools where its
    backend allows it."""
    if surface.calls is None or exchange.background or not backend.spec.config.repair_tool_calls:
        return None
    catalog = ToolCatalog.of(surface.calls, exchange.body)
    return CallRepair(catalog) if catalog is not None else None


def _headers(exchange: Exchange, route: Route) -> dict[str, str]:
    """The X-Specproxy-* headers that tell the client where its request went."""
    headers = {
        "X-Specproxy-Backend": route.backend.name,
        **({"X-Specproxy-Task": exchange.task} if exchange.task is not None else {}),
        "X-Specproxy-Route": route.reason,
        "X-Specproxy-Load-Level": str(route.level),
        "X-Request-Id": exchange.request_id,
        "X-Specproxy-Device": route.backend.engine.device.name,
    }
    if route.draft_n_max is not None:
        headers["X-Specproxy-Draft-N-Max"] = str(route.draft_n_max)
    if exchange.requested_model is not None and exchange.model != exchange.requested_model:
        headers["X-Specproxy-Model"] = exchange.model
    return headers


@dataclass(frozen=True)
class Pipeline:
    """The request path of every relayed surface and the collaborators it uses, built once."""

    router: Router
    pool: BackendPool
    sessions: UpstreamSessions
    # Where llama-server is asked to count a long prompt's tokens.
    counting: aiohttp.ClientSession
    timeouts: RelayTimeouts
    cpu: CpuMeter
    traffic: UserTraffic
    recorder: Recorder
    # Settings.max_answer_tokens: the most tokens one answer may have.
    max_answer_tokens: int | None = None
    # Settings.default_answer_tokens: the budget of a request that sets none.
    default_answer_tokens: int | None = None

    async def serve(self, request: web.Request, surface: Surface) -> web.StreamResponse:
        """Serve one request and record it exactly once, errors included."""
        exchange = Exchange(
            surface.endpoint,
            request.get(REQUEST_ID) or uuid.uuid4().hex[:16],
            generates=surface.generates,
        )
        try:
            with self.traffic.request():
                response = await self._serve(request, surface, exchange)
            measured = exchange.measured
            # A client that left before the end got no answer, however the relay returned.
            gone = measured is not None and measured.error == CLIENT_GONE and not exchange.answered
            exchange.status = 499 if gone else measured.status if measured is not None else 200
            return response
        except (ApiError, web.HTTPException) as exc:
            exchange.status = exc.status
            raise
        except asyncio.CancelledError:
            # "client closed request", as nginx counts it; unless it had the whole answer.
            measured = exchange.measured
            exchange.status = measured.status if measured is not None and exchange.answered else 499
            raise
        except Exception:
            exchange.status = 500
            raise
        finally:
            self.recorder.record(exchange)

    async def background(
        self, surface: Surface, backend: Strategy, task: str, body: dict[str, Any]
    ) -> Exchange:
        """One request of the proxy's own (calibration) on `backend`, whole: admitted behind
        users' requests, relayed with their timeouts and recorded as theirs are."""
        exchange = Exchange(surface.endpoint, f"background-{uuid.uuid4().hex[:8]}", background=True)
        exchange.body, exchange.model, exchange.pinned, exchange.task = (
            body,
            backend.name,
            backend,
            task,
        )
        shaped = _upstream_body(surface, body, surface.shape(body))
        exchange.route = Route(backend, "calibration", load_level(1), Cached(0, None))
        try:
            sent = {**shaped, **backend.speculation}
            await self._admit_and_relay(
                None, surface, exchange, exchange.route, Fit([backend], 0), sent
            )
            measured = exchange.measured
            exchange.status = measured.status if measured is not None else 200
        except ApiError as exc:
            exchange.status = exc.status
        finally:
            self.recorder.record(exchange)
        return exchange

    def _parse(self, surface: Surface, raw: bytes, exchange: Exchange) -> None:
        """Parse: the checked body and the model it names, an alias resolved."""
        exchange.body = surface.check(_parse_json(raw))
        exchange.requested_model = exchange.body.get("model")
        exchange.model = self.router.resolve_model(exchange.requested_model or AUTO_MODEL)
        exchange.pinned = self.pool.get(exchange.model)

    def _classify(
        self,
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
            exchange.task = self.router.task_for(
                view, exchange.model, headers.get("X-Specproxy-Task"), surface.fixed_task
            )
        except ValueError as exc:
            raise ApiError(400, str(exc), code="invalid_task", param="X-Specproxy-Task") from None
        exchange.prompt = Prompt(
            PromptPrefix.of(shaped), session_key(exchange.body, headers), agent=_agent_intent(view)
        )

    def _client_speculation(self, exchange: Exchange) -> dict[str, Any]:
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

    def _choose(self, exchange: Exchange, fit: Fit, budget: int | None) -> Route:
        """The router's choice (by the whole request's cost for a task, else any ready
        backend), refusals as errors."""
        try:
            return self.router.route(
                exchange, fit.backends, fit.prompt_tokens, budget, self.cpu.quiet_now()
            )
        except UnknownModelError:
            ids = ", ".join([AUTO_MODEL, *AUTO_TASK_MODELS, *self.pool.names])
            raise ApiError(
                404,
                f"model {exchange.model!r} does not exist; use one of: {ids} "
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

    async def _serve(
        self, request: web.Request, surface: Surface, exchange: Exchange
    ) -> web.StreamResponse:
        """parse → classify → choose → admit → relay; the record step reads `exchange` after."""
        reading = time.monotonic()
        raw = await request.read()
        exchange.body_wait_s = time.monotonic() - reading
        self._parse(surface, raw, exchange)
        # Refused before any wait for room: a bad setting is the client's to fix at once.
        client_speculation = self._client_speculation(exchange)
        # The body as llama-server takes it (a client's shape adjusted, its answer budget
        # capped), made once: the fit to a context and the route see the capped budget too.
        shaped = surface.shape(exchange.body)
        if surface.generates:
            shaped = _capped(surface, shaped, self.max_answer_tokens, self.default_answer_tokens)
        self._classify(surface, request.headers, shaped, exchange)
        fit = await backends_that_fit(
            self.pool, self.counting, surface, shaped, len(raw), exchange.pinned
        )
        exchange.fit_wait_s = fit.waited_s
        body = _upstream_body(surface, exchange.body, shaped)
        budget = answer_budget(body)
        # An unreachable backend received nothing, so an unpinned request may try one other.
        for attempt in (1, 2):
            route = exchange.route = self._choose(exchange, fit, budget)
            try:
                # A backend sharing its process says how its requests decode there.
                chosen = speculation.merged(
                    route.backend.speculation_at(route.draft_n_max), client_speculation
                )
                sent = {**body, **chosen} if surface.generates else body
                return await self._admit_and_relay(request, surface, exchange, route, fit, sent)
            except ApiError as exc:
                # A pinned request may try again only on another replica of its backend.
                pinned_down = exchange.pinned is not None and not route.backend.engine.ready
                if exc.code != "backend_unreachable" or pinned_down or attempt == 2:
                    raise
                # Never back to the server that failed, whatever its health check says by now.
                failed = exchange.failed_server
                fit = fit.without(failed) if failed is not None else fit
                if not fit.backends:
                    raise
        raise AssertionError("unreachable")

    async def _admit_and_relay(
        self,
        request: web.Request | None,
        surface: Surface,
        exchange: Exchange,
        route: Route,
        fit: Fit,
        body: dict[str, Any],
    ) -> web.StreamResponse:
        """Admit: hold the backend's device and slot; relay: send the request, relay its answer."""
        backend = route.backend
        engine = backend.engine
        headers = _headers(exchange, route)
        if "model" in body or surface.generates:
            body = {**body, "model": backend.name}
        # The metrics hold it from the start: a request cancelled mid-stream still counts what
        # it generated.
        exchange.retry()
        measured = exchange.measured = Measurement()
        hold: AbstractAsyncContextManager[SlotUse]
        if surface.uses_slot:
            hold = backend.slot(
                fit.tokens,
                route.cached.worth_following,
                lambda: measured.settled,
                background=exchange.background,
            )
        else:
            # A passthrough (tokenize, templates) decodes nothing: any server of the backend.
            hold = nullcontext(SlotUse(base_url=engine.base_url, device=engine.device.name))
        use: SlotUse | None = None
        target = ""  # the server the request went to: a replica of an external backend
        shares = surface.uses_slot and not exchange.background
        computing = (
            self.router.computing(exchange, fit.prompt_tokens) if shares else nullcontext(0.0)
        )
        try:
            async with computing as prefix_wait_s:
                exchange.prefix_wait_s += prefix_wait_s
                asked = time.monotonic()
                async with hold as use:
                    admit_wait_s = time.monotonic() - asked
                    exchange.admit_wait_s += admit_wait_s
                    # A seat (a free slot, room in a shared KV cache) and the device: the wait
                    # for both, where Device-Wait is the device's alone.
                    headers["X-Specproxy-Admit-Wait"] = f"{admit_wait_s:.3f}"
                    admission = exchange.admission = Admitted.of(use, engine.limit)
                    target = admission.placement.url
                    headers["X-Specproxy-Device"] = admission.device
                    headers["X-Specproxy-Device-Wait"] = f"{admission.device_wait_s:.3f}"
                    call = UpstreamCall(
                        target + surface.path,
                        backend.name,
                        body,
                        headers,
                        self.timeouts,
                        surface.wire,
                        reuse=backend.spec.our_build,
                        repair=_repair(surface, exchange, backend),
                        watch=ProgressWatch(self.counting, target),
                    )
                    started = self.cpu.snapshot()
                    try:
                        return await relay(request, self.sessions, call, measured)
                    finally:
                        exchange.contended = self.cpu.contended(started, self.cpu.snapshot())
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
            # Only a lost connection says the server may be gone, and only until its health
            # check says otherwise; a bad answer is this request's failure alone.
            if measured.connection_lost:
                exchange.failed_server = target
                engine.mark_down(target)


PIPELINE = web.AppKey("pipeline", Pipeline)
