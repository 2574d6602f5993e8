"""What README.md and docs/ name exists: the endpoints, the Prometheus series, the response
headers, the route reasons and the files and sections they link to; and the README stays a
five-minute read (fast tier: the text against the code, nothing started)."""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from aiohttp import web

from proxy.api.auth import OPEN_PATHS
from proxy.api.background import calibration_requests
from proxy.api.routes import add_routes
from proxy.config import load_settings
from proxy.routing.reasons import REASONS
from proxy.tasks import FIM_TASK
from tests.helpers import ROOT

README = ROOT / "README.md"
DOCS = sorted((ROOT / "docs").glob("*.md"))
PAGES = [README, *DOCS]
README_MAX_LINES = 150

_FENCE = re.compile(r"^(```|~~~).*?^\1", re.M | re.S)
_LINK = re.compile(r"!?\[[^\]]*\]\(([^)\s]+)\)")


def _prose(path: Path) -> str:
    """The page without its fenced code blocks (real output there may name anything)."""
    return _FENCE.sub("", path.read_text())


def _name(path: Path) -> str:
    return str(path.relative_to(ROOT))


def test_the_readme_is_a_five_minute_read() -> None:
    lines = README.read_text().count("\n")
    assert lines <= README_MAX_LINES, (
        f"README.md has {lines} lines (at most {README_MAX_LINES}): move reference material to "
        "docs/ and link it"
    )


# GitHub's heading anchors: lower case, punctuation dropped, spaces to hyphens; -1, -2 on repeats.
def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    anchors = set()
    for line in _prose(path).splitlines():
        heading = re.match(r"^#{1,6}\s+(.*?)\s*#*\s*$", line)
        if heading is None:
            continue
        text = re.sub(r"[^\w\- ]", "", heading.group(1).replace("`", "").lower())
        slug = text.replace(" ", "-")
        count = seen.get(slug, 0)
        seen[slug] = count + 1
        anchors.add(slug if count == 0 else f"{slug}-{count}")
    return anchors


def _relative_links(path: Path) -> list[str]:
    links = _LINK.findall(_prose(path))
    return [t for t in links if not re.match(r"^[a-z][a-z0-9+.-]*:", t)]


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_relative_links_reach_files_and_sections_that_exist(page: Path) -> None:
    broken = []
    for target in _relative_links(page):
        file_part, _, anchor = target.partition("#")
        resolved = (page.parent / file_part).resolve() if file_part else page
        if not resolved.exists():
            broken.append(f"{target} (no such file)")
        elif anchor and resolved.suffix == ".md" and anchor not in _anchors(resolved):
            broken.append(f"{target} (no such section)")
    assert not broken, f"{_name(page)} links to what is not there: {broken}"


def _served() -> dict[str, set[str]]:
    """Every path the proxy serves and its methods (a GET also answers HEAD)."""
    app = web.Application()
    add_routes(app)
    served: dict[str, set[str]] = {}
    for route in app.router.routes():
        info = route.resource.get_info() if route.resource is not None else {}
        path = info.get("path") or info.get("formatter", "")
        served.setdefault(path, set()).add(route.method)
    return served


def _named_paths(text: str) -> set[tuple[str, str]]:
    """(method or '', path) for every `/path` or `METHOD /path` in backticks."""
    found = re.findall(r"`(?:(GET|POST|HEAD) )?(/[A-Za-z0-9_./{}*-]*)`", text)
    return {(method, path) for method, path in found}


@pytest.mark.parametrize("page", [README, ROOT / "docs" / "surfaces.md"], ids=_name)
def test_every_endpoint_named_is_served(page: Path) -> None:
    served = _served()
    missing = []
    for method, path in _named_paths(_prose(page)):
        if path.endswith("*"):
            ok = any(p.startswith(path[:-1]) for p in served)
        else:
            methods = served.get(path, set())
            ok = bool(methods) and (not method or method in methods)
        if not ok:
            missing.append(f"{method} {path}".strip())
    assert not missing, (
        f"{_name(page)} names endpoints proxy/api/routes.py does not serve: {missing}"
    )


def test_the_pages_name_endpoints_at_all() -> None:
    assert ("", "/ui") in _named_paths(_prose(README)) or "/ui" in README.read_text()
    assert ("POST", "/v1/chat/completions") in _named_paths(_prose(ROOT / "docs" / "surfaces.md"))


# Where the series are declared, and the suffixes each kind exposes.
_METRIC_MODULES = (ROOT / "proxy" / "metrics.py", ROOT / "proxy" / "collectors.py")
_SUFFIXES = {
    "Counter": ("_total", "_created"),
    "CounterMetricFamily": ("_total",),
    "Histogram": ("_bucket", "_sum", "_count", "_created"),
    "GaugeMetricFamily": ("",),
    "Gauge": ("",),
}
# Names beginning specproxy_ that are not series: a backend setting, a test fixture.
_NOT_SERIES = {"specproxy_build", "specproxy_image"}


