"""Prometheus collectors read at scrape time: the router's estimates, the backends' and
devices' state, and each backend's own metrics."""

from __future__ import annotations

from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass

from prometheus_client import CollectorRegistry
from prometheus_client.metrics_core import CounterMetricFamily, GaugeMetricFamily, Metric

from proxy.backends.devices import Device
from proxy.backends.strategy import Strategy
from proxy.routing.draft_length import DraftLengths
from proxy.routing.scoreboard import Scoreboard


class ScoreboardCollector:
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


class DraftLengthCollector:
    """The draft lengths the router measured: each cell's best, and each length's speed."""

    def __init__(self, drafts: DraftLengths) -> None:
        self.drafts = drafts

    def collect(self) -> Iterator[Metric]:
        labels = ["backend", "task", "level"]
        best = GaugeMetricFamily(
            "specproxy_router_draft_n_max",
            "The longest draft auto sends now: the length measured fastest per strategy, class "
            "and load level",
            labels=labels,
        )
        speed = GaugeMetricFamily(
            "specproxy_router_draft_length_tokens_per_second",
            "Decayed decode speed measured at each draft length",
            labels=[*labels, "draft_n_max"],
        )
        for cell in self.drafts.cells():
            key = [cell.backend, cell.task, str(cell.level)]
            best.add_metric(key, cell.best)
            for n, arm in cell.arms.items():
                speed.add_metric([*key, str(n)], arm.tokens_per_s)
        yield from (best, speed)


class BackendCollector:
    """Supervisor state and the backends' re-exported families, for one scrape."""

    def __init__(
        self,
        backends: Sequence[Strategy],
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
            for r in b.engine.replicas:
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
            up.add_metric(key, 1 if b.engine.ready else 0)
            in_flight.add_metric(key, b.in_flight)
            limit.add_metric(key, b.engine.limit)
            queued.add_metric(key, b.engine.queued)
            queue_limit.add_metric(key, b.engine.max_queue)
            restarts.add_metric(key, b.engine.restarts)
            failed.add_metric(key, b.engine.failed_health_checks)
            results = self.fetched.get(b.engine.name) or [None]
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
class Scrape:
    """The app's registry and one scrape's collector, rendered as one exposition."""

    registry: CollectorRegistry
    extra: BackendCollector

    def collect(self) -> Iterator[Metric]:
        for family in self.registry.collect():
            # prometheus_client's *_created samples would double the series; no query uses them.
            family.samples = [s for s in family.samples if not s.name.endswith("_created")]
            yield family
        yield from self.extra.collect()
