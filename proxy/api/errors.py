"""Errors in every API's shape: one exception type, its OpenAI and Anthropic bodies and stream
events, llama-server's errors read back, and a middleware that renders every failure."""

from __future__ import annotations

import json
import uuid
from collections.abc import Awaitable, Callable, Mapping
from typing import Any

from aiohttp import web

from proxy.log import get_logger

log = get_logger("api")
# Where the error middleware keeps the request's id for the handler (the request's own storage).
REQUEST_ID = web.RequestKey("request_id", str)
_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "invalid_request_error",
    429: "rate_limit_error",
    502: "upstream_error",
    503: "service_unavailable",
    504: "timeout_error",
}
ANTHROPIC_PATH = "/v1/messages"
# Anthropic's documented error types by status; the status itself is kept as it is.
_ANTHROPIC_TYPES = {
    400: "invalid_request_error",
    401: "authentication_error",
    403: "permission_error",
    404: "not_found_error",
    405: "invalid_request_error",
    413: "request_too_large",
    429: "rate_limit_error",
    500: "api_error",
    502: "api_error",
    503: "overloaded_error",
    504: "timeout_error",
}


def is_anthropic_path(path: str) -> bool:
    """Whether a request path belongs to the Anthropic Messages API, so errors take its shape."""
    return path == ANTHROPIC_PATH or path.startswith(ANTHROPIC_PATH + "/")


class ApiError(Exception):
    """An error the client should see, with its HTTP status and OpenAI error fields."""

    def __init__(
        self,
        status: int,
        message: str,
        code: str,
        param: str | None = None,
        headers: Mapping[str, str] | None = None,
    ) -> None:
        super().__init__(message)
        self.status = status
        self.message = message
        self.code = code
        self.param = param
        self.headers = dict(headers or {})

    @property
    def type(self) -> str:
        """OpenAI's error type for the status."""
        return _TYPES.get(
            self.status, "api_error" if self.status >= 500 else "invalid_request_error"
        )

    def payload(self) -> dict[str, object]:
        """The JSON body OpenAI clients parse."""
        return {
            "error": {
                "message": self.message,
                "type": self.type,
                "param": self.param,
                "code": self.code,
            }
        }

    def anthropic_payload(self) -> dict[str, object]:
        """The JSON body Anthropic clients parse."""
        kind = _ANTHROPIC_TYPES.get(
            self.status, "api_error" if self.status >= 500 else "invalid_request_error"
        )
        return {"type": "error", "error": {"type": kind, "message": self.message}}

    def response(self, anthropic_shape: bool = False) -> web.Response:
        """As an aiohttp response, in OpenAI's shape or Anthropic's."""
        payload = self.anthropic_payload() if anthropic_shape else self.payload()
        return web.Response(
            status=self.status,
            body=json.dumps(payload),
            content_type="application/json",
            headers=self.headers,
        )

    def openai_event(self) -> bytes:
        """An OpenAI-shaped `data: {"error": ...}` event (llama.cpp's own shape mid-stream too)."""
        return b"data: " + json.dumps(self.payload()).encode() + b"\n\n"

    def anthropic_event(self) -> bytes:
        """An `error` event for a Messages stream that fails after it started."""
        return b"event: error\ndata: " + json.dumps(self.anthropic_payload()).encode() + b"\n\n"


def from_upstream(data: Any, status: int = 500, raw: bytes = b"") -> ApiError:
    """llama-server's error, a whole answer's body or a mid-stream event, as an ApiError.

    It says `{"error": {"code": 500, "message": ..., "type": ...}}`, or `{"error": "..."}`; a
    status inside it (mid-stream, where the HTTP status is already 200) wins over `status`.
    """
    err = data.get("error", data) if isinstance(data, Mapping) else None
    if isinstance(err, Mapping):
        code, message, kind = err.get("code"), err.get("message"), err.get("type")
    else:
        code, message, kind = None, err, None
    if isinstance(code, int) and not isinstance(code, bool) and 400 <= code < 600:
        status = code
    if not isinstance(message, str) or not message:
        message = raw.decode("utf-8", "replace")[:500] or f"the backend answered {status}"
    return ApiError(status, message, code=str(kind or "server_error"))


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render ApiError, aiohttp's errors and unexpected exceptions as OpenAI (or Anthropic) errors.

    Paths of the Anthropic Messages API get Anthropic's shape, with the same status codes.
    """
    shape = is_anthropic_path(request.path)
    # Named here, before anything can fail, so every answer carries it: errors included.
    request_id = request[REQUEST_ID] = request.headers.get("X-Request-Id") or uuid.uuid4().hex[:16]
    response = await _rendered(request, handler, shape)
    if not response.prepared:  # a stream sent its headers, the id among them, when it began
        response.headers.setdefault("X-Request-Id", request_id)
    return response


async def _rendered(request: web.Request, handler: Handler, shape: bool) -> web.StreamResponse:
    """The handler's response, or its error in the API's shape."""
    try:
        return await handler(request)
    except ApiError as exc:
        return exc.response(shape)
    except web.HTTPException as exc:
        if exc.status < 400:
            raise
        message = {
            404: f"no route {request.method} {request.path}; the API lives under /v1 "
            "(chat/completions, completions, responses, messages, models) and llama.cpp's "
            "/infill, /completion, /tokenize, /detokenize, /apply-template",
            405: f"{request.method} is not allowed on {request.path}",
            413: "request body too large",
        }.get(exc.status, exc.reason)
        code = exc.reason.lower().replace(" ", "_")
        return ApiError(exc.status, message, code=code).response(shape)
    except Exception:
        log.exception("unhandled error", path=request.path)
        return ApiError(
            500, "internal proxy error; see the proxy log", code="internal_error"
        ).response(shape)
