"""The record step: what one finished request measured, into scoreboard, metrics and log."""

from __future__ import annotations

import time
from dataclasses import dataclass

from proxy.api.recent import RecentRequests
from proxy.backends.prompt_keeper import PromptKeepers
from proxy.exchange import Exchange
from proxy.llamacpp import Timings
from proxy.log import get_logger
from proxy.metrics import ProxyMetrics
from proxy.routing.router import Router
from proxy.routing.scoreboard import Outcome

log = get_logger("request")


@dataclass(frozen=True)
class Recorder:
    """The record step: feeds one finished request to everything that learns from it."""

    metrics: ProxyMetrics
    recent: RecentRequests
    router: Router
    keepers: PromptKeepers | None = None
    log_prompts: bool = False

    def record(self, exchange: Exchange) -> None:
        """Feed one finished request, errors included, to everything that learns from it; once."""
        if not exchange.background:  # the proxy's own requests are not users' traffic
            self.metrics.observe(exchange)
            self.recent.add(exchange, time.monotonic())
        outcome = self.router.record(exchange)
        if outcome is not None:  # else refused before any backend was chosen: metrics count it
            measured = exchange.measured
            assert measured is not None
            timings = Timings.parse(measured.timings)
            self._keep(exchange, timings)
            self._log(exchange, outcome, timings)

    def _keep(self, exchange: Exchange, timings: Timings) -> None:
        """Offer a finished request's prompt to its engine's keeper (kept across restarts)."""
        route, measured, prompt = exchange.route, exchange.measured, exchange.prompt
        if route is None or measured is None or prompt is None or measured.status != 200:
            return
        if self.keepers is not None:
            held = timings.prompt_n + timings.cache_n + timings.predicted_n
            self.keepers.offer(route.backend.engine.name, prompt.prefix, held)

    def _log(self, exchange: Exchange, outcome: Outcome, timings: Timings) -> None:
        """The request's one log line."""
        route, upstream, admission = exchange.route, exchange.measured, exchange.admission
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
            # The longest draft the router chose (None: the backend's own), and whether it was
            # a try of a neighbouring length.
            draft_n_max=route.draft_n_max,
            draft_explored=route.draft_explored or None,
            ttft_s=round(upstream.ttft_s, 3) if upstream.ttft_s is not None else None,
            prompt_tokens=timings.prompt_n + timings.cache_n if generates else None,
            cached_tokens=timings.cache_n if generates else None,
            # What the router took the backend to hold: beside cached_tokens, how well it knew.
            expected_cached_tokens=route.cached.tokens if generates else None,
            contended=exchange.contended or None,
            duration_s=round(upstream.duration_s, 3),
            device=admission.device if admission is not None else route.backend.engine.device.name,
            device_wait_s=round(admission.device_wait_s, 3) if admission is not None else 0.0,
            # Waiting for another request to compute the prompt's start, which this one reused.
            prefix_wait_s=round(exchange.prefix_wait_s, 3) or None,
            # Tool calls the model wrote as text, sent to the client as calls.
            repaired_tool_calls=upstream.repaired_calls or None,
            error=upstream.error,
            **({"body": exchange.body} if self.log_prompts else {}),
        )
