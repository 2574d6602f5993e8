"""An agent's first turn, timed: a relay in front of any server that notes when each request
was sent and when its first generated token came back (not a keep-alive or progress event), and
a runner that stops the agent once its first turn has been answered."""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import re
import signal
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field
from pathlib import Path

import aiohttp
from aiohttp import web

from loadtests import agents
from loadtests.bare import free_port

# What an event (or a whole answer) carries once the model has generated something, in each
# API: not keep-alive events, empty deltas or progress.
_GENERATED = re.compile(
    rb'"(?:content|text|partial_json)":\s*"[^"]|"tool_calls":\s*\[\s*\{|'
    rb'"type":\s*"response\.(?:output_text|function_call_arguments)\.delta".*"delta":\s*"[^"]'
)
# Where llama-server (and specproxy, relaying it) says how much of the prompt it found cached:
# its timings, or the Messages API's usage (input_tokens there counts only what was computed).
_CACHED = re.compile(
    rb'"cache_n":\s*(\d+),\s*"prompt_n":\s*(\d+)|'
    rb'"cache_read_input_tokens":\s*(\d+),\s*"input_tokens":\s*(\d+)'
)


@dataclass
class Seen:
    """One request through the relay."""

    path: str
    tools: bool
    started: float
    first_token_s: float | None = None
    done: bool = False
    cached_tokens: int | None = None
    prompt_tokens: int | None = None
    body: dict[str, object] = field(default_factory=dict)

    def note_cache(self, text: bytes) -> None:
        """Note the last cache figures `text` carries."""
        for match in _CACHED.finditer(text):
            cached, computed = (int(g) for g in match.groups() if g is not None)
            self.cached_tokens, self.prompt_tokens = cached, cached + computed


@dataclass
class Relay:
    """Forwards everything to `upstream`, noting each request's time to its first token."""

    upstream: str = ""
    seen: list[Seen] = field(default_factory=list)

    async def handle(self, request: web.Request) -> web.StreamResponse:
        raw = await request.read()
        try:
            body = json.loads(raw) if raw else {}
        except ValueError:
            body = {}
        if not isinstance(body, dict):
            body = {}
        seen = Seen(request.path, bool(body.get("tools")), time.monotonic(), body=body)
        self.seen.append(seen)
        headers = {
            k: v for k, v in request.headers.items() if k.lower() not in ("host", "content-length")
        }
        timeout = aiohttp.ClientTimeout(total=None)
        async with (
            aiohttp.ClientSession(timeout=timeout, auto_decompress=False) as session,
            session.request(
                request.method, self.upstream + request.path_qs, data=raw, headers=headers
            ) as upstream,
        ):
            response = web.StreamResponse(status=upstream.status)
            for key, value in upstream.headers.items():
                if key.lower() not in ("content-length", "transfer-encoding", "connection"):
                    response.headers[key] = value
            await response.prepare(request)
            tail = b""
            async for chunk in upstream.content.iter_any():
                if seen.first_token_s is None and _GENERATED.search(chunk):
                    seen.first_token_s = time.monotonic() - seen.started
                seen.note_cache(tail + chunk)
                tail = chunk[-200:]
                await response.write(chunk)
            if seen.first_token_s is None:
                seen.first_token_s = time.monotonic() - seen.started  # a whole answer
            seen.done = True
            await response.write_eof()
            return response

    def first_turn(self) -> Seen | None:
        """The session's first turn: its first request offering tools, else its first POST
        (aider offers none); None until it has been answered."""
        posts = [
            s for s in self.seen if s.path.endswith(("/messages", "/responses", "/completions"))
        ]
        turn = next((s for s in posts if s.tools), None)
        if turn is None and posts and not any(s.tools for s in posts) and posts[0].done:
            turn = posts[0]
        return turn if turn is not None and turn.done else None


@asynccontextmanager
async def relay_at(relay: Relay) -> AsyncIterator[str]:
    """The relay served on a free loopback port; its base URL."""
    app = web.Application(client_max_size=64 * 2**20)
    app.router.add_route("*", "/{tail:.*}", relay.handle)
    runner = web.AppRunner(app)
    await runner.setup()
    port = free_port()
    await web.TCPSite(runner, "127.0.0.1", port).start()
    try:
        yield f"http://127.0.0.1:{port}"
    finally:
        await runner.cleanup()


async def first_turn_s(
    name: str, relay: Relay, url: str, root: Path, task: str, timeout: float
) -> float | None:
    """Run one agent session until its first turn is answered (then stop it); that turn's time
    to first token, None if it was not answered within `timeout` s."""
    turn = await first_turn(name, relay, url, root, task, timeout)
    return turn.first_token_s if turn is not None else None


async def first_turn(
    name: str, relay: Relay, url: str, root: Path, task: str, timeout: float, narrow: bool = False
) -> Seen | None:
    """Run one agent session until its first turn is answered (then stop it); that turn, None
    if it was not answered within `timeout` s. `narrow`: with agents.NARROW's options."""
    relay.seen.clear()
    command = agents.COMMANDS[name](url, root, timeout, task)
    if narrow:
        command = agents.narrowed(command)
    process = agents.start(command)
    deadline = time.monotonic() + timeout
    try:
        while time.monotonic() < deadline and process.poll() is None:
            if relay.first_turn() is not None:
                break
            await asyncio.sleep(0.5)
    finally:
        # The agent may have finished on its own; its group is gone then.
        with contextlib.suppress(ProcessLookupError):
            os.killpg(process.pid, signal.SIGKILL)
        out, err = process.communicate()
    turn = relay.first_turn()
    if turn is None:
        # Shown by pytest and the scripts when a session ends without its first turn.
        print(
            f"{name}: no first turn within {timeout:.0f} s; its output ends:\n{(out + err)[-2000:]}"
        )
    return turn
