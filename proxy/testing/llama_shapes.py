"""What llama-server b11434 answers, rendered for n tokens `w0 w1 ...` without a model: the
bodies and SSE events of each surface the proxy relays, `timings`, /props, /slots, /metrics and
/v1/models, as the stubs of proxy/testing send them."""

from __future__ import annotations

import json
import time
from collections.abc import Callable
from typing import Any

MODEL = "stub.gguf"  # what the stubs call their model, and answer for a request naming none
PROMPT_N = 5  # the prompt tokens every answer says it read
BUILD = "b11434-stub"  # llama-server's build, as /props and `system_fingerprint` give it

# The timings of a count of tokens; how a surface answers n tokens whole (body, n, timings)
# and as a stream (body, n, the timings of a count of tokens).
Timings = Callable[[int], dict[str, Any]]
Whole = Callable[[dict[str, Any], int, dict[str, Any]], dict[str, Any]]
Events = Callable[[dict[str, Any], int, Timings], list[bytes]]


def text(n: int) -> str:
    return " ".join(f"w{i}" for i in range(n))


def model_of(body: dict[str, Any]) -> str:
    return str(body.get("model") or MODEL)


def sse(data: dict[str, Any], name: str | None = None) -> bytes:
    head = f"event: {name}\n" if name else ""
    return f"{head}data: {json.dumps(data)}\n\n".encode()


def error(code: int, message: str, kind: str) -> dict[str, Any]:
    return {"error": {"code": code, "message": message, "type": kind}}


def usage(n: int) -> dict[str, int]:
    return {"prompt_tokens": PROMPT_N, "completion_tokens": n, "total_tokens": n + PROMPT_N}


# ---------------------------------------------------------------- chat and text completions


def chat_whole(model: str, n: int, timings: dict[str, Any], chat: bool) -> dict[str, Any]:
    """A non-streamed chat completion (or text completion when not chat)."""
    choice: dict[str, Any] = (
        {"index": 0, "message": {"role": "assistant", "content": text(n)}}
        if chat
        else {"index": 0, "text": text(n)}
    )
    choice["finish_reason"] = "length"
    return {
        "id": "chatcmpl-stub",
        "object": "chat.completion" if chat else "text_completion",
        "created": int(time.time()),
        "model": model,
        "system_fingerprint": BUILD,
        "choices": [choice],
        "usage": usage(n),
        "timings": timings,
    }


def chat_events(
    model: str,
    n: int,
    timings_of: Timings,
    *,
    chat: bool,
    role: bool = False,
    with_usage: bool = False,
    per_token: bool = False,
) -> list[dict[str, Any]]:
    """A streamed completion's events, [DONE] aside: the role-only chunk when `role` (chat),
    one chunk per token (with running timings when `per_token`), the closing chunk with
    `timings`, then the usage chunk when asked."""
    created = int(time.time())

    def chunk(delta: dict[str, Any], piece: str, finish: str | None) -> dict[str, Any]:
        choice: dict[str, Any] = (
            {"index": 0, "delta": delta, "finish_reason": finish}
            if chat
            else {"index": 0, "text": piece, "finish_reason": finish}
        )
        return {
            "id": "chatcmpl-stub",
            "object": "chat.completion.chunk" if chat else "text_completion",
            "created": created,
            "model": model,
            "system_fingerprint": BUILD,
            "choices": [choice],
        }

    events = [chunk({"role": "assistant", "content": None}, "", None)] if role and chat else []
    for i in range(n):
        event = chunk({"content": f"w{i} "}, f"w{i} ", None)
        if per_token:
            event["timings"] = timings_of(i + 1)
        events.append(event)
    final = {**chunk({}, "", "length"), "timings": timings_of(n)}
    events.append(final)
    if with_usage:
        events.append({**final, "choices": [], "usage": usage(n)})
    return events


# ---------------------------------------------------------------- the other surfaces


def _native_whole(body: dict[str, Any], n: int, timings: dict[str, Any]) -> dict[str, Any]:
    return {
        "content": text(n),
        "stop": True,
        "stop_type": "limit",
        "tokens_predicted": n,
        "tokens_evaluated": PROMPT_N,
        "timings": timings,
    }


def _native_events(body: dict[str, Any], n: int, timings_of: Timings) -> list[bytes]:
    # /completion and /infill stream bare `data:` lines and no [DONE].
    pieces = [sse({"content": f"w{i} ", "stop": False}) for i in range(n)]
    return [
        *pieces,
        sse({"content": "", "stop": True, "stop_type": "limit", "timings": timings_of(n)}),
    ]


def _messages_whole(body: dict[str, Any], n: int, timings: dict[str, Any]) -> dict[str, Any]:
    return {
        "id": "msg_stub",
        "type": "message",
        "role": "assistant",
        "model": model_of(body),
        "content": [{"type": "text", "text": text(n)}],
        "stop_reason": "max_tokens",
        "stop_sequence": None,
        "usage": {"input_tokens": PROMPT_N, "output_tokens": n},
    }


def _messages_events(body: dict[str, Any], n: int, timings_of: Timings) -> list[bytes]:
    start = {**_messages_whole(body, 0, {}), "content": [], "stop_reason": None}
    block = {
        "type": "content_block_start",
        "index": 0,
        "content_block": {"type": "text", "text": ""},
    }
    stop = {"stop_reason": "max_tokens", "stop_sequence": None}
    return [
        sse({"type": "message_start", "message": start}, "message_start"),
        sse(block, "content_block_start"),
        *(
            sse(
                {
                    "type": "content_block_delta",
                    "index": 0,
                    "delta": {"type": "text_delta", "text": f"w{i} "},
                },
                "content_block_delta",
            )
            for i in range(n)
        ),
        sse({"type": "content_block_stop", "index": 0}, "content_block_stop"),
        sse(
            {"type": "message_delta", "delta": stop, "usage": {"output_tokens": n}},
            "message_delta",
        ),
        sse({"type": "message_stop"}, "message_stop"),
    ]


