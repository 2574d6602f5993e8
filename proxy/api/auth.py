"""Optional API keys: Bearer tokens or x-api-key, compared in constant time, never logged."""

from __future__ import annotations

import hmac

from aiohttp import web

from proxy.api.errors import ApiError, Handler

# Health and metrics stay open so load balancers and Prometheus need no secret; `/` says only
# what this server is (Claude Code checks it with a HEAD before sending its key). The status
# page shows what /health and /metrics do, and the last requests' routes, never their text:
# a browser sends no key.
OPEN_PATHS = frozenset({"/", "/health", "/metrics", "/ui", "/ui/live"})


def api_key_middleware(keys: list[bytes]) -> web.middleware:  # type: ignore[valid-type]
    """A middleware that answers 401 unless the request carries one of keys."""

    @web.middleware
    async def require_api_key(request: web.Request, handler: Handler) -> web.StreamResponse:
        if request.path in OPEN_PATHS:
            return await handler(request)
        scheme, _, token = request.headers.get("Authorization", "").partition(" ")
        # Anthropic clients send the key as x-api-key; either header may carry it.
        offered = [
            token.strip().encode() if scheme.lower() == "bearer" else b"",
            request.headers.get("x-api-key", "").encode(),
        ]
        # Compare against every key so timing does not reveal which one nearly matched.
        matched = False
        for candidate in offered:
            for key in keys:
                matched |= bool(candidate) and hmac.compare_digest(candidate, key)
        if not matched:
            raise ApiError(
                401,
                "missing or invalid API key; send the header `Authorization: Bearer <key>` "
                "(OpenAI clients: api_key=...) or `x-api-key: <key>` (Anthropic clients)",
                code="invalid_api_key",
            )
        return await handler(request)

    return require_api_key
