"""Whether a prompt fits a backend's context (counted by llama-server only when it may not),
and which backends have room for it now."""

from __future__ import annotations

import dataclasses
import json
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

import aiohttp

from proxy.api.errors import ApiError
from proxy.api.surfaces import Surface
from proxy.backends.strategy import Strategy
from proxy.tokens import FEW_CHARS_PER_TOKEN

# llama-server's own counters of a request's prompt tokens, by surface (the chat template and
# tool definitions included, as the slot will see them).
COUNT_PATHS: Mapping[str, str] = {
    "chat": "/v1/chat/completions/input_tokens",
    "responses": "/v1/responses/input_tokens",
    "messages": "/v1/messages/count_tokens",
}
# Tokens a chat template and tool definitions may add beyond the body's own bytes.
_TEMPLATE_SLACK = 1024
_COUNT_TIMEOUT_S = 30.0
# KV tokens reserved for a request's answer beside its prompt (agents answer in hundreds).
ANSWER_RESERVE = 512


def estimate_tokens(body_bytes: int) -> int:
    """A generous guess at a short body's prompt tokens (it is never counted exactly)."""
    return body_bytes // FEW_CHARS_PER_TOKEN


def may_overflow(body_bytes: int, smallest_context: int) -> bool:
    """Whether a body this long might not fit the smallest context, so it is worth counting.

    Every token of these models' vocabularies is at least one byte of text, and the JSON body
    holds every byte of the text, so a body shorter than the context (less the template's few
    tokens) always fits and is never counted.
    """
    return body_bytes + _TEMPLATE_SLACK >= smallest_context


async def count_prompt_tokens(
    session: aiohttp.ClientSession, base_url: str, endpoint: str, body: Mapping[str, Any]
) -> int | None:
    """The prompt's tokens as a backend counts them; None when it cannot say."""
    path = COUNT_PATHS.get(endpoint)
    if path is None:
        return None
    counted = {k: v for k, v in body.items() if k not in ("stream", "stream_options")}
    try:
        async with session.post(
            base_url + path,
            data=json.dumps(counted),
            headers={"Content-Type": "application/json"},
            timeout=aiohttp.ClientTimeout(total=_COUNT_TIMEOUT_S),
        ) as resp:
            if resp.status != 200:
                return None
            data = await resp.json()
    except (aiohttp.ClientError, TimeoutError, ValueError):
        return None
    tokens = data.get("input_tokens") if isinstance(data, dict) else None
    return tokens if isinstance(tokens, int) and not isinstance(tokens, bool) else None


def too_long(tokens: int, largest_context: int, pinned: str | None) -> ApiError:
    """The one error for a prompt no backend can hold, with the counts; OpenAI's code for it,
    and a message Anthropic clients recognise ("prompt is too long")."""
    where = f"backend {pinned!r}" if pinned else "any backend"
    return ApiError(
        400,
        f"prompt is too long: {tokens} tokens > {largest_context} maximum. This request's "
        f"prompt has {tokens} tokens and {where} holds at most {largest_context} per request; "
        "shorten the conversation (compact it, drop old tool results) or give the backends a "
        "larger ctx_size (with kv_unified, each request may use all of it)",
        code="context_length_exceeded",
        param="messages",
    )


# Each API's name for the most tokens an answer may have.
BUDGET_KEYS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")


def answer_budget(body: Mapping[str, Any]) -> int | None:
    """The most tokens the client lets the answer have, in whichever API's name for it."""
    for key in BUDGET_KEYS:
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None


@dataclass(frozen=True)
class Fit:
    """The backends a request may go to, and the KV tokens it will hold on the one it takes."""

    backends: list[Strategy]
    tokens: int
    prompt_tokens: int = 0
    # Seconds spent waiting on llama-server counting the prompt.
    waited_s: float = 0.0

    def without(self, server: str) -> Fit:
        """The same fit without the backends served by `server` alone (it failed to connect);
        a backend with other replicas stays, and its admission skips the one marked down."""
        left = [b for b in self.backends if b.engine.server_urls != {server}]
        return dataclasses.replace(self, backends=left)


async def backends_that_fit(
    backends: Iterable[Strategy],
    session: aiohttp.ClientSession,
    surface: Surface,
    body: dict[str, Any],
    body_bytes: int,
    pinned: Strategy | None,
) -> Fit:
    """The backends whose context holds this request's prompt; a clear 400 when none can.

    Only a body long enough that it might not fit is counted (by llama-server, template and
    tools included), so short requests pay nothing; theirs is estimated from their size. Where
    the slots of a backend share one KV cache, those with room for the prompt beside the
    requests in flight come first (the backend's admission waits for room rather than let
    llama-server fail the request mid-prompt).
    """
    pool = list(backends)
    if not surface.generates:
        return Fit(pool, 0)
    known = [b.engine.n_ctx for b in pool if b.engine.ready and b.engine.n_ctx is not None]
    tokens = estimate_tokens(body_bytes)
    waited = 0.0
    if known and may_overflow(body_bytes, min(known)):
        ready = [b for b in pool if b.engine.ready]
        counter = pinned if pinned is not None and pinned.engine.ready else ready[0]
        counting = time.monotonic()
        counted = await count_prompt_tokens(
            session, counter.engine.base_url, surface.endpoint, body
        )
        waited += time.monotonic() - counting
        tokens = counted if counted is not None else tokens
        # llama-server refuses a prompt of n_ctx tokens or more; the answer may use the rest.
        fit = [b for b in pool if b.engine.n_ctx is None or b.engine.n_ctx > tokens]
        if pinned is not None and pinned not in fit:
            raise too_long(tokens, pinned.engine.n_ctx or 0, pinned.name)
        if not fit:
            raise too_long(tokens, max(known), None)
        pool = fit
    held = tokens + ANSWER_RESERVE
    if pinned is None:
        # Those with room beside the requests in flight first; where none has, the chosen
        # backend's admission waits for room.
        room = [
            b
            for b in pool
            if b.engine.context_free is None
            or b.engine.context_free >= min(held, b.engine.n_ctx or held)
        ]
        pool = room or pool
    return Fit(pool, held, tokens, waited)
