"""The record step: what one finished request measured, into scoreboard, metrics and log."""

from __future__ import annotations

import time

from aiohttp import web

from proxy.api.state import METRICS, RECENT, ROUTER, SETTINGS
from proxy.exchange import Exchange
from proxy.llamacpp import Timings
from proxy.log import get_logger
from proxy.measurement import CLIENT_GONE
from proxy.routing.router import fim_outcome
from proxy.routing.scoreboard import Outcome, load_level
from proxy.tasks import FIM_TASK

log = get_logger("request")
_MEASURED = (None, CLIENT_GONE)


def record(app: web.Application, exchange: Exchange) -> None:
    """Feed one finished request, errors included, to everything that learns from it; once."""
    app[METRICS].observe(exchange)
    app[RECENT].add(exchange, time.monotonic())
    route, upstream = exchange.route, exchange.upstream
    if route is None or upstream is None:
        return  # refused before any backend was chosen: the metrics count it
    router = app[ROUTER]
    timings = Timings.parse(upstream.timings)
    # Filed under the load it ran at: one that started alone and was joined by three more
    # decoded at four streams' speed, and would otherwise drag down the one-stream estimate.
    mean = exchange.mean_load
    ran_at = route.level if mean is None else load_level(int(mean + 0.5))
    prompt = exchange.prompt
    outcome = Outcome.from_timings(
        route.backend.name,
        exchange.task or "",
        ran_at,
        timings,
        upstream.ttft_s,
        exchange.contended,
        agent=prompt.agent if prompt is not None else None,
    )
    if exchange.task == FIM_TASK:
        outcome = fim_outcome(outcome, timings)
    # A stream its client left still measured its speed up to there.
    measured = upstream.status == 200 and upstream.error in _MEASURED
    if exchange.task is not None and measured and not exchange.client_speculation:
        router.record(outcome)
    admission = exchange.admission
    if prompt is not None and admission is not None and upstream.status == 200:
        router.prefixes.record(
            route.backend.engine,
            prompt.prefix,
            admission.placement,
            timings.prompt_n + timings.cache_n,
            admission.slots,
            prompt.session,
        )
    _log(app, exchange, outcome, timings)


def _log(app: web.Application, exchange: Exchange, outcome: Outcome, timings: Timings) -> None:
    """The request's one log line."""
    route, upstream, admission = exchange.route, exchange.upstream, exchange.admission
    assert route is not None and upstream is not None
    generates = exchange.generates
    mapped = exchange.model
    requested = exchange.requested_model
    log.info(
        "request",
        request_id=exchange.request_id,
        endpoint=exchange.endpoint,
        model=requested,
        # What an alias such as claude-* made of the name (the header X-Specproxy-Model too).
        model_mapped_to=mapped if requested and mapped != requested else None,
        backend=route.backend.name,
        task=exchange.task,
        route=route.reason,
        # Not `level`: that key is the log line's severity.
        load_level=route.level if exchange.task is not None else None,
        mean_load=round(exchange.mean_load, 2) if exchange.mean_load is not None else None,
        status=exchange.status,
        stream=bool(exchange.body.get("stream")),
        tokens=outcome.predicted_n if generates else None,
        tokens_per_s=round(outcome.tokens_per_s, 1) if outcome.tokens_per_s else None,
        acceptance=round(outcome.draft_n_accepted / outcome.draft_n, 3)
        if outcome.draft_n
        else None,
        ttft_s=round(upstream.ttft_s, 3) if upstream.ttft_s is not None else None,
        prompt_tokens=timings.prompt_n + timings.cache_n if generates else None,
        cached_tokens=timings.cache_n if generates else None,
        # What the router took the backend to hold: beside cached_tokens, how well it knew.
        expected_cached_tokens=route.cached.tokens if generates else None,
        contended=exchange.contended or None,
        duration_s=round(upstream.duration_s, 3),
        device=admission.device if admission is not None else route.backend.device.name,
        device_wait_s=round(admission.device_wait_s, 3) if admission is not None else 0.0,
        error=upstream.error,
        **({"body": exchange.body} if app[SETTINGS].log_prompts else {}),
    )
