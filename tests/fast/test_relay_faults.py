"""What clients see when a backend misbehaves: stalls, resets, malformed SSE, 5xx (fast tier)."""

from __future__ import annotations

import asyncio
import contextlib
import json
from collections.abc import AsyncIterator
from pathlib import Path

import aiohttp
import openai
import pytest

from proxy.api.relay import UpstreamSessions, connection_reuse_trace
from tests.helpers import accepting_nothing
from tests.inprocess import fast_proxy
from tests.messages import openai_messages

HELLO = openai_messages("Say hello.")


async def sse_events(proxy_url: str, body: dict[str, object]) -> tuple[int, list[str]]:
    import aiohttp

    async with (
        aiohttp.ClientSession() as session,
        session.post(f"{proxy_url}/v1/chat/completions", json=body) as resp,
    ):
        text = await resp.text()
    return resp.status, [line[6:] for line in text.splitlines() if line.startswith("data: ")]


async def test_a_stream_passes_through_with_its_timings(tmp_path: Path) -> None:
    async with fast_proxy(tmp_path) as proxy:
        client = proxy.openai()
        stream = await client.chat.completions.create(
            model="plain",
            messages=HELLO,
            max_tokens=5,
            stream=True,
        )
        chunks = [c async for c in stream]
        text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        assert text == "w0 w1 w2 w3 w4 "
        assert chunks[-1].model_extra and chunks[-1].model_extra["timings"]["predicted_n"] == 5
        # The proxy asked for running timings, so a cut stream is still measured.
        assert proxy.doubles["plain"].received[-1]["timings_per_token"] is True


async def test_no_first_token_is_a_504_and_a_stall_an_sse_error(tmp_path: Path) -> None:
    async with fast_proxy(
        tmp_path, first_token_timeout_s=0.3, idle_timeout_s=0.3, request_timeout_s=0.3
    ) as proxy:
        double = proxy.doubles["plain"]
        double.behaviour.first_token_delay_s = 5
        with pytest.raises(openai.APIStatusError) as err:
            await proxy.openai().chat.completions.create(
                model="plain",
                messages=HELLO,
            )
        assert err.value.status_code == 504
        body = err.value.body
        assert isinstance(body, dict) and body["code"] == "upstream_timeout"
        double.behaviour.first_token_delay_s = 0
        double.behaviour.stall_after = 2
        status, events = await sse_events(
            proxy.url, {"model": "plain", "messages": HELLO, "stream": True}
        )
        # Two tokens, the error, and the `[DONE]` that ends every OpenAI stream.
        assert status == 200 and len(events) == 4 and events[-1] == "[DONE]"
        error = json.loads(events[-2])["error"]
        assert error["type"] == "timeout_error"
        assert error["code"] == "upstream_timeout" and "stalled for 0.3 s" in error["message"]
        await asyncio.sleep(0.1)
        assert double.processing == 0, "the stalled upstream request was not cancelled"


async def test_a_reset_mid_stream_ends_with_an_error_event_and_marks_the_backend_down(
    tmp_path: Path,
) -> None:
    async with fast_proxy(tmp_path) as proxy:
        proxy.doubles["ngram"].behaviour.reset_after = 2
        status, events = await sse_events(
            proxy.url, {"model": "ngram", "messages": HELLO, "stream": True}
        )
        assert status == 200 and events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "upstream_error"
        health = await (await proxy.http.get("/health")).json()
        assert health["backends"]["ngram"]["state"] == "unhealthy"


async def test_malformed_sse_ends_the_stream_with_an_error_event(tmp_path: Path) -> None:
    async with fast_proxy(tmp_path) as proxy:
        proxy.doubles["plain"].behaviour.malformed_after = 1
        status, events = await sse_events(
            proxy.url, {"model": "plain", "messages": HELLO, "stream": True, "max_tokens": 4}
        )
        assert status == 200 and "{not json" not in events and events[-1] == "[DONE]"
        assert json.loads(events[-2])["error"]["code"] == "upstream_error"
        text = await (await proxy.http.get("/metrics")).text()
        # What came before the bad line was generated, and is counted.
        series = 'specproxy_generated_tokens_total{backend="plain",spec_type="none",task="prose"}'
        (counted,) = [
            float(line.split()[-1]) for line in text.splitlines() if line.startswith(series)
        ]
        assert counted >= 1


async def test_an_upstream_5xx_reaches_the_client_in_openai_format(tmp_path: Path) -> None:
    async with fast_proxy(tmp_path) as proxy:
        proxy.doubles["plain"].behaviour.status = 500
        with pytest.raises(openai.InternalServerError) as err:
            await proxy.openai().chat.completions.create(
                model="plain",
                messages=HELLO,
            )
        assert err.value.status_code == 500


async def test_pinned_requests_for_backends_on_one_device_take_turns(tmp_path: Path) -> None:
    shared = {"device": "gpu0"}
    async with fast_proxy(
        tmp_path,
        backends={"a": shared, "b": shared},
        devices={"gpu0": {"capacity": 1}},
    ) as proxy:
        for d in proxy.doubles.values():
            d.behaviour.token_delay_s = 0.01
        client = proxy.openai()

        async def ask(model: str) -> str:
            raw = await client.chat.completions.with_raw_response.create(
                model=model,
                messages=HELLO,
                stream=False,
            )
            return raw.headers["X-Specproxy-Device-Wait"]

        waits = await asyncio.gather(*(ask(m) for m in ["a", "b"] * 4))
        a, b = proxy.doubles["a"].busy, proxy.doubles["b"].busy
        assert len(a) == len(b) == 4
        assert not [(x, y) for x in a for y in b if x[0] < y[1] and y[0] < x[1]]
        assert any(float(w) > 0 for w in waits)
        health = await (await proxy.http.get("/health")).json()
        assert health["devices"]["gpu0"]["waits"] >= 1
        text = await (await proxy.http.get("/metrics")).text()
        assert 'specproxy_device_capacity{device="gpu0"} 1.0' in text


