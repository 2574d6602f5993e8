"""Whether a prompt fits a backend's context: counted by llama-server only when it may not."""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

import aiohttp

from proxy.api.errors import ApiError
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


def answer_budget(body: Mapping[str, Any]) -> int | None:
    """The most tokens the client lets the answer have, in whichever API's name for it."""
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict"):
        value = body.get(key)
        if isinstance(value, int) and not isinstance(value, bool) and value > 0:
            return value
    return None
