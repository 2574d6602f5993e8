"""Prometheus metrics: each finished request, plus router and backend state read at scrape time."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, get_args

import aiohttp
from prometheus_client import CollectorRegistry, Counter, Histogram, generate_latest
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.parser import text_string_to_metric_families
from prometheus_client.samples import Sample

from proxy.backends.backend import Backend
from proxy.backends.devices import Device
from proxy.exchange import Exchange
from proxy.llamacpp import METRIC_PREFIX, Timings
from proxy.log import get_logger
from proxy.routing.ranking import RouteReason
from proxy.routing.scoreboard import Scoreboard
from proxy.tasks import ROUTED_TASKS

# The classic text format: what Prometheus 2.x negotiates and every scraper reads.
CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"
# Well inside Prometheus' scrape timeout, so one stuck backend costs its own series, not the scrape.
_BACKEND_TIMEOUT_S = 1.0
_REEXPORT_PREFIX = "llamacpp_"
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
log = get_logger("metrics")


class ProxyMetrics:
    """A registry of its own (one per app, so apps and tests never collide) and its instruments."""

    def __init__(
        self,
        spec_types: Mapping[str, str | None],
        scoreboard: Scoreboard,
        endpoint_tasks: Mapping[str, Sequence[str]],
    ) -> None:
        """endpoint_tasks: each generating endpoint and the task classes its requests get."""
        self.registry = CollectorRegistry()
        self._children: dict[tuple[int, tuple[str, ...]], Any] = {}
        self._spec_types = {name: spec or "none" for name, spec in spec_types.items()}
        self.registry.register(_ScoreboardCollector(scoreboard))
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
            "Backend choices by the router's reason (pinned, fastest, unmeasured, explore, ...)",
            [*per_backend, "reason"],
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
                for reason in get_args(RouteReason):
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
        upstream = exchange.upstream
        if upstream is None:
            return
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
        backends: Iterable[Backend],
        devices: Mapping[str, Device],
        session: aiohttp.ClientSession,
        engines: Iterable[Backend] = (),
    ) -> bytes:
        """The exposition text: this registry, the supervisors' and devices' state and each
        backend's own (each replica's, for an external backend; an engine's, labelled with the
        engine, where backends share one process and its counters mix them)."""
        every = list(backends)
        targets = [
            (b.name, url, {"backend": b.name, **labels})
            for b in every
            for url, labels in b.scrape_targets()
        ]
        targets += [
            (e.name, url, {"engine": e.name, **labels})
            for e in engines
            for url, labels in e.scrape_targets()
        ]
        upstream = await asyncio.gather(
            *(_scrape_backend(url, labels, session) for _, url, labels in targets)
        )
        fetched: dict[str, list[list[Metric] | None]] = {}
        for (name, _, _), families in zip(targets, upstream, strict=True):
            fetched.setdefault(name, []).append(families)
        extra = _BackendCollector(every, devices, fetched)
        return generate_latest(_Scrape(self.registry, extra))


async def _scrape_backend(
    url: str, labels: Mapping[str, str], session: aiohttp.ClientSession
) -> list[Metric] | None:
    """A server's llamacpp:* families renamed and given `labels`; None if it did not answer."""
    try:
        async with session.get(
            f"{url}/metrics",
            timeout=aiohttp.ClientTimeout(total=_BACKEND_TIMEOUT_S),
        ) as resp:
            if resp.status != 200:
                # An external llama-server started without --metrics answers 501.
                log.debug("backend metrics unavailable", url=url, status=resp.status)
                return None
            text = await resp.text()
        families = list(text_string_to_metric_families(text))
    except (aiohttp.ClientError, TimeoutError, ValueError) as exc:
        log.debug("backend metrics failed", url=url, error=str(exc))
        return None
    return [_relabel(family, labels) for family in families]


def _relabel(family: Metric, labels: Mapping[str, str]) -> Metric:
    # "llamacpp:" is legal in Prometheus but reserved for recording rules; "llamacpp_" keeps the
    # rest of the name.  The parser already gives counters their "_total" suffix, so llama.cpp's
    # n_tokens_max (declared a counter) arrives as llamacpp_n_tokens_max_total.
    renamed = Metric(_rename(family.name), family.documentation, family.type)
    renamed.samples = [
        Sample(_rename(s.name), {**s.labels, **labels}, s.value, s.timestamp)
        for s in family.samples
    ]
    return renamed


def _rename(name: str) -> str:
    return _REEXPORT_PREFIX + name.removeprefix(METRIC_PREFIX)


class _ScoreboardCollector:
    """The router's current estimates, read from the scoreboard at scrape time."""

    def __init__(self, scoreboard: Scoreboard) -> None:
        self.scoreboard = scoreboard

    def collect(self) -> Iterator[Metric]:
        labels = ["backend", "task", "level"]
        speed = GaugeMetricFamily(
            "specproxy_router_tokens_per_second",
            "The router's decayed estimate of generation speed",
            labels=labels,
        )
        acceptance = GaugeMetricFamily(
            "specproxy_router_acceptance",
            "The router's decayed estimate of draft acceptance (speculative backends only)",
            labels=labels,
        )
        samples = GaugeMetricFamily(
            "specproxy_router_samples",
            "Measurements folded into the router's estimate",
            labels=labels,
        )
        for (backend, task, level), est in self.scoreboard.items():
            key = [backend, task, str(level)]
            speed.add_metric(key, est.tokens_per_s)
            samples.add_metric(key, est.samples)
            if est.acceptance is not None:
                acceptance.add_metric(key, est.acceptance)
        yield from (speed, acceptance, samples)


