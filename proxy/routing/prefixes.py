"""Prompt prefixes: which backend and server already hold the start of a request's prompt.

llama-server reuses a slot's KV cache for the longest prefix a new prompt shares with the one
the slot last processed, and finds an idle slot's prompt again in its RAM cache (`--cache-ram`).
An agent's turn repeats its last turn's prompt and adds a tool result, so on the backend that
served the last turn it costs seconds, and on any other the whole prompt again: minutes for
20 k tokens on a CPU.
"""

from __future__ import annotations

import hashlib
import json
import time
from collections import OrderedDict
from collections.abc import Collection, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from proxy.backends.engine import Placement
from proxy.tokens import TYPICAL_CHARS_PER_TOKEN

# Blocks of a long string (a `/v1/completions` prompt) are cut at this many characters, so two
# prompts that share the start of one string still share fingerprints.
_STRING_BLOCK = 2048
# Keys that change from turn to turn without changing what the model reads: Claude Code moves
# its `cache_control` markers to the newest messages on every turn.
_UNREAD_KEYS = frozenset({"cache_control", "id", "status"})
# The prompts each backend is taken to hold beyond its slots: llama-server keeps idle slots'
# prompts in RAM (--cache-ram) and restores them; the default's holds eight agent sessions'
# 20 k-token prompts and their side requests' shorter ones.
_KEPT_BEYOND_SLOTS = 16
# Below this many cached tokens a prefix saves less than a request's own overhead: such
# requests are spread over servers and slots by load, not held where they ran before.
WORTH_FOLLOWING_TOKENS = 256


def _canonical(value: Any) -> Any:
    """The part of a message the model reads, in one stable form."""
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in sorted(value.items()) if k not in _UNREAD_KEYS}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


def _blocks(body: Mapping[str, Any]) -> list[str]:
    """The prompt as an ordered list of blocks: system and tools first, then each message."""
    blocks: list[str] = []
    for key in ("system", "instructions", "tools", "functions"):
        if body.get(key):
            blocks.append(json.dumps(_canonical(body[key]), sort_keys=True))
    for key in ("messages", "input"):
        items = body.get(key)
        if isinstance(items, list):
            blocks += [json.dumps(_canonical(m), sort_keys=True) for m in items]
        elif isinstance(items, str):
            blocks += _cut(items)
    for key in ("input_extra", "prompt", "input_prefix"):
        value = body.get(key)
        if isinstance(value, str):
            blocks += _cut(value)
        elif isinstance(value, list):
            blocks.append(json.dumps(_canonical(value), sort_keys=True))
    return blocks


def _cut(text: str) -> list[str]:
    return [text[i : i + _STRING_BLOCK] for i in range(0, len(text), _STRING_BLOCK)]


@dataclass(frozen=True)
class PromptPrefix:
    """A prompt as cumulative fingerprints of its blocks, each with the characters up to it."""

    fingerprints: tuple[bytes, ...]
    ends: tuple[int, ...]

    @classmethod
    def of(cls, body: Mapping[str, Any]) -> PromptPrefix:
        """The prefix chain of a request body (chat, Messages, Responses, completions, infill)."""
        digest = hashlib.blake2b(digest_size=12)
        prints: list[bytes] = []
        ends: list[int] = []
        total = 0
        for block in _blocks(body):
            digest.update(block.encode("utf-8", "replace"))
            digest.update(b"\x00")
            total += len(block)
            prints.append(digest.copy().digest())
            ends.append(total)
        return cls(tuple(prints), tuple(ends))

    @property
    def chars(self) -> int:
        """Characters of the whole prompt as fingerprinted."""
        return self.ends[-1] if self.ends else 0

    def shared_chars(self, other: PromptPrefix) -> int:
        """Characters of the longest run of whole blocks both prompts start with."""
        lo, hi = 0, min(len(self.fingerprints), len(other.fingerprints))
        # Fingerprints are cumulative: equal at i means equal at every block before i.
        while lo < hi:
            mid = (lo + hi + 1) // 2
            if self.fingerprints[mid - 1] == other.fingerprints[mid - 1]:
                lo = mid
            else:
                hi = mid - 1
        return self.ends[lo - 1] if lo else 0


