"""The OpenAI API through the proxy, called with the official client against real backends.

Requests the proxy answers itself (400, 404, 413) are in tests/fast/test_validation.py.
"""

from __future__ import annotations

import json

import openai
import pytest

from tests.helpers import get_json
from tests.messages import openai_messages
from tests.subprocess_proxy import RunningProxy

HELLO = openai_messages("Say hello in five words.")


def test_chat_completion_names_the_backend_and_keeps_timings(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=HELLO, max_tokens=16, temperature=0
    )
    completion = raw.parse()
    assert raw.headers["x-specproxy-backend"] in {"plain", "draft", "ngram"}
    assert raw.headers["x-specproxy-task"] in {"code", "prose", "echo"}
    assert completion.choices[0].message.content
    assert completion.usage is not None and 0 < completion.usage.completion_tokens <= 16
    timings = json.loads(raw.text)["timings"]
    assert timings["predicted_n"] == completion.usage.completion_tokens
    assert timings["predicted_per_second"] > 0


def test_streamed_chat_arrives_in_chunks_with_timings(client: openai.OpenAI) -> None:
    with client.chat.completions.with_streaming_response.create(
        model="plain",
        messages=HELLO,
        max_tokens=24,
        temperature=0,
        stream=True,
        stream_options={"include_usage": True},
    ) as response:
        assert response.headers["x-specproxy-backend"] == "plain"
        assert response.headers["content-type"].startswith("text/event-stream")
        events = [line for line in response.iter_lines() if line.startswith("data: ")]
    payloads = [json.loads(e[6:]) for e in events if e != "data: [DONE]"]
    text = "".join(
        (p["choices"][0]["delta"].get("content") or "") for p in payloads if p.get("choices")
    )
    assert len(payloads) > 3 and text
    assert events[-1] == "data: [DONE]"
    assert any("timings" in p for p in payloads), "llama.cpp's timings must survive streaming"
    usage = [p["usage"] for p in payloads if p.get("usage")]
    assert usage and usage[-1]["completion_tokens"] > 0


def test_stream_with_the_client_iterator(client: openai.OpenAI) -> None:
    stream = client.chat.completions.create(
        model="auto", messages=HELLO, max_tokens=16, temperature=0, stream=True
    )
    text = "".join(chunk.choices[0].delta.content or "" for chunk in stream if chunk.choices)
    assert text.strip()


async def test_async_client_stream_and_non_stream(async_client: openai.AsyncOpenAI) -> None:
    completion = await async_client.chat.completions.create(
        model="draft", messages=HELLO, max_tokens=16, temperature=0
    )
    assert completion.choices[0].message.content
    stream = await async_client.chat.completions.create(
        model="ngram", messages=HELLO, max_tokens=16, temperature=0, stream=True
    )
    pieces = [c.choices[0].delta.content or "" async for c in stream if c.choices]
    assert "".join(pieces).strip()


@pytest.mark.parametrize("backend", ["plain", "draft", "ngram"])
def test_pinning_by_name(client: openai.OpenAI, backend: str) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model=backend, messages=HELLO, max_tokens=8, temperature=0
    )
    assert raw.headers["x-specproxy-backend"] == backend
    assert raw.headers["x-specproxy-route"] == "pinned"


def test_draft_backend_reports_drafts(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="draft",
        messages=[{"role": "user", "content": "Count from 1 to 30."}],
        max_tokens=64,
        temperature=0,
    )
    timings = json.loads(raw.text)["timings"]
    # SmolLM2 drafting for itself: every drafted token is accepted.
    assert timings["draft_n"] > 0
    assert timings["draft_n_accepted"] / timings["draft_n"] > 0.9


def test_legacy_completions(client: openai.OpenAI) -> None:
    raw = client.completions.with_raw_response.create(
        model="auto", prompt="def fibonacci(n):", max_tokens=16, temperature=0
    )
    completion = raw.parse()
    assert raw.headers["x-specproxy-task"] == "code"
    assert completion.choices[0].text