async def test_a_whole_answer_is_assembled_from_a_stream_and_a_leaving_client_stops_it(
    tmp_path: Path,
) -> None:
    async with fast_proxy(tmp_path) as proxy:
        double = proxy.doubles["plain"]
        answer = await proxy.openai().chat.completions.create(
            model="plain",
            messages=HELLO,
            max_tokens=3,
        )
        assert answer.choices[0].message.content == "w0 w1 w2 "
        assert answer.usage is not None and answer.usage.completion_tokens == 3
        assert double.received[-1]["stream"] is True  # asked upstream as a stream
        double.behaviour.token_delay_s = 0.2
        with pytest.raises(openai.APITimeoutError):
            await proxy.openai(timeout=0.3).chat.completions.create(
                model="plain",
                messages=HELLO,
            )
        await asyncio.sleep(0.5)
        assert double.processing == 0, "llama-server kept generating for a client that left"


async def test_a_backend_that_does_not_accept_in_time_is_unreachable_not_a_token_timeout() -> None:
    import aiohttp

    from proxy.api.errors import ApiError
    from proxy.api.relay import RelayTimeouts, UpstreamCall, UpstreamSessions, relay
    from proxy.measurement import Measurement

    timeout = aiohttp.ClientTimeout(total=None, connect=0.3)
    timeouts = RelayTimeouts(first_token_s=60, idle_s=60, whole_answer_s=60)
    measured = Measurement()
    with accepting_nothing() as port:
        call = UpstreamCall(
            f"http://127.0.0.1:{port}/completion", "busy", {"prompt": "hi"}, {}, timeouts
        )
        async with aiohttp.ClientSession(timeout=timeout) as session:
            with pytest.raises(ApiError) as caught:
                await relay(None, UpstreamSessions(pooled=session, fresh=session), call, measured)
    # Not "sent nothing within 60 s": nothing was sent, so another backend may take it.
    assert caught.value.status == 502 and caught.value.code == "backend_unreachable"
    assert "did not accept a connection in time" in caught.value.message
    # And it counts against the server as a refused connection does.
    assert measured.connection_lost


class ClosingServer:
    """Fault injection a real llama-server cannot be made to do on cue: an HTTP server that
    answers the first `answered` requests of each connection, then closes the connection when
    the next one arrives, as a server does when its idle timeout and the request cross."""

    def __init__(self, answered: int) -> None:
        self.answered = answered
        self.connections = 0
        self.requests = 0
        self.server: asyncio.Server | None = None

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        self.connections += 1
        served = 0
        try:
            while True:
                head = await reader.readuntil(b"\r\n\r\n")
                length = next(
                    int(line.split(b":")[1])
                    for line in head.split(b"\r\n")
                    if line.lower().startswith(b"content-length:")
                )
                await reader.readexactly(length)
                self.requests += 1
                if served == self.answered:
                    return
                served += 1
                body = b'{"content": "ok"}'
                writer.write(
                    b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                    b"Content-Length: %d\r\nKeep-Alive: timeout=5\r\n\r\n%s" % (len(body), body)
                )
                await writer.drain()
        except (asyncio.IncompleteReadError, ConnectionError):
            pass
        finally:
            writer.close()

    async def __aenter__(self) -> str:
        self.server = await asyncio.start_server(self._serve, "127.0.0.1", 0)
        port = self.server.sockets[0].getsockname()[1]
        return f"http://127.0.0.1:{port}/completion"

    async def __aexit__(self, *_: object) -> None:
        assert self.server is not None
        self.server.close()


@contextlib.asynccontextmanager
async def _upstream() -> AsyncIterator[UpstreamSessions]:
    """The relay's two sessions as the app makes them: pooled (with the reuse trace), fresh."""
    async with (
        aiohttp.ClientSession(
            connector=aiohttp.TCPConnector(limit=0), trace_configs=[connection_reuse_trace()]
        ) as pooled,
        aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=0, force_close=True)) as fresh,
    ):
        yield UpstreamSessions(pooled=pooled, fresh=fresh)


async def test_a_pooled_connection_the_server_closed_is_retried_once_on_a_new_one() -> None:
    server = ClosingServer(answered=1)
    async with server as url, _upstream() as upstream:
        for _ in range(2):
            resp = await upstream.post(url, {"prompt": "hi"}, reuse=True)
            assert resp.status == 200 and (await resp.json())["content"] == "ok"
    # The second request met the closed connection, then went out once more on a new one.
    assert (server.requests, server.connections) == (3, 2)


async def test_a_new_connection_that_fails_is_not_sent_again() -> None:
    server = ClosingServer(answered=0)
    async with server as url, _upstream() as upstream:
        with pytest.raises(aiohttp.ServerDisconnectedError):
            await upstream.post(url, {"prompt": "hi"}, reuse=True)
    # The server may have received it: a request is never sent twice unless its connection
    # was an old one.
    assert (server.requests, server.connections) == (1, 1)