@dataclass
class _Held:
    prefix: PromptPrefix
    placement: Placement
    session: str | None
    at: float = field(default_factory=time.monotonic)


@dataclass(frozen=True)
class Cached:
    """What one backend holds of a prompt: tokens, and where they are."""

    tokens: int
    placement: Placement | None

    @property
    def worth_following(self) -> Placement | None:
        """The placement to prefer, where it holds enough of the prompt to matter."""
        return self.placement if self.tokens >= WORTH_FOLLOWING_TOKENS else None


class PrefixCache:
    """The prompts each backend processed lately, to route a request where its prefix is held.

    The proxy sees every prompt it sends, so it knows what a backend's slots were last given;
    what llama-server evicted since is not known, so each backend is taken to hold its last
    few prompts (its slots plus a few in its RAM cache) and no more.
    """

    def __init__(self) -> None:
        self._held: dict[str, OrderedDict[bytes, _Held]] = {}
        self._capacity: dict[str, int] = {}
        self._chars_per_token: dict[str, float] = {}
        self._sessions: dict[str, tuple[str, Placement]] = {}

    def cached(
        self,
        backend: str,
        prefix: PromptPrefix,
        urls: Collection[str],
        session: str | None = None,
    ) -> Cached:
        """Tokens of `prefix` this backend holds (0 if none), and the server that holds most.

        `urls`: the backend's servers now; a prompt held by one since gone (a restart moves a
        supervised backend's port) is held no more.
        """
        best_chars, where = 0, None
        for held in self._held.get(backend, {}).values():
            if held.placement.url not in urls:
                continue
            shared = prefix.shared_chars(held.prefix)
            if shared > best_chars:
                best_chars, where = shared, held.placement
        if session is not None and session in self._sessions and where is None:
            # The client's own key names the backend its session used, prefix changed or not.
            on, placement = self._sessions[session]
            if on == backend and placement.url in urls:
                where = placement
        return Cached(int(best_chars / self.chars_per_token(backend)), where)

    def record(
        self,
        backend: str,
        prefix: PromptPrefix,
        placement: Placement,
        prompt_tokens: int,
        slots: int,
        session: str | None = None,
    ) -> None:
        """Note that `backend` processed this prompt of `prompt_tokens` tokens at `placement`."""
        if not prefix.fingerprints:
            return
        held = self._held.setdefault(backend, OrderedDict())
        # A prompt this one extends says nothing this one does not: the slot moved on from it.
        for key, old in list(held.items()):
            if prefix.shared_chars(old.prefix) == old.prefix.chars:
                del held[key]
        held[prefix.fingerprints[-1]] = _Held(prefix, placement, session)
        held.move_to_end(prefix.fingerprints[-1])
        self._capacity[backend] = max(slots, 1) + _KEPT_BEYOND_SLOTS
        while len(held) > self._capacity[backend]:
            held.popitem(last=False)
        if prompt_tokens > 0 and prefix.chars > 0:
            self._chars_per_token[backend] = prefix.chars / prompt_tokens
        if session is not None:
            self._sessions[session] = (backend, placement)
            while len(self._sessions) > 4096:
                self._sessions.pop(next(iter(self._sessions)))

    def chars_per_token(self, backend: str) -> float:
        """Characters of this backend's fingerprinted prompts per token, as last measured."""
        return self._chars_per_token.get(backend, TYPICAL_CHARS_PER_TOKEN)

    def held_prompts(self, backend: str) -> Sequence[PromptPrefix]:
        """The prompts this backend is taken to hold, oldest first."""
        return [h.prefix for h in self._held.get(backend, {}).values()]


def session_key(body: Mapping[str, Any], headers: Mapping[str, str]) -> str | None:
    """The client's own name for its session, where it gives one.

    `x-session-affinity` (the header SGLang's and vLLM's routers read), OpenAI's
    `prompt_cache_key`, Anthropic's `metadata.user_id` (Claude Code puts its session id there).
    """
    header = headers.get("x-session-affinity")
    if header:
        return f"h:{header}"
    key = body.get("prompt_cache_key")
    if isinstance(key, str) and key:
        return f"k:{key}"
    metadata = body.get("metadata")
    if isinstance(metadata, Mapping):
        user = metadata.get("user_id")
        if isinstance(user, str) and user:
            return f"u:{user}"
    return None
