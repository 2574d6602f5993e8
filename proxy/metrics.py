"""Prometheus metrics: each finished request, plus router and backend state read at scrape time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Mapping, Sequence
from typing import Any, get_args

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import Metric

from proxy.backends.devices import Device
from proxy.backends.scrape import scrape_backend
from proxy.backends.strategy import Strategy
from proxy.collectors import BackendCollector, DraftLengthCollector, ScoreboardCollector, Scrape
from proxy.exchange import Exchange
from proxy.llamacpp import Timings
from proxy.routing.draft_length import DraftLengths
from proxy.routing.reasons import AutoReason
from proxy.routing.scoreboard import Scoreboard
from proxy.tasks import ROUTED_TASKS

# The classic text format: what Prometheus 2.x negotiates and every scraper reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Speeds from a 135M model on one CPU thread up to a small model on a data-centre GPU.
_TOKENS_PER_S_BUCKETS = (1, 2.5, 5, 10, 20, 30, 50, 75, 100, 150, 200, 300, 500, 1000, 2000)
# The proxy's own share of a request: tenths of a millisecond up to a slow classification.
_OWN_SECONDS_BUCKETS = (
    0.0001,
    0.00025,
    0.0005,
    0.001,
    0.0025,
    0.005,
    0.01,
    0.025,
    0.05,
    0.1,
    0.25,
    1.0,
)
_SECONDS_BUCKETS = (0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300)


class ProxyMetrics:
    """A registry of its own (one per app, so apps and tests never collide) and its instruments."""

    def __init__(
        self,
        spec_types: Mapping[str, str | None],
        scoreboard: Scoreboard,
        endpoint_tasks: Mapping[str, Sequence[str]],
        drafts: DraftLengths | None = None,
    ) -> None:
        """endpoint_tasks: each generating endpoint and the task classes its requests get."""
        self.registry = CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._spec_types = {name: spec or "none" for name, spec in spec_types.items()}
        self.registry.register(ScoreboardCollector(scoreboard))
        if drafts is not None:
            self.registry.register(DraftLengthCollector(drafts))
        per_backend = ["backend", "spec_type", "task"]
        r = self.registry
        self.requests = Counter(
            "specproxy_requests",
            "Finished requests by surface and outcome; backend is empty when none was chosen, "
            "task for passthroughs (tokenize, apply-template, ...)",
            ["endpoint", "backend", "spec_type", "task", "status"],
            registry=r,
        )
        self.route_decisions = Counter(
            "specproxy_route_decisions",
            "Strategy choices by the router's reason (pinned, fastest, unmeasured, explore, ...)",
            [*per_backend, "reason"],
            registry=r,
        )
        self.draft_lengths = Counter(
            "specproxy_draft_length_requests",
            "Auto requests by the longest draft the router chose for them (draft_n_max)",
            [*per_backend, "draft_n_max"],
            registry=r,
        )
        self.explorations = Counter(
            "specproxy_exploration_requests",
            "Auto requests sent to a backend other than the best, to keep measuring it",
            per_backend,
            registry=r,
        )
        self.tokens_per_s = Histogram(
            "specproxy_generation_tokens_per_second",
            "Generation speed of each request (llama.cpp timings.predicted_per_second)",
            per_backend,
            buckets=_TOKENS_PER_S_BUCKETS,
            registry=r,
        )
        self.ttft = Histogram(
            "specproxy_time_to_first_token_seconds",
            "Seconds from sending a streamed request upstream to its first byte back",
            per_backend,
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.duration = Histogram(
            "specproxy_request_duration_seconds",
            "Seconds from receiving a completion request to finishing its answer",
            per_backend,
            buckets=_SECONDS_BUCKETS,
            registry=r,
        )
        self.repaired_calls = Counter(
            "specproxy_repaired_tool_calls",
            "Tool calls the model wrote as text (a fenced or bare JSON call, <tools>, "
            "<tool_call>) that reached the client as calls",
            ["endpoint", "backend"],
            registry=r,
        )
        self.generated = Counter(
            "specproxy_generated_tokens",
            "Tokens generated (llama.cpp timings.predicted_n)",
            per_backend,
            registry=r,
        )
        self.prompt = Counter(
            "specproxy_prompt_tokens",
            "Prompt tokens evaluated, cache hits excluded (llama.cpp timings.prompt_n)",
            per_backend,
            registry=r,
        )
        self.cached = Counter(
            "specproxy_cached_prompt_tokens",
            "Prompt tokens served from the backend's prompt cache (llama.cpp timings.cache_n): "
            "what prompt-cache affinity saved",
            per_backend,
            registry=r,
        )
        self.drafted = Counter(
            "specproxy_draft_tokens",
            "Draft tokens proposed (llama.cpp timings.draft_n)",
            per_backend,
            registry=r,
        )
        self.accepted = Counter(
            "specproxy_draft_tokens_accepted",
            "Draft tokens the target model accepted (llama.cpp timings.draft_n_accepted)",
            per_backend,
            registry=r,
        )
        self.own_time = Histogram(
            "specproxy_proxy_overhead_seconds",
            "Seconds each request spent in the proxy itself: its whole time less the waits on "
            "others (the client's body, the backend, its device and slot, the client reading)",
            ["endpoint"],
            buckets=_OWN_SECONDS_BUCKETS,
            registry=r,
        )
        self.device_wait = Histogram(
            "specproxy_device_wait_seconds",
            "Seconds a request waited for its backend's device (0 when it started at once)",
            ["device", "backend"],
            buckets=(0.0, *_SECONDS_BUCKETS),
            registry=r,
        )
        # Every series a successful request touches exists from the start: rate() then counts a
        # label set's first request too, and dashboards show 0 rather than "no data".
        for name, spec in self._spec_types.items():
            for task in ROUTED_TASKS:
                labels = (name, spec, task)
                for metric in (
                    self.explorations,
                    self.tokens_per_s,
                    self.ttft,
                    self.duration,
                    self.generated,
                    self.prompt,
                    self.drafted,
                    self.accepted,
                ):
                    metric.labels(*labels)
                # What a request with a task class can carry: calibration's are not users'.
                for reason in ("pinned", *get_args(AutoReason)):
                    self.route_decisions.labels(*labels, reason)
            for endpoint, tasks in endpoint_tasks.items():
                self.own_time.labels(endpoint)
                for task in tasks:
                    self.requests.labels(endpoint, name, spec, task, "200")

    def _child(self, metric: Counter | Histogram, *labels: str) -> Any:
        """The metric's series for these labels, looked up once: prometheus_client's labels()
        takes a lock and validates every call, a good share of a request's own cost."""
        key = (id(metric), labels)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = metric.labels(*labels)
        return child

    def observe(self, exchange: Exchange) -> None:
        """Count one finished request; called exactly once per request, errors included."""
        route = exchange.route
        backend = route.backend.name if route is not None else ""
        task = exchange.task or ""
        spec = self._spec_types.get(backend, "") if backend else ""
        labels = (backend, spec, task)
        child = self._child
        now = time.monotonic()
        child(self.requests, exchange.endpoint, *labels, str(exchange.status)).inc()
        child(self.duration, *labels).observe(now - exchange.started)
        child(self.own_time, exchange.endpoint).observe(exchange.own_s(now))
        if route is None or not task:
            return
        child(self.route_decisions, *labels, route.reason).inc()
        if route.reason == "explore":
            child(self.explorations, *labels).inc()
        if route.draft_n_max is not None:
            child(self.draft_lengths, *labels, str(route.draft_n_max)).inc()
        upstream = exchange.measured
        if upstream is None:
            return
        if upstream.repaired_calls:
            child(self.repaired_calls, exchange.endpoint, backend).inc(upstream.repaired_calls)
        if upstream.ttft_s is not None:
            child(self.ttft, *labels).observe(upstream.ttft_s)
        admission = exchange.admission
        if admission is not None:
            child(self.device_wait, admission.device, backend).observe(admission.device_wait_s)
        timings = Timings.parse(upstream.timings)
        # Counted whatever the status: these are tokens the backend really processed, which is
        # what its own llamacpp:* counters count too.
        child(self.generated, *labels).inc(timings.predicted_n)
        child(self.prompt, *labels).inc(timings.prompt_n)
        child(self.cached, *labels).inc(timings.cache_n)
        child(self.drafted, *labels).inc(timings.draft_n)
        child(self.accepted, *labels).inc(timings.draft_n_accepted)
        if timings.tokens_per_s > 0:
            child(self.tokens_per_s, *labels).observe(timings.tokens_per_s)

    async def render(
        self,
        backends: Iterable[Strategy],
        devices: Mapping[str, Device],
        session: aiohttp.ClientSession,
    ) -> bytes:
        """The exposition text: this registry, the engines' and devices' state and each
        backend's own llama-server metrics (each replica's, for an external backend; an
        engine's, labelled with the engine, where backends share one process and its counters
        mix them)."""
        every = list(backends)
        targets = [
            (b.name, url, {"backend": b.name, **labels})
            for b in every
            if not b.shares
            for url, labels in b.engine.scrape_targets()
        ]
        shared = {b.engine.name: b.engine for b in every if b.shares}
        targets += [
            (name, url, {"engine": name, **labels})
            for name, e in shared.items()
            for url, labels in e.scrape_targets()
        ]
        upstream = await asyncio.gather(
            *(scrape_backend(url, labels, session) for _, url, labels in targets)
        )
        fetched: dict[str, list[list[Metric] | None]] = {}
        for (name, _, _), families in zip(targets, upstream, strict=True):
            fetched.setdefault(name, []).append(families)
        extra = BackendCollector(every, devices, fetched)
        return generate_latest(Scrape(self.registry, extra))