class _BackendCollector:
    """Supervisor state and the backends' re-exported families, for one scrape."""

    def __init__(
        self,
        backends: Sequence[Backend],
        devices: Mapping[str, Device],
        fetched: Mapping[str, list[list[Metric] | None]],
    ) -> None:
        self.backends = backends
        self.devices = devices
        self.fetched = fetched

    def _replicas(self) -> Iterator[Metric]:
        labels = ["backend", "replica"]
        up = GaugeMetricFamily(
            "specproxy_replica_up",
            "1 when the external backend's replica takes requests, else 0",
            labels=labels,
        )
        in_flight = GaugeMetricFamily(
            "specproxy_replica_in_flight_requests",
            "Requests this proxy has open on the replica",
            labels=labels,
        )
        reported = GaugeMetricFamily(
            "specproxy_replica_reported_requests",
            "Requests the replica said it held at its last poll, every proxy's together",
            labels=labels,
        )
        load = GaugeMetricFamily(
            "specproxy_replica_load",
            "Requests on the replica as routing counts them: this proxy's plus other proxies'",
            labels=labels,
        )
        failed = CounterMetricFamily(
            "specproxy_replica_failed_health_checks",
            "Health checks the replica failed after it first answered",
            labels=labels,
        )
        for b in self.backends:
            for r in b.replicas:
                key = [b.name, r.url]
                up.add_metric(key, 1 if r.ready else 0)
                in_flight.add_metric(key, r.in_flight)
                if r.reported is not None:
                    reported.add_metric(key, r.reported)
                load.add_metric(key, r.load)
                failed.add_metric(key, r.failed_health_checks)
        yield from (up, in_flight, reported, load, failed)

    def _devices(self) -> Iterator[Metric]:
        capacity = GaugeMetricFamily(
            "specproxy_device_capacity",
            "What may decode at once on the device: threads (cpu) or llama-server processes",
            labels=["device"],
        )
        in_use = GaugeMetricFamily(
            "specproxy_device_in_use",
            "Capacity taken by the backends decoding on the device now",
            labels=["device"],
        )
        waiting = GaugeMetricFamily(
            "specproxy_device_waiting_requests",
            "Requests waiting for the device (another backend decodes there)",
            labels=["device"],
        )
        busy = CounterMetricFamily(
            "specproxy_device_busy_seconds",
            "Seconds during which some backend decoded on the device",
            labels=["device"],
        )
        for name, device in self.devices.items():
            state = device.state()
            capacity.add_metric([name], state.capacity)
            in_use.add_metric([name], state.in_use)
            waiting.add_metric([name], state.waiting)
            busy.add_metric([name], state.busy_s)
        yield from (capacity, in_use, waiting, busy)

    def collect(self) -> Iterator[Metric]:
        labels = ["backend", "spec_type"]
        up = GaugeMetricFamily(
            "specproxy_backend_up", "1 when the backend takes requests, else 0", labels=labels
        )
        in_flight = GaugeMetricFamily(
            "specproxy_in_flight_requests",
            "Requests the proxy has open on the backend",
            labels=labels,
        )
        limit = GaugeMetricFamily(
            "specproxy_backend_concurrency_limit",
            "Requests the proxy sends the backend at once; more wait in its queue",
            labels=labels,
        )
        queued = GaugeMetricFamily(
            "specproxy_backend_queued_requests",
            "Requests waiting for a free slot (beyond max_queue they get 429)",
            labels=labels,
        )
        queue_limit = GaugeMetricFamily(
            "specproxy_backend_queue_limit", "Longest allowed queue (max_queue)", labels=labels
        )
        restarts = CounterMetricFamily(
            "specproxy_backend_restarts",
            "Times the supervisor restarted the backend's llama-server",
            labels=labels,
        )
        failed = CounterMetricFamily(
            "specproxy_backend_failed_health_checks",
            "Health checks the backend failed while it was running",
            labels=labels,
        )
        scraped = GaugeMetricFamily(
            "specproxy_backend_metrics_scrape_ok",
            "1 when this scrape re-exported the backend's own llamacpp_* metrics, else 0",
            labels=["backend"],
        )
        for b in self.backends:
            key = [b.name, b.spec_type or "none"]
            up.add_metric(key, 1 if b.ready else 0)
            in_flight.add_metric(key, b.in_flight)
            limit.add_metric(key, b.limit)
            queued.add_metric(key, b.queued)
            queue_limit.add_metric(key, b.max_queue)
            restarts.add_metric(key, b.restarts)
            failed.add_metric(key, b.failed_health_checks)
            results = self.fetched.get(b.engine) or [None]
            scraped.add_metric([b.name], 1 if all(r is not None for r in results) else 0)
        yield from (up, in_flight, limit, queued, queue_limit, restarts, failed, scraped)
        yield from self._replicas()
        yield from self._devices()
        # Every backend exposes the same families: merge them so each name appears once.
        merged: dict[str, Metric] = {}
        for results in self.fetched.values():
            for families in results:
                for family in families or []:
                    into = merged.setdefault(
                        family.name, Metric(family.name, family.documentation, family.type)
                    )
                    into.samples.extend(family.samples)
        yield from merged.values()


@dataclass(frozen=True)
class _Scrape:
    """The app's registry and one scrape's collector, rendered as one exposition."""

    registry: CollectorRegistry
    extra: _BackendCollector

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            # prometheus_client's *_created samples would double the series; no query uses them.
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family
        yield from self.extra.collect()
