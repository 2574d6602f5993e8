"""Observability: GET /metrics, a real Prometheus scraping it, the dashboard's queries, the log."""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import time
import urllib.parse
import urllib.request
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import openai
import pytest
import yaml
from openai.types.chat import ChatCompletionMessageParam
from prometheus_client.parser import text_string_to_metric_families

from tests.helpers import ROOT, free_port, wait_for
from tests.proxy_metrics import scrape, wait_quiet
from tests.subprocess_proxy import RunningProxy

DEPLOY = ROOT / "deploy"
GRAFANA = DEPLOY / "grafana"
DASHBOARD = GRAFANA / "dashboards" / "specproxy.json"
BACKENDS = ("plain", "draft", "ngram")
TASKS = ("code", "prose", "echo")
REPEAT: list[ChatCompletionMessageParam] = [
    {"role": "user", "content": "Write the word 'hello' twenty times separated by spaces."}
]
# A pattern even a 135M model continues verbatim, so the n-gram backend drafts on it too.
PATTERN = "1, 2, 3, " * 12
DOCUMENTED = {
    "specproxy_requests",
    "specproxy_proxy_overhead_seconds",
    "specproxy_route_decisions",
    "specproxy_exploration_requests",
    "specproxy_generation_tokens_per_second",
    "specproxy_time_to_first_token_seconds",
    "specproxy_request_duration_seconds",
    "specproxy_generated_tokens",
    "specproxy_prompt_tokens",
    "specproxy_draft_tokens",
    "specproxy_draft_tokens_accepted",
    "specproxy_router_tokens_per_second",
    "specproxy_router_acceptance",
    "specproxy_router_samples",
    "specproxy_backend_up",
    "specproxy_in_flight_requests",
    "specproxy_backend_concurrency_limit",
    "specproxy_backend_queued_requests",
    "specproxy_backend_queue_limit",
    "specproxy_backend_restarts",
    "specproxy_backend_failed_health_checks",
    "specproxy_backend_metrics_scrape_ok",
    "llamacpp_tokens_predicted",
    "llamacpp_prompt_tokens",
    "llamacpp_spec_decode_num_draft_tokens",
    "llamacpp_spec_decode_num_accepted_tokens",
    "llamacpp_requests_processing",
}
# What the proxy counts per request, and the backend's own counter that must agree with it.
COUNTER_PAIRS = (
    ("specproxy_generated_tokens_total", "llamacpp_tokens_predicted_total"),
    ("specproxy_draft_tokens_total", "llamacpp_spec_decode_num_draft_tokens_total"),
    ("specproxy_draft_tokens_accepted_total", "llamacpp_spec_decode_num_accepted_tokens_total"),
)


def _binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(
            f"{name} is not installed; run ./scripts/system-deps.sh test (`make test` does)"
        )
    return path


