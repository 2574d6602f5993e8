"""Checks on OpenAI request bodies, so bad input gets a clear 400 before it reaches a backend."""

from __future__ import annotations

from typing import Any, Literal

from proxy.api.errors import ApiError

Endpoint = Literal["chat", "completions"]
MAX_TOKENS_LIMIT = 1_000_000


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code=code, param=param)


def validate_body(body: Any, endpoint: Endpoint) -> dict[str, Any]:
    """The body as a dict if it is a usable request for this endpoint; else raise a 400."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad('`model` must be a string such as "auto" or a backend name', "model")
    if endpoint == "chat":
        _check_messages(body.get("messages"))
    else:
        prompt = body.get("prompt")
        ok = isinstance(prompt, str) or (
            isinstance(prompt, list) and prompt and all(isinstance(p, str | int) for p in prompt)
        )
        if not ok:
            raise _bad("`prompt` must be a non-empty string or list of strings", "prompt")
    for key in ("max_tokens", "max_completion_tokens", "n_predict"):
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(f"`{key}` must be an integer", key)
        if not 1 <= value <= MAX_TOKENS_LIMIT:
            raise _bad(f"`{key}` must be between 1 and {MAX_TOKENS_LIMIT}, got {value}", key)
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad("`n` must be 1: llama-server returns one choice per request", "n", "unsupported")
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("`stream` must be true or false", "stream")
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _bad(f"`{key}` must be a number", key)
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("`stream_options` must be an object", "stream_options")
    return body


def _check_messages(messages: Any) -> None:
    if not isinstance(messages, list) or not messages:
        raise _bad("`messages` must be a non-empty list of {role, content} objects", "messages")
    for i, message in enumerate(messages):
        where = f"messages[{i}]"
        if not isinstance(message, dict):
            raise _bad(f"{where} must be an object with `role` and `content`", where)
        role = message.get("role")
        if role not in ("system", "developer", "user", "assistant", "tool"):
            raise _bad(
                f"{where}.role must be system, developer, user, assistant or tool; got {role!r}",
                f"{where}.role",
            )
        content = message.get("content")
        if content is None and role == "assistant":
            continue
        if isinstance(content, str):
            continue
        if isinstance(content, list) and all(isinstance(p, dict) for p in content):
            continue
        raise _bad(
            f"{where}.content must be a string or a list of content parts", f"{where}.content"
        )