def _declared_series() -> set[str]:
    names = set()
    for module in _METRIC_MODULES:
        for node in ast.walk(ast.parse(module.read_text())):
            if not (isinstance(node, ast.Call) and node.args):
                continue
            kind = node.func.id if isinstance(node.func, ast.Name) else None
            first = node.args[0]
            if kind in _SUFFIXES and isinstance(first, ast.Constant):
                base = str(first.value)
                names |= {base} | {base + suffix for suffix in _SUFFIXES[kind]}
    return names


def test_the_metric_modules_declare_the_series_the_dashboard_needs() -> None:
    series = _declared_series()
    assert {"specproxy_requests_total", "specproxy_proxy_overhead_seconds_bucket"} <= series
    assert "specproxy_router_tokens_per_second" in series


def _named_series(text: str) -> set[str]:
    return set(re.findall(r"(?<![\w.])specproxy_[a-z_]*[a-z](?!\w)", text)) - _NOT_SERIES


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_metric_named_is_exported(page: Path) -> None:
    # Fenced blocks included: PromQL and scrapes there name series too.
    unknown = _named_series(page.read_text()) - _declared_series()
    assert not unknown, f"{_name(page)} names series proxy/metrics.py does not export: {unknown}"


def test_observability_lists_only_exported_series() -> None:
    """docs/observability.md lists the series without their `specproxy_` prefix."""
    text = (ROOT / "docs" / "observability.md").read_text()
    section = text.split("## Metrics", 1)[1].split("\n#", 1)[0]
    # A bullet and its indented continuation lines; the last one is the backends' own llamacpp_*.
    bullets = re.findall(r"^- .*?(?=^- |^\S|\Z)", section, re.M | re.S)
    listed = {
        name
        for bullet in bullets
        if "llamacpp" not in bullet
        # Series names have an underscore; `timings` and the like are llama.cpp's fields.
        for name in re.findall(r"`([a-z]+_[a-z_]+)(?:\{[^}]*\})?`", bullet)
    }
    assert len(listed) >= 15
    unknown = {n for n in listed if f"specproxy_{n}" not in _declared_series()}
    assert not unknown, f"docs/observability.md lists series that are not exported: {unknown}"


def _headers_in_code() -> set[str]:
    code = "\n".join(p.read_text() for p in (ROOT / "proxy").rglob("*.py"))
    return set(re.findall(r"X-Specproxy-[A-Za-z-]*[A-Za-z]", code))


@pytest.mark.parametrize("page", PAGES, ids=_name)
def test_every_response_header_named_is_one_the_proxy_uses(page: Path) -> None:
    named = set(re.findall(r"X-Specproxy-[A-Za-z-]*[A-Za-z]", page.read_text(), re.I))
    known = {h.lower() for h in _headers_in_code()}
    unknown = {h for h in named if h.lower() not in known}
    assert not unknown, f"{_name(page)} names headers the proxy does not send or read: {unknown}"


def test_every_route_reason_is_documented_in_routing_md() -> None:
    text = (ROOT / "docs" / "routing.md").read_text()
    undocumented = [r for r in REASONS if f"`{r}`" not in text]
    assert not undocumented, f"docs/routing.md does not name the route reasons {undocumented}"


def test_the_readmes_memory_figures_are_the_measured_ones() -> None:
    """Each GiB/MiB figure in the README is one docs/agents.md measures (or the small config's
    arithmetic from them), so the two cannot drift apart."""
    sources = (ROOT / "docs" / "agents.md").read_text() + (
        ROOT / "deploy" / "cpu-small.yaml"
    ).read_text()
    figures = re.findall(r"(\d[\d,.]*) (?:GiB|MiB)", README.read_text())
    assert figures
    unsourced = [f for f in figures if not re.search(rf"(?<![\d.]){re.escape(f)}(?![\d])", sources)]
    assert not unsourced, (
        f"README.md's memory figures {unsourced} are in neither docs/agents.md nor "
        "deploy/cpu-small.yaml"
    )


@pytest.mark.parametrize("page", ["surfaces.md", "kubernetes.md"])
def test_the_open_paths_named_are_the_ones_the_code_opens(page: str) -> None:
    text = " ".join((ROOT / "docs" / page).read_text().split())
    listed = re.search(r"\(([^()]*?):\s*`OPEN_PATHS`", text)
    assert listed, f"docs/{page} should list the open paths as (`/`, ...: `OPEN_PATHS` ...)"
    assert set(re.findall(r"`(/[\w/]*)`", listed.group(1))) == OPEN_PATHS


def test_the_infill_requests_calibration_sends_are_as_many_as_documented() -> None:
    settings = load_settings()
    per_backend = {
        len(
            calibration_requests(
                FIM_TASK,
                settings.calibration_prompts,
                b.request_context - settings.calibration_max_tokens,
            )
        )
        * settings.calibration_requests
        for b in settings.backends
    }
    words = {1: "one", 2: "two", 3: "three", 4: "four", 5: "five", 6: "six"}
    (count,) = per_backend
    text = " ".join(_prose(ROOT / "docs" / "surfaces.md").split())
    assert f"each backend {words[count]} `/infill` requests" in text