@dataclass
class RunningPrometheus:
    """A real Prometheus server scraping the test proxy every second."""

    process: subprocess.Popen[bytes]
    url: str
    log_path: Path

    def query(self, expr: str, at: float | None = None) -> list[dict[str, Any]]:
        """An instant query's result vector (at `at`, a Unix time, or now)."""
        params = {"query": expr, **({"time": f"{at:.3f}"} if at is not None else {})}
        url = f"{self.url}/api/v1/query?{urllib.parse.urlencode(params)}"
        with urllib.request.urlopen(url, timeout=10) as resp:
            body = json.load(resp)
        assert body["status"] == "success", body
        result: list[dict[str, Any]] = body["data"]["result"]
        return result

    def value(self, expr: str, at: float) -> float:
        """A one-element vector's value at `at`."""
        (result,) = self.query(expr, at)
        return float(result["value"][1])

    def increase_by_backend(self, counter: str, window: Window) -> dict[str, float]:
        """How much `counter` grew over the window on each backend, read from stored scrapes."""
        before, after = (
            {
                r["metric"]["backend"]: float(r["value"][1])
                for r in self.query(f"sum by (backend) ({counter})", at)
            }
            for at in (window.before, window.after)
        )
        return {b: after.get(b, 0.0) - before.get(b, 0.0) for b in BACKENDS}

    def next_scrape(self, after: float, timeout: float = 30) -> float:
        """The time of the first successful scrape of the proxy that began after `after`."""
        found: list[float] = []

        def scraped() -> bool:
            for r in self.query('timestamp(up{job="specproxy"})'):
                at = float(r["value"][1])
                if at > after and self.query('up{job="specproxy"}', at)[0]["value"][1] == "1":
                    found.append(at)
                    return True
            return False

        wait_for(scraped, timeout, "a fresh scrape of the proxy", interval=0.2)
        return found[0]

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@pytest.fixture(scope="module")
def prometheus(
    proxy: RunningProxy, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[RunningPrometheus]:
    """deploy/prometheus.yml, made to scrape the test proxy every second, on a free port."""
    binary = _binary("prometheus")
    workdir = tmp_path_factory.mktemp("prometheus")
    config = yaml.safe_load((DEPLOY / "prometheus.yml").read_text())
    config["global"].update(scrape_interval="1s", scrape_timeout="1s")
    config["scrape_configs"][0]["static_configs"] = [{"targets": [f"127.0.0.1:{proxy.port}"]}]
    config_path = workdir / "prometheus.yml"
    config_path.write_text(yaml.safe_dump(config))
    port = free_port()
    log_path = workdir / "prometheus.log"
    with log_path.open("w") as log_file:
        process = subprocess.Popen(
            [
                binary,
                f"--config.file={config_path}",
                f"--storage.tsdb.path={workdir / 'data'}",
                f"--web.listen-address=127.0.0.1:{port}",
            ],
            stdout=log_file,
            stderr=subprocess.STDOUT,
        )
    running = RunningPrometheus(process, f"http://127.0.0.1:{port}", log_path)

    def ready() -> bool:
        if process.poll() is not None:
            raise RuntimeError(f"prometheus exited:\n{log_path.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(f"{running.url}/-/ready", timeout=2) as resp:
                return bool(resp.status == 200)
        except OSError:
            return False

    try:
        wait_for(ready, 30, "prometheus to be ready", interval=0.2)
        yield running
    finally:
        running.stop()


@dataclass(frozen=True)
class Window:
    """Two scrapes with only this module's requests between them, and how many it sent."""

    before: float
    after: float
    requests: int


@pytest.fixture(scope="module")
def traffic(proxy: RunningProxy, prometheus: RunningPrometheus, client: openai.OpenAI) -> Window:
    """Pinned, auto, streamed, legacy and failing requests, between two quiet scrapes.

    The session proxy is shared and its backends also serve start-up calibration that bypasses
    the proxy's request counters, so counters are compared as deltas over this window only.
    """
    wait_quiet(proxy)
    before = prometheus.next_scrape(after=time.time())
    sent = 0
    for backend in BACKENDS:
        client.chat.completions.create(model=backend, messages=REPEAT, max_tokens=48, temperature=0)
        stream = client.chat.completions.create(
            model=backend,
            messages=REPEAT,
            max_tokens=48,
            temperature=0,
            stream=True,
            stream_options={"include_usage": True},
        )
        assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
        client.completions.create(
            model=backend,
            prompt=PATTERN,
            max_tokens=48,
            temperature=0,
            extra_body={"ignore_eos": True},
        )
        sent += 3
    for task in TASKS:
        client.chat.completions.create(
            model=f"auto-{task}", messages=REPEAT, max_tokens=24, temperature=0
        )
        sent += 1
    legacy = client.completions.create(
        model="plain", prompt="hello hello hello hello", max_tokens=16, stream=True
    )
    assert "".join(c.choices[0].text for c in legacy if c.choices)
    sent += 1
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=REPEAT)
    sent += 1
    wait_quiet(proxy)
    after = prometheus.next_scrape(after=time.time())
    return Window(before, after, sent)


def test_prometheus_config_is_valid() -> None:
    result = subprocess.run(
        [_binary("promtool"), "check", "config", str(DEPLOY / "prometheus.yml")],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 0, result.stdout + result.stderr


def test_metrics_endpoint_has_the_documented_families(proxy: RunningProxy) -> None:
    with urllib.request.urlopen(f"{proxy.url}/metrics", timeout=10) as resp:
        assert resp.headers["Content-Type"].startswith("text/plain; version=0.0.4")
        text = resp.read().decode()
    families = {f.name: f for f in text_string_to_metric_families(text)}
    assert families.keys() >= DOCUMENTED, sorted(DOCUMENTED - families.keys())
    assert "llamacpp:" not in text
    for name in ("llamacpp_tokens_predicted", "specproxy_backend_up"):
        assert {s.labels["backend"] for s in families[name].samples} == set(BACKENDS)


def test_every_request_is_counted_once_with_its_status(
    proxy: RunningProxy, client: openai.OpenAI
) -> None:
    wait_quiet(proxy)
    before = scrape(proxy)
    client.chat.completions.create(model="plain", messages=REPEAT, max_tokens=4)
    with pytest.raises(openai.NotFoundError):
        client.chat.completions.create(model="no-such-model", messages=REPEAT)
    with pytest.raises(openai.BadRequestError):
        client.chat.completions.create(model="plain", messages=[])
    after = scrape(proxy)

    def delta(key: str) -> float:
        return after.get(key, 0) - before.get(key, 0)

    assert delta("specproxy_requests_total") == 3
    assert delta("specproxy_requests_total{status=200}") == 1
    assert delta("specproxy_requests_total{status=404}") == 1
    assert delta("specproxy_requests_total{status=400}") == 1
    assert delta("specproxy_route_decisions_total{reason=pinned}") == 1
    assert delta("specproxy_request_duration_seconds_count") == 3


def test_proxy_counters_agree_with_the_backends_own(
    prometheus: RunningPrometheus, traffic: Window
) -> None:
    total = "sum(specproxy_requests_total)"
    counted = prometheus.value(total, traffic.after) - prometheus.value(total, traffic.before)
    assert counted == traffic.requests
    for ours, theirs in COUNTER_PAIRS:
        proxy_says = prometheus.increase_by_backend(ours, traffic)
        backend_says = prometheus.increase_by_backend(theirs, traffic)
        print(f"{ours}: proxy {proxy_says}, {theirs}: {backend_says}")
        for b in BACKENDS:
            assert proxy_says[b] == pytest.approx(backend_says[b], rel=0.01), (ours, b)
        # Non-trivial agreement: tokens on every backend, drafts on both speculative ones.
        must_move = BACKENDS if ours == "specproxy_generated_tokens_total" else ("draft", "ngram")
        assert all(proxy_says[b] > 0 for b in must_move), (ours, proxy_says)


def _dashboard_queries() -> list[str]:
    dashboard = json.loads(DASHBOARD.read_text())
    return [t["expr"] for p in dashboard["panels"] for t in p.get("targets", [])]


def test_every_dashboard_query_returns_data(prometheus: RunningPrometheus, traffic: Window) -> None:
    # Grafana fills $__rate_interval in; a window that reaches back over the module's requests.
    pending = {q: q.replace("$__rate_interval", "5m") for q in _dashboard_queries()}
    assert len(pending) >= 10

    def answered() -> bool:
        for query, promql in list(pending.items()):
            values = [float(r["value"][1]) for r in prometheus.query(promql)]
            if any(math.isfinite(v) for v in values):
                del pending[query]
        return not pending

    wait_for(answered, 30, lambda: "data for every query; none for:\n" + "\n".join(pending), 0.2)


def test_grafana_provisioning_matches_the_dashboard() -> None:
    datasource = yaml.safe_load((GRAFANA / "provisioning/datasources/prometheus.yml").read_text())
    provider = yaml.safe_load((GRAFANA / "provisioning/dashboards/specproxy.yml").read_text())
    dashboard = json.loads(DASHBOARD.read_text())
    uid = datasource["datasources"][0]["uid"]
    assert {p["datasource"]["uid"] for p in dashboard["panels"]} == {uid}
    assert provider["providers"][0]["type"] == "file"
    titles = " | ".join(p["title"].lower() for p in dashboard["panels"])
    topics = ("speed", "acceptance", "first token", "route share", "in-flight", "up", "restarts")
    assert all(topic in titles for topic in topics), titles


def test_each_request_logs_one_json_line_without_the_prompt(
    proxy: RunningProxy, client: openai.OpenAI
) -> None:
    secret = f"marmalade-{uuid.uuid4().hex[:8]}"
    request_id = uuid.uuid4().hex[:16]
    stream = client.chat.completions.create(
        model="draft",
        messages=[{"role": "user", "content": f"Write the word '{secret}' five times."}],
        max_tokens=16,
        temperature=0,
        stream=True,
        extra_headers={"X-Request-Id": request_id},
    )
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)
    lines: list[dict[str, Any]] = []

    def logged() -> bool:
        for raw in proxy.log_path.read_text().splitlines():
            if request_id in raw:
                lines.append(json.loads(raw))
        return bool(lines)

    wait_for(logged, 10, "the request's log line", interval=0.2)
    (line,) = lines
    assert line["event"] == "request" and line["status"] == 200
    assert line["backend"] == "draft" and line["route"] == "pinned" and line["task"] in TASKS
    assert line["tokens"] > 0 and line["tokens_per_s"] > 0 and line["ttft_s"] > 0
    assert 0 <= line["acceptance"] <= 1
    assert secret not in proxy.log_path.read_text()
