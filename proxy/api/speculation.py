"""A client's own `speculative.*` fields: honoured on a pinned backend of specproxy's build,
checked against what that backend runs; refused on `auto`, where speculation is the router's."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from proxy.api.errors import ApiError
from proxy.backends.strategy import Strategy

PREFIX = "speculative."
N_MAX = "speculative.n_max"
TYPES = "speculative.types"


def client_fields(body: Mapping[str, Any]) -> dict[str, Any]:
    """The `speculative.*` fields a client set."""
    return {k: v for k, v in body.items() if k.startswith(PREFIX)}


def refuse_on_auto(fields: Mapping[str, Any]) -> None:
    """auto chooses each request's speculation, so a client's would contradict its choice."""
    if fields:
        raise ApiError(
            400,
            f"{', '.join(sorted(fields))}: speculation settings apply to a backend you pin "
            "(`model`: a backend's name, see /v1/models); with auto the proxy chooses them. "
            "Pin a backend or leave them out",
            code="invalid_value",
            param=sorted(fields)[0],
        )


def checked(fields: Mapping[str, Any], backend: Strategy) -> dict[str, Any]:
    """The fields as the pinned backend's llama-server takes them, or a 400 saying why not."""
    if not fields:
        return {}
    unknown = sorted(set(fields) - {N_MAX, TYPES})
    if unknown:
        raise ApiError(
            400,
            f"{', '.join(unknown)} is not supported; a request may set {N_MAX} (its longest "
            f"draft, 0 = no speculation) and {TYPES} (which of the backend's speculators draft)",
            code="invalid_value",
            param=unknown[0],
        )
    if not backend.spec.our_build:
        raise ApiError(
            400,
            f"backend {backend.name!r} is a llama-server specproxy did not build, which ignores "
            f"per-request speculation; remove {', '.join(sorted(fields))}",
            code="invalid_value",
            param=sorted(fields)[0],
        )
    out: dict[str, Any] = {}
    if N_MAX in fields:
        n_max = fields[N_MAX]
        if isinstance(n_max, bool) or not isinstance(n_max, int) or n_max < 0:
            raise ApiError(
                400,
                f"{N_MAX} must be a whole number of tokens, 0 or more (0 = no speculation)",
                code="invalid_value",
                param=N_MAX,
            )
        out[N_MAX] = n_max
    if TYPES in fields:
        names = fields[TYPES]
        if isinstance(names, str):
            names = [n.strip() for n in names.split(",")]
        loaded = backend.spec.config.speculators
        if (
            not isinstance(names, list)
            or not names
            or not all(isinstance(n, str) for n in names)
            or not set(names) <= set(loaded)
        ):
            runs = ", ".join(loaded) or "none (it decodes without speculation)"
            raise ApiError(
                400,
                f"{TYPES} must name speculators backend {backend.name!r} runs: {runs}",
                code="invalid_value",
                param=TYPES,
            )
        out[TYPES] = names
    return out


def merged(strategy: Mapping[str, Any], client: Mapping[str, Any]) -> dict[str, Any]:
    """A strategy's own fields with a client's checked ones: the client may narrow its
    speculators and shorten its drafts, never turn on what the strategy leaves off."""
    out = {**strategy, **client}
    if N_MAX in strategy and N_MAX in client:
        out[N_MAX] = min(strategy[N_MAX], client[N_MAX])
    return out