def _response(body: dict[str, Any], n: int, status: str) -> dict[str, Any]:
    content = [{"type": "output_text", "text": text(n), "annotations": []}]
    message = {
        "type": "message",
        "id": "msg_stub",
        "role": "assistant",
        "status": status,
        "content": content,
    }
    return {
        "id": "resp_stub",
        "object": "response",
        "created_at": int(time.time()),
        "model": model_of(body),
        "status": status,
        "output": [message] if n else [],
        "usage": {"input_tokens": PROMPT_N, "output_tokens": n, "total_tokens": n + PROMPT_N},
    }


def _responses_whole(body: dict[str, Any], n: int, timings: dict[str, Any]) -> dict[str, Any]:
    return _response(body, n, "completed")


def _responses_events(body: dict[str, Any], n: int, timings_of: Timings) -> list[bytes]:
    # b11434 leaves out sequence_number, output_index and content_index: the proxy adds them.
    item = {
        "type": "message",
        "id": "msg_stub",
        "role": "assistant",
        "status": "in_progress",
        "content": [],
    }
    part = {"type": "output_text", "text": "", "annotations": []}
    done_part = {**part, "text": text(n)}

    def event(kind: str, **fields: Any) -> bytes:
        return sse({"type": kind, **fields}, kind)

    return [
        event("response.created", response=_response(body, 0, "in_progress")),
        event("response.output_item.added", item=item),
        event("response.content_part.added", item_id="msg_stub", part=part),
        *(
            event("response.output_text.delta", item_id="msg_stub", delta=f"w{i} ")
            for i in range(n)
        ),
        event("response.output_text.done", item_id="msg_stub", text=text(n)),
        event("response.content_part.done", item_id="msg_stub", part=done_part),
        event(
            "response.output_item.done",
            item={**item, "status": "completed", "content": [done_part]},
        ),
        event(
            "response.completed",
            response=_response(body, n, "completed"),
            timings=timings_of(n),
        ),
    ]


SURFACES: dict[str, tuple[Whole, Events]] = {
    "/completion": (_native_whole, _native_events),
    "/infill": (_native_whole, _native_events),
    "/v1/messages": (_messages_whole, _messages_events),
    "/v1/responses": (_responses_whole, _responses_events),
}


# ---------------------------------------------------------------- what a server reports


def props(n_ctx: int) -> dict[str, Any]:
    return {
        "default_generation_settings": {
            "n_ctx": n_ctx,
            "params": {"n_predict": -1, "temperature": 0.8, "top_k": 40},
        },
        "total_slots": 1,
        "model_alias": MODEL,
        "model_path": f"/stub/{MODEL}",
        "modalities": {"vision": False, "audio": False},
        "chat_template": "{{ messages }}",
        "build_info": BUILD,
    }


def slots(busy: int, n_ctx: int, speculative: bool, processed: int = 0) -> list[dict[str, Any]]:
    """One slot per request held (one when idle), the first `busy` of them processing, each
    with `processed` prompt tokens done."""
    return [
        {
            "id": i,
            "n_ctx": n_ctx,
            "is_processing": i < busy,
            "speculative": speculative,
            **(
                {"id_task": i, "n_prompt_tokens_processed": processed, "next_token": []}
                if i < busy
                else {}
            ),
        }
        for i in range(max(busy, 1))
    ]


def models(n_ctx: int) -> dict[str, Any]:
    return {
        "models": [{"name": MODEL, "model": MODEL, "type": "model", "capabilities": []}],
        "object": "list",
        "data": [
            {
                "id": MODEL,
                "object": "model",
                "created": int(time.time()),
                "owned_by": "llamacpp",
                "meta": {"n_ctx_train": n_ctx, "n_vocab": 32000, "n_params": 0},
            }
        ],
    }


def metrics(held: int, answered: int, generated: int) -> str:
    """llama-server's /metrics (with --metrics): token counters and the requests it holds."""
    return (
        "# HELP llamacpp:prompt_tokens_total Number of prompt tokens processed.\n"
        "# TYPE llamacpp:prompt_tokens_total counter\n"
        f"llamacpp:prompt_tokens_total {answered * PROMPT_N}\n"
        "# HELP llamacpp:tokens_predicted_total Number of generation tokens processed.\n"
        "# TYPE llamacpp:tokens_predicted_total counter\n"
        f"llamacpp:tokens_predicted_total {generated}\n"
        "# HELP llamacpp:requests_processing Number of requests processing.\n"
        "# TYPE llamacpp:requests_processing gauge\n"
        f"llamacpp:requests_processing {held}\n"
        "# HELP llamacpp:requests_deferred Number of requests deferred.\n"
        "# TYPE llamacpp:requests_deferred gauge\n"
        "llamacpp:requests_deferred 0\n"
    )


def limited(body: dict[str, Any], tokens: int) -> int:
    """The tokens an answer holds: `tokens`, fewer if the request asks for fewer."""
    for key in ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict"):
        limit = body.get(key)
        if isinstance(limit, int) and not isinstance(limit, bool) and limit > 0:
            return min(tokens, limit)
    return tokens
