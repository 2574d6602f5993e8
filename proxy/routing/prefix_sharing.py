"""Prefix sharing: a request whose prompt starts like one its engine is computing waits for it.

Agents send the same long system prompt and tools from every session and sub-agent. Two such
first turns sent at once to one llama-server are processed side by side, each from its first
token, because a prompt is found again only once it is cached: in an idle slot, or in the RAM
cache. The second request is sooner done waiting for the first and processing only what
differs: measured on a bare llama-server (0.5B, two 1.8 k-token first turns sharing their
system prompt), 12.3 s one after the other against 20.6 s together, each finishing sooner
(docs/routing.md, "Prefix sharing").

The wait is bounded by what it saves: while the holder still processes its prompt, the waiter
would only have shared the device with it; after that, it waits at most as long as computing
the shared part again would take.

What a server does with a cached prompt decides whom to wait for. specproxy's build keeps
every turn's prompt in the RAM cache and loads copies (proxy/provision/patches/0003, 0004), so
only a request computing the shared part itself is waited for, and requests released
together go together. Upstream llama-server moves a cached prompt into the one slot that loads
it and extends a session's slot in place, so there every request in flight sharing the start
is waited for, one at a time.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass, field

from proxy.routing.prefixes import PromptPrefix

# Below this many tokens to gain, a request does not wait: one step of a prompt batch.
WORTH_WAITING_TOKENS = 256


@dataclass
class _Computing:
    """A request whose prompt its engine is processing or answering now."""

    prefix: PromptPrefix
    # Tokens of its prompt that were cached somewhere when it started: it computes the rest.
    known_tokens: int
    # When its engine is expected to be through its prompt (monotonic seconds).
    prompt_done_at: float
    done: asyncio.Event = field(default_factory=asyncio.Event)


@dataclass(frozen=True)
class Shared:
    """What one request is about to compute: its engine and prompt, and what the engine holds
    of that prompt already."""

    engine: str
    prefix: PromptPrefix
    cached_tokens: int
    prompt_tokens: int
    chars_per_token: float
    # The engine's measured prompt tokens/s; None before any, and then nobody waits.
    prompt_speed: float | None
    # Whether the engine keeps cached prompts when a request loads one (specproxy's build).
    keeps_copies: bool = False

    def shared_tokens(self, other: PromptPrefix) -> int:
        """Tokens this prompt starts with that `other` starts with too."""
        shared = int(self.prefix.shared_chars(other) / self.chars_per_token)
        return min(shared, self.prompt_tokens)


class PrefixSharing:
    """The prompts each engine is computing now, and the waits that let a request reuse one."""

    def __init__(self, enabled: bool = True) -> None:
        self.enabled = enabled
        self._computing: dict[str, list[_Computing]] = {}

    def _holder(self, req: Shared, known: int) -> tuple[_Computing, int] | None:
        """The request in flight on the engine that holds most of this prompt beyond what is
        cached (`known` tokens), with the tokens waiting for it would save."""
        best: tuple[_Computing, int] | None = None
        for other in self._computing.get(req.engine, []):
            shared = req.shared_tokens(other.prefix)
            if shared < WORTH_WAITING_TOKENS:
                continue
            if req.keeps_copies:
                # The shared start is cached already, unless this one is computing it now.
                if other.known_tokens >= shared or known >= shared:
                    continue
            elif req.cached_tokens > shared:
                # Its own longer prompt (its session's last turn) is cached. One no longer than
                # the shared part may be the very one the holder took: upstream moves a cached
                # prompt into the one slot that loads it.
                continue
            if best is None or shared > best[1]:
                best = (other, shared)
        return best

    async def _wait_for_holders(self, req: Shared) -> int:
        """Wait while a request in flight is computing this prompt's start, within the bound;
        the tokens of the prompt cached somewhere once the wait ends."""
        known = req.cached_tokens
        if not self.enabled or not req.prefix.fingerprints or not req.prompt_speed:
            return known
        while (found := self._holder(req, known)) is not None:
            holder, gain = found
            # Past the holder's prompt, waiting costs at most what recomputing would.
            deadline = holder.prompt_done_at + gain / req.prompt_speed
            left = deadline - time.monotonic()
            if left <= 0:
                return known
            try:
                await asyncio.wait_for(holder.done.wait(), left)
            except TimeoutError:
                return known
            known = max(known, gain)
        return known

    @asynccontextmanager
    async def turn(self, req: Shared) -> AsyncIterator[float]:
        """Wait for a request computing this prompt's start, then count this one as computing
        its prompt until the context ends; yields the seconds waited."""
        asked = time.monotonic()
        known = await self._wait_for_holders(req)
        # Registered in the same step the wait ended: requests released together see each
        # other (and, on upstream llama-server, go one at a time).
        now = time.monotonic()
        uncached = max(req.prompt_tokens - known, 0)
        seconds = uncached / req.prompt_speed if req.prompt_speed else 0.0
        mine = _Computing(req.prefix, known, now + seconds)
        computing = self._computing.setdefault(req.engine, [])
        computing.append(mine)
        try:
            yield now - asked
        finally:
            computing.remove(mine)
            if not computing:
                del self._computing[req.engine]
            mine.done.set()
