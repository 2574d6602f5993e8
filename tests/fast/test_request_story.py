"""One story per request: the response, the log line, the metrics and the status page agree on
what happened, and every answer, errors included, carries its request id (fast tier)."""

from __future__ import annotations

import asyncio
import json
import re
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from structlog.testing import capture_logs

from proxy.api.state import RECENT
from proxy.exchange import Exchange
from proxy.measurement import Measurement
from tests.inprocess import FastProxy, fast_proxy
from tests.messages import openai_messages

HELLO = openai_messages("Say hello.")


def _requests_counted(metrics: str, backend: str, status: int) -> float:
    """specproxy_requests_total summed over the series of one backend and status."""
    pattern = re.compile(r"^specproxy_requests_total\{([^}]*)\} ([0-9.e+]+)$", re.MULTILINE)
    total = 0.0
    for labels, value in pattern.findall(metrics):
        if f'backend="{backend}"' in labels and f'status="{status}"' in labels:
            total += float(value)
    return total


async def _story(proxy: FastProxy, request_id: str, logs: Sequence[Mapping[str, Any]]) -> set[int]:
    """The statuses the log line, the metrics and the status page's ring give the request."""
    (line,) = [e for e in logs if e.get("event") == "request" and e["request_id"] == request_id]
    ring = proxy.http.app[RECENT]
    recent = next(iter(ring))
    metrics = await (await proxy.http.get("/metrics")).text()
    counted = {s for s in (200, 499, 502) if _requests_counted(metrics, line["backend"], s)}
    assert len(counted) == 1, f"metrics count the request under {counted}"
    return {line["status"], recent.status, *counted}


async def _leave_after(proxy: FastProxy, request_id: str, marker: bytes) -> None:
    """Stream a chat answer over a raw socket and drop the connection once `marker` arrived, as
    an agent does: no goodbye, the socket reset."""
    reader, writer = await asyncio.open_connection(proxy.http.host, proxy.http.port)
    body = json.dumps({"model": "plain", "messages": HELLO, "stream": True}).encode()
    writer.write(
        b"POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nX-Request-Id: "
        + request_id.encode()
        + b"\r\nContent-Type: application/json\r\nContent-Length: "
        + str(len(body)).encode()
        + b"\r\n\r\n"
        + body
    )
    await writer.drain()
    seen = b""
    while marker not in seen:
        chunk = await asyncio.wait_for(reader.read(65536), 5)
        assert chunk, f"the stream ended before {marker!r}"
        seen += chunk
    writer.transport.abort()


async def _logged(logs: Sequence[Mapping[str, Any]], request_id: str) -> None:
    for _ in range(100):
        if any(e.get("request_id") == request_id for e in logs):
            return
        await asyncio.sleep(0.05)


async def test_a_client_that_leaves_mid_stream_is_499_in_the_log_metrics_and_status_page(
    tmp_path: Path,
) -> None:
    async with fast_proxy(tmp_path) as proxy:
        double = proxy.doubles["plain"]
        double.behaviour.tokens, double.behaviour.token_delay_s = 40, 0.05
        with capture_logs() as logs:
            await _leave_after(proxy, "leaves-early", b"w1 ")
            await _logged(logs, "leaves-early")
            assert await _story(proxy, "leaves-early", logs) == {499}


async def test_a_client_that_leaves_right_after_the_last_event_had_a_200(
    tmp_path: Path,
) -> None:
    async with fast_proxy(tmp_path) as proxy:
        with capture_logs() as logs:
            await _leave_after(proxy, "done-then-gone", b"data: [DONE]")
            await _logged(logs, "done-then-gone")
            assert await _story(proxy, "done-then-gone", logs) == {200}


async def test_a_malformed_event_ends_the_request_with_an_error_and_the_backend_stays_up(
    tmp_path: Path,
) -> None:
    async with fast_proxy(tmp_path) as proxy:
        proxy.doubles["plain"].behaviour.malformed_after = 1
        with capture_logs() as logs:
            async with (
                aiohttp.ClientSession() as session,
                session.post(
                    f"{proxy.url}/v1/chat/completions",
                    json={"model": "plain", "messages": HELLO, "stream": True},
                    headers={"X-Request-Id": "garbled"},
                ) as resp,
            ):
                text = await resp.text()
        events = [line[6:] for line in text.splitlines() if line.startswith("data: ")]
        assert "{not json" not in events, "the malformed line reached the client as an event"
        assert events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["code"] == "upstream_error" and "not JSON" in error["message"]
        assert await _story(proxy, "garbled", logs) == {502}
        health = await (await proxy.http.get("/health")).json()
        assert health["backends"]["plain"]["state"] == "ready"
        # And the next request is served by it.
        proxy.doubles["plain"].behaviour.malformed_after = None
        answer = await proxy.openai().chat.completions.create(model="plain", messages=HELLO)
        assert answer.choices[0].message.content


@pytest.mark.parametrize(
    ("method", "path", "body", "status"),
    [
        ("POST", "/v1/chat/completions", b"{not json", 400),
        ("POST", "/v1/chat/completions", b'{"model": "no-such", "messages": []}', 400),
        ("POST", "/v1/messages", b'{"model": "plain"}', 400),
        ("GET", "/v1/nowhere", b"", 404),
        ("GET", "/v1/chat/completions", b"", 405),
    ],
)
async def test_every_error_carries_the_request_id(
    tmp_path: Path, method: str, path: str, body: bytes, status: int
) -> None:
    async with fast_proxy(tmp_path) as proxy:
        given = await proxy.http.request(
            method, path, data=body, headers={"X-Request-Id": "mine-123"}
        )
        assert given.status == status
        assert given.headers["X-Request-Id"] == "mine-123"
        made = await proxy.http.request(method, path, data=body)
        assert made.status == status
        assert re.fullmatch(r"[0-9a-f]{16}", made.headers["X-Request-Id"])


async def test_a_missing_key_is_a_401_with_a_request_id(tmp_path: Path) -> None:
    async with fast_proxy(tmp_path, api_keys=["s3cret"]) as proxy:
        resp = await proxy.http.post("/v1/chat/completions", json={"model": "plain"})
        assert resp.status == 401 and resp.headers["X-Request-Id"]


async def test_the_request_id_the_client_sent_names_its_log_line(tmp_path: Path) -> None:
    async with fast_proxy(tmp_path) as proxy:
        with capture_logs() as logs:
            resp = await proxy.http.post(
                "/v1/chat/completions",
                json={"model": "plain", "messages": HELLO},
                headers={"X-Request-Id": "named-by-client"},
            )
            assert resp.status == 200 and resp.headers["X-Request-Id"] == "named-by-client"
        assert [e["status"] for e in logs if e.get("request_id") == "named-by-client"] == [200]


def test_a_failed_attempts_wait_is_not_the_proxys_own_time() -> None:
    exchange = Exchange("/v1/chat/completions", "retried")
    start = exchange.started
    # The first attempt waited 2 s on a connect that then failed; the second 0.5 s on its answer.
    exchange.measured = Measurement(waited_s=2.0)
    exchange.admit_wait_s = 0.25
    exchange.retry()
    assert exchange.measured is None and exchange.admission is None
    exchange.measured = Measurement(waited_s=0.5)
    exchange.admit_wait_s += 0.25
    own = exchange.own_s(start + 3.01)
    assert own == pytest.approx(0.01, abs=1e-6)
    assert time.monotonic() >= start
