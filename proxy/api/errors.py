"""OpenAI-format errors: one exception type and a middleware that renders every failure."""

from __future__ import annotations

import json
from collections.abc import Awaitable, Callable, Mapping

from aiohttp import web

from proxy.api import anthropic
from proxy.log import get_logger

log = get_logger("api")
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

    def payload(self) -> dict[str, object]:
        """The JSON body OpenAI clients parse."""
        return {
            "error": {
                "message": self.message,
                "type": _TYPES.get(
                    self.status, "api_error" if self.status >= 500 else "invalid_request_error"
                ),
                "param": self.param,
                "code": self.code,
            }
        }

    def response(self, anthropic_shape: bool = False) -> web.Response:
        """As an aiohttp response, in OpenAI's shape or Anthropic's."""
        payload = anthropic.error_body(self.status, self.message) if anthropic_shape else None
        return web.Response(
            status=self.status,
            body=json.dumps(payload or self.payload()),
            content_type="application/json",
            headers=self.headers,
        )


def openai_error_event(status: int, message: str, code: str) -> bytes:
    """An OpenAI-shaped `data: {"error": ...}` event (llama.cpp's own shape mid-stream too)."""
    payload = ApiError(status, message, code=code).payload()
    return b"data: " + json.dumps(payload).encode() + b"\n\n"


Handler = Callable[[web.Request], Awaitable[web.StreamResponse]]


@web.middleware
async def openai_errors(request: web.Request, handler: Handler) -> web.StreamResponse:
    """Render ApiError, aiohttp's errors and unexpected exceptions as OpenAI (or Anthropic) errors.

    Paths of the Anthropic Messages API get Anthropic's shape, with the same status codes.
    """
    shape = anthropic.is_anthropic_path(request.path)
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
