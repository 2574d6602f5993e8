"""The status page at /ui: backends, devices, measured speeds and the last requests, live.

Rendered here as plain HTML, with no build step and no framework: the page refreshes its live
part from /ui/live every two seconds with a few lines of script, and without script it reloads
itself every five.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from datetime import UTC, datetime
from html import escape

from aiohttp import web

from proxy.api.state import CALIBRATION, POOL, RECENT, ROUTER
from proxy.backends.strategy import Strategy
from proxy.traffic import CalibrationProgress

REFRESH_MS = 2000

_STYLE = """
body { font: 14px/1.4 system-ui, sans-serif; margin: 1.5em; color: #1d1d1f; }
h1 { font-size: 1.4em; margin: 0 0 .2em; } h2 { font-size: 1.1em; margin: 1.4em 0 .4em; }
table { border-collapse: collapse; } td, th { padding: .25em .7em; text-align: left; }
th { background: #f0f0f3; font-weight: 600; } tr:nth-child(even) td { background: #fafafc; }
td.num { text-align: right; font-variant-numeric: tabular-nums; }
.ready, .ok { color: #137333; } .unhealthy, .stopped, .error { color: #b3261e; }
.starting, .restarting, .degraded { color: #a15c00; } .muted { color: #6e6e73; }
"""

_SCRIPT = f"""
const live = document.getElementById("live");
setInterval(async () => {{
  try {{
    const answer = await fetch("/ui/live", {{cache: "no-store"}});
    if (answer.ok) live.innerHTML = await answer.text();
  }} catch (e) {{ /* the proxy is restarting: try again at the next tick */ }}
}}, {REFRESH_MS});
"""


def _table(headers: Sequence[str], rows: Iterable[Sequence[object]], numeric: int = 0) -> str:
    """An HTML table; the last `numeric` columns are right-aligned numbers."""
    head = "".join(f"<th>{escape(h)}</th>" for h in headers)
    body = []
    for row in rows:
        cells = []
        for i, value in enumerate(row):
            cls = ' class="num"' if i >= len(row) - numeric else ""
            text = value if isinstance(value, _Html) else escape(_text(value))
            cells.append(f"<td{cls}>{text}</td>")
        body.append("<tr>" + "".join(cells) + "</tr>")
    if not body:
        body.append(f'<tr><td colspan="{len(headers)}" class="muted">none yet</td></tr>')
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


class _Html(str):
    """Markup already escaped."""


def _state(value: str) -> _Html:
    return _Html(f'<span class="{escape(value)}">{escape(value)}</span>')


def _text(value: object) -> str:
    if value is None:
        return "–"
    if isinstance(value, float):
        return f"{value:.3f}" if value < 10 else f"{value:.1f}"
    return str(value)


def _backends(backends: Sequence[Strategy]) -> str:
    rows: list[Sequence[object]] = []
    for b in backends:
        where = ", ".join(
            f"{r.url} ({r.state}, {r.in_flight} in flight)" for r in b.engine.replicas
        ) or (b.engine.base_url or "–")
        rows.append(
            (
                b.name,
                _state(b.engine.state),
                b.spec.config.kind,
                b.engine.device.name,
                # Backends sharing one llama-server name the same engine.
                b.engine.name,
                where,
                b.in_flight,
                b.engine.queued,
                b.engine.limit,
                b.engine.restarts,
                b.engine.n_ctx,
            )
        )
    headers = ("backend", "state", "kind", "device", "engine", "server", "in flight", "queued")
    return _table((*headers, "limit", "restarts", "context"), rows, numeric=5)


def _devices(request: web.Request) -> str:
    rows = []
    for name, device in request.app[POOL].devices.items():
        s = device.state()
        running = ", ".join(s.running) if s.running else "–"
        rows.append((name, running, s.capacity, s.in_use, s.waiting, s.busy_s))
    return _table(("device", "decoding", "capacity", "in use", "waiting", "busy s"), rows, 4)


def _speeds(request: web.Request) -> str:
    rows = []
    for m in request.app[ROUTER].measured():
        est, (low, high) = m.estimate, m.interval
        acceptance = None if est.acceptance is None else f"{est.acceptance:.0%}"
        rows.append(
            (
                m.backend,
                m.task,
                m.level,
                "busy machine" if est.contended else "quiet",
                est.tokens_per_s,
                f"{low:.1f}–{high:.1f}",
                acceptance,
                est.samples,
            )
        )
    headers = ("backend", "class", "load", "measured on", "tokens/s", "90 % interval")
    return _table((*headers, "acceptance", "samples"), rows, numeric=4)


def _draft_lengths(request: web.Request) -> str:
    drafts = request.app[ROUTER].drafts
    if drafts is None:
        return '<p class="muted">off (tune_draft_length): each backend drafts at its own</p>'
    rows = []
    for cell in drafts.cells():
        tried = ", ".join(
            f"{n}: {arm.tokens_per_s:.1f} t/s"
            + (f" {arm.acceptance:.0%} accepted" if arm.acceptance is not None else "")
            + f" ({arm.samples})"
            for n, arm in cell.arms.items()
        )
        rows.append((cell.backend, cell.task, cell.level, tried, cell.best))
    headers = ("backend", "class", "load", "tokens/s by draft length (samples)", "sent now")
    return _table(headers, rows, numeric=1)


def _calibration(progress: CalibrationProgress) -> str:
    """One line on start-up calibration: how far it is and how long it has left."""
    if progress.state == "off":
        return ""
    if progress.state == "waiting":
        return '<p class="muted">calibration starts once the backends are ready</p>'
    counted = f"{progress.done} of {progress.planned} requests"
    if progress.state == "done":
        return f'<p class="muted">calibration done: {counted}</p>'
    eta = progress.eta_s()
    if eta is None:
        left = "time left known after its first request"
    elif eta < 90:
        left = f"about {eta:.0f} s left"
    else:
        left = f"about {eta / 60:.0f} min left"
    return f'<p><span class="starting">calibrating</span>: {counted} · {left}</p>'


def _recent(request: web.Request) -> str:
    rows = []
    for r in request.app[RECENT]:
        at = datetime.fromtimestamp(r.at, UTC).strftime("%H:%M:%S")
        status = _Html(f'<span class="{"ok" if r.status == 200 else "error"}">{r.status}</span>')
        rows.append(
            (
                at,
                r.endpoint,
                r.model,
                r.backend,
                r.task,
                r.route,
                r.draft_n_max,
                status,
                f"{r.cached_tokens:,} / {r.prompt_tokens:,}" if r.prompt_tokens else None,
                r.tokens,
                r.tokens_per_s or None,
                r.ttft_s,
                r.duration_s,
            )
        )
    headers = (
        "finished (UTC)",
        "endpoint",
        "model",
        "backend",
        "class",
        "route",
        "draft",
        "status",
    )
    numbers = ("cached / prompt", "tokens", "tokens/s", "TTFT s", "took s")
    return _table((*headers, *numbers), rows, numeric=len(numbers))


def live_html(request: web.Request) -> str:
    """The part of the page that refreshes: everything but its frame."""
    pool = request.app[POOL]
    backends = list(pool)
    ready = sum(b.engine.ready for b in backends)
    overall = "ok" if ready == len(backends) else "degraded" if ready else "unavailable"
    recent = request.app[RECENT]
    stamp = datetime.now(UTC).strftime("%Y-%m-%d %H:%M:%S UTC")
    return (
        f"<p>{_state(overall)} · {ready} of {len(backends)} backends ready · "
        f"{recent.total} {'request' if recent.total == 1 else 'requests'} served · "
        f"updated {stamp}</p>"
        f"{_calibration(request.app[CALIBRATION])}"
        f"<h2>Backends</h2>{_backends(backends)}"
        f"<h2>Devices</h2>{_devices(request)}"
        f"<h2>Measured speed per class and load</h2>{_speeds(request)}"
        f"<h2>Longest draft per class and load</h2>{_draft_lengths(request)}"
        f"<h2>Last requests</h2>{_recent(request)}"
    )


async def status_page(request: web.Request) -> web.Response:
    """GET /ui: the whole page."""
    page = (
        '<!doctype html><html lang="en"><head><meta charset="utf-8">'
        '<meta name="viewport" content="width=device-width, initial-scale=1">'
        '<noscript><meta http-equiv="refresh" content="5"></noscript>'
        f"<title>specproxy status</title><style>{_STYLE}</style></head><body>"
        "<h1>specproxy</h1>"
        '<p class="muted">Backends, devices, what the router measured and the last requests '
        '(never their text). JSON: <a href="/health">/health</a>, '
        '<a href="/scoreboard">/scoreboard</a>, <a href="/metrics">/metrics</a>.</p>'
        f'<div id="live">{live_html(request)}</div>'
        f"<script>{_SCRIPT}</script></body></html>"
    )
    return web.Response(text=page, content_type="text/html")


async def status_live(request: web.Request) -> web.Response:
    """GET /ui/live: the page's live part, which its script swaps in."""
    return web.Response(
        text=live_html(request), content_type="text/html", headers={"Cache-Control": "no-store"}
    )