def test_legacy_completions_stream(client: openai.OpenAI) -> None:
    stream = client.completions.create(
        model="plain", prompt="Once upon a time", max_tokens=16, temperature=0, stream=True
    )
    assert "".join(c.choices[0].text for c in stream if c.choices).strip()


def test_models_lists_auto_and_backends(client: openai.OpenAI) -> None:
    ids = [m.id for m in client.models.list()]
    assert ids[:4] == ["auto", "auto-code", "auto-prose", "auto-echo"]
    assert set(ids[4:7]) == {"plain", "draft", "ngram"}
    assert ids[7:] == ["gpt-4o-mini"], "exact aliases of tests/configs/test.yaml, no patterns"


def test_health_shows_every_backend(proxy: RunningProxy) -> None:
    status, body = get_json(f"{proxy.url}/health")
    assert status == 200 and body["status"] == "ok"
    backends = body["backends"]
    assert isinstance(backends, dict)
    assert {b["spec_type"] for b in backends.values()} == {None, "draft-simple", "ngram-mod"}
    assert all(b["state"] == "ready" and b["pid"] for b in backends.values())


def test_task_override_by_header_and_model_id(client: openai.OpenAI) -> None:
    raw = client.chat.completions.with_raw_response.create(
        model="auto-echo", messages=HELLO, max_tokens=4
    )
    assert raw.headers["x-specproxy-task"] == "echo"
    raw = client.chat.completions.with_raw_response.create(
        model="auto", messages=HELLO, max_tokens=4, extra_headers={"X-Specproxy-Task": "code"}
    )
    assert raw.headers["x-specproxy-task"] == "code"


def test_back_to_back_streams_all_succeed(client: openai.OpenAI) -> None:
    # llama-server may close a connection right after a stream; the proxy must not reuse it.
    for _ in range(40):
        stream = client.chat.completions.create(
            model="plain", messages=HELLO, max_tokens=4, temperature=0, stream=True
        )
        assert [c for c in stream if c.choices]


def test_requests_reuse_the_connection_to_their_backend(
    proxy: RunningProxy, client: openai.OpenAI
) -> None:
    """specproxy's build keeps connections after streamed answers, and the relay pools them."""
    import psutil

    backend = proxy.health()["backends"]["plain"]
    port = int(str(backend["url"]).rsplit(":", 1)[1])
    owner = psutil.Process(proxy.process.pid)

    def open_to_backend() -> set[int]:
        return {
            c.laddr.port
            for c in owner.net_connections(kind="tcp")
            if c.raddr and c.raddr.port == port and c.status == psutil.CONN_ESTABLISHED
        }

    seen = []
    for stream in (True, False, True, True):
        if stream:
            chunks = client.chat.completions.create(
                model="plain", messages=HELLO, max_tokens=4, stream=True
            )
            assert "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
        else:
            answer = client.chat.completions.create(model="plain", messages=HELLO, max_tokens=4)
            assert answer.choices[0].message.content
        seen.append(open_to_backend())
    # One connection carried every request: its local port stayed open throughout.
    assert set.intersection(*seen), seen


def test_a_pinned_backend_honours_the_clients_draft_length(client: openai.OpenAI) -> None:
    question = openai_messages("List the first ten prime numbers.")

    def answer(model: str, **extra: object) -> tuple[str, dict[str, int]]:
        resp = client.chat.completions.create(
            model=model, messages=question, max_tokens=40, temperature=0, extra_body=extra
        )
        timings = (resp.model_extra or {})["timings"]
        return resp.choices[0].message.content or "", timings

    plain, _ = answer("plain")
    off, off_timings = answer("draft", **{"speculative.n_max": 0})
    _, on_timings = answer("draft")
    assert off == plain
    assert not off_timings.get("draft_n") and on_timings["draft_n"] > 0
    with pytest.raises(openai.BadRequestError, match="draft-simple"):
        answer("draft", **{"speculative.types": ["ngram-mod"]})
