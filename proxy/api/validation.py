"""Checks on request bodies, so bad input gets a clear 400 before it reaches a backend."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Literal

from proxy.api.errors import ApiError

Endpoint = Literal["chat", "completions"]
Check = Callable[[Any], dict[str, Any]]
MAX_TOKENS_LIMIT = 1_000_000
_TOKEN_LIMITS = ("max_tokens", "max_completion_tokens", "max_output_tokens", "n_predict")


def _bad(message: str, param: str | None = None, code: str = "invalid_value") -> ApiError:
    return ApiError(400, message, code=code, param=param)


def validate_body(raw: Any, endpoint: Endpoint) -> dict[str, Any]:
    """The body as a dict if it is a usable request for this endpoint; else raise a 400."""
    body = check_object(raw)
    if endpoint == "chat":
        _check_messages(body.get("messages"))
        _check_chat_tools(body.get("tools"))
    else:
        _check_prompt(body.get("prompt"))
    _check_sampling(body)
    n = body.get("n")
    if n is not None and n != 1:
        raise _bad("`n` must be 1: llama-server returns one choice per request", "n", "unsupported")
    options = body.get("stream_options")
    if options is not None and not isinstance(options, dict):
        raise _bad("`stream_options` must be an object", "stream_options")
    return body


def check_chat(body: Any) -> dict[str, Any]:
    """POST /v1/chat/completions."""
    return validate_body(body, "chat")


def check_completions(body: Any) -> dict[str, Any]:
    """POST /v1/completions and llama.cpp's own /completion."""
    return validate_body(body, "completions")


def check_responses(raw: Any) -> dict[str, Any]:
    """POST /v1/responses: `input` as text or a list of items."""
    body = check_responses_input(raw)
    _check_responses_tools(body.get("tools"))
    _check_sampling(body)
    return body


def check_responses_input(raw: Any) -> dict[str, Any]:
    """A Responses body's `input`, `instructions` and conversation state."""
    body = check_object(raw)
    value = body.get("input")
    if not (isinstance(value, str) or (isinstance(value, list) and value)):
        raise _bad("`input` must be a string or a non-empty list of input items", "input")
    if isinstance(value, list) and not all(isinstance(item, dict) for item in value):
        raise _bad("every `input` item must be an object such as {role, content}", "input")
    for i, item in enumerate(value if isinstance(value, list) else []):
        content = item.get("content")
        for j, part in enumerate(content if isinstance(content, list) else []):
            texty = isinstance(part, dict) and part.get("type") in ("input_text", "output_text")
            if texty and not isinstance(part.get("text"), str):
                where = f"input[{i}].content[{j}].text"
                raise _bad(f"`{where}` must be a string", where)
    instructions = body.get("instructions")
    if instructions is not None and not isinstance(instructions, str):
        raise _bad("`instructions` must be a string", "instructions")
    if body.get("previous_response_id"):
        raise _bad(
            "`previous_response_id` is not supported: llama-server keeps no responses; "
            "send the whole conversation in `input`",
            "previous_response_id",
            "unsupported",
        )
    return body


def check_messages(raw: Any) -> dict[str, Any]:
    """POST /v1/messages (Anthropic): `messages` of user and assistant turns."""
    body = check_anthropic_messages(raw)
    _check_sampling(body)
    return body


# Claude Code sends `role: "system"` messages inside `messages` besides the top-level
# `system`; llama-server passes them on to the chat template, so they are accepted.
_ANTHROPIC_ROLES = ("user", "assistant", "system")


def check_anthropic_messages(raw: Any) -> dict[str, Any]:
    """An Anthropic body's `system` and `messages`."""
    body = check_object(raw)
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise _bad("`messages` must be a non-empty list of {role, content} objects", "messages")
    for i, message in enumerate(messages):
        where = f"messages.{i}"
        if not isinstance(message, dict) or message.get("role") not in _ANTHROPIC_ROLES:
            raise _bad(f"{where}: `role` must be user, assistant or system", f"{where}.role")
        content = message.get("content")
        if not (isinstance(content, str) or _are_blocks(content)):
            raise _bad(
                f"{where}: `content` must be a string or a list of content blocks with a `type` "
                '(text blocks: {"type": "text", "text": "..."})',
                f"{where}.content",
            )
    system = body.get("system")
    if system is not None and not (isinstance(system, str) or _are_blocks(system)):
        raise _bad("`system` must be a string or a list of text blocks", "system")
    return body


def _are_blocks(content: Any) -> bool:
    """Anthropic content blocks: each with a `type`, and text blocks with their text."""
    return isinstance(content, list) and all(
        isinstance(b, dict)
        and isinstance(b.get("type"), str)
        and (b["type"] != "text" or isinstance(b.get("text"), str))
        for b in content
    )


def check_infill(raw: Any) -> dict[str, Any]:
    """POST /infill (llama.cpp's FIM): the code before and after the cursor."""
    body = check_object(raw)
    for key in ("input_prefix", "input_suffix"):
        if not isinstance(body.get(key), str):
            raise _bad(f"`{key}` must be a string (the code before/after the cursor)", key)
    prompt = body.get("prompt")
    if prompt is not None and not isinstance(prompt, str):
        raise _bad("`prompt` must be a string (text to put after the middle token)", "prompt")
    extra = body.get("input_extra")
    if extra is not None:
        ok = isinstance(extra, list) and all(
            isinstance(chunk, dict)
            and isinstance(chunk.get("text"), str)
            and isinstance(chunk.get("filename", ""), str)
            for chunk in extra
        )
        if not ok:
            raise _bad(
                '`input_extra` must be a list of {"filename": string, "text": string}',
                "input_extra",
            )
    _check_sampling(body)
    return body


def check_object(body: Any) -> dict[str, Any]:
    """Any JSON object, with `model`, if present, a string."""
    if not isinstance(body, dict):
        raise _bad("the request body must be a JSON object", code="invalid_json")
    model = body.get("model")
    if model is not None and not isinstance(model, str):
        raise _bad('`model` must be a string such as "auto" or a backend name', "model")
    return body


def check_tokenize(raw: Any) -> dict[str, Any]:
    """POST /tokenize: `content` as text (or text mixed with token ids)."""
    body = check_object(raw)
    content = body.get("content")
    if not (isinstance(content, str) or _list_of(content, str | int)):
        raise _bad("`content` must be a string", "content")
    return body


def check_detokenize(raw: Any) -> dict[str, Any]:
    """POST /detokenize: `tokens`, a list of token ids."""
    body = check_object(raw)
    tokens = body.get("tokens")
    if not isinstance(tokens, list) or not all(
        isinstance(t, int) and not isinstance(t, bool) and t >= 0 for t in tokens
    ):
        raise _bad("`tokens` must be a list of token ids (integers from 0)", "tokens")
    return body


def check_chat_messages(raw: Any) -> dict[str, Any]:
    """/apply-template and /v1/chat/completions/input_tokens: a chat's `messages`."""
    body = check_object(raw)
    _check_messages(body.get("messages"))
    _check_chat_tools(body.get("tools"))
    return body


def check_embeddings(raw: Any) -> dict[str, Any]:
    """POST /v1/embeddings: `input` as text or a list of texts."""
    body = check_object(raw)
    value = body.get("input")
    if not (isinstance(value, str) or (_list_of(value, str | int | list) and value)):
        raise _bad("`input` must be a string or a non-empty list of strings", "input")
    return body


def _list_of(value: Any, kind: Any) -> bool:
    return isinstance(value, list) and all(
        isinstance(v, kind) and not isinstance(v, bool) for v in value
    )


def _check_prompt(prompt: Any) -> None:
    ok = isinstance(prompt, str) or (
        isinstance(prompt, list) and prompt and all(isinstance(p, str | int) for p in prompt)
    )
    if not ok:
        raise _bad("`prompt` must be a non-empty string or list of strings", "prompt")


def _check_sampling(body: dict[str, Any]) -> None:
    for key in _TOKEN_LIMITS:
        value = body.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise _bad(f"`{key}` must be an integer", key)
        if not 1 <= value <= MAX_TOKENS_LIMIT:
            raise _bad(f"`{key}` must be between 1 and {MAX_TOKENS_LIMIT}, got {value}", key)
    stream = body.get("stream")
    if stream is not None and not isinstance(stream, bool):
        raise _bad("`stream` must be true or false", "stream")
    for key in ("temperature", "top_p"):
        value = body.get(key)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise _bad(f"`{key}` must be a number", key)


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
        if role == "assistant":
            _check_tool_calls(message.get("tool_calls"), where)
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


def _named(value: Any) -> bool:
    return isinstance(value, dict) and isinstance(value.get("name"), str) and bool(value["name"])


def _tools(tools: Any) -> list[tuple[int, dict[str, Any]]]:
    """`tools`, absent or a list of objects, numbered."""
    if tools is None:
        return []
    if not isinstance(tools, list):
        raise _bad("`tools` must be a list of tools", "tools")
    for i, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise _bad(f"`tools[{i}]` must be an object", f"tools[{i}]")
    return list(enumerate(tools))


def _check_chat_tools(tools: Any) -> None:
    """Chat `tools`: function tools as {"type": "function", "function": {"name": ...}}."""
    for i, tool in _tools(tools):
        if tool.get("type", "function") == "function" and not _named(tool.get("function")):
            raise _bad(
                f'`tools[{i}].function` must be an object with a `name`, as in {{"type": '
                '"function", "function": {"name": "read_file", "parameters": {...}}}',
                f"tools[{i}].function",
            )


def _check_tool_calls(calls: Any, where: str) -> None:
    """An assistant turn's `tool_calls`: each names the function it called."""
    if calls is None:
        return
    if not isinstance(calls, list):
        raise _bad(f"{where}.tool_calls must be a list", f"{where}.tool_calls")
    for j, call in enumerate(calls):
        if not (isinstance(call, dict) and _named(call.get("function"))):
            at = f"{where}.tool_calls[{j}]"
            raise _bad(
                f"{at} must be an object whose `function` has a `name` (and its `arguments`)",
                f"{at}.function",
            )


def _check_responses_tools(tools: Any) -> None:
    """Responses `tools`: function tools carry their `name` at the top level."""
    for i, tool in _tools(tools):
        if tool.get("type") == "function" and not _named(tool):
            raise _bad(
                f'`tools[{i}]` is a function tool without a `name`: {{"type": "function", '
                '"name": "shell", "parameters": {...}}',
                f"tools[{i}].name",
            )
