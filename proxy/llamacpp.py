"""llama.cpp's protocol in one place: its `timings` object, metric names and defaults."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any, Final

from prometheus_client.parser import text_string_to_metric_families

# llama-server's --spec-draft-n-max when none is given.
DEFAULT_DRAFT_N_MAX: Final = 3
# The draft lengths `specproxy bench` sweeps (the lab's "best n-max").
DRAFT_N_MAX_SWEEP: Final = (2, 4, 8, 16)
METRIC_PREFIX: Final = "llamacpp:"


def _count(raw: Mapping[str, Any], key: str) -> int:
    value = raw.get(key, 0)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0
    return max(int(value), 0)


def _rate(raw: Mapping[str, Any], key: str) -> float:
    value = raw.get(key)
    if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value):
        return 0.0
    return max(float(value), 0.0)


@dataclass(frozen=True)
class Timings:
    """What llama-server measured for one answer (its `timings` object), parsed once.

    Absent or malformed fields read as 0: `draft_n` and `draft_n_accepted` appear only when
    drafts were made, and a stream cut early may carry none at all.
    """

    predicted_n: int = 0
    predicted_ms: float = 0.0
    tokens_per_s: float = 0.0
    prompt_n: int = 0
    prompt_ms: float = 0.0
    cache_n: int = 0
    draft_n: int = 0
    draft_n_accepted: int = 0

    @classmethod
    def parse(cls, raw: object) -> Timings:
        """From llama-server's JSON `timings` (anything else gives empty timings)."""
        if not isinstance(raw, Mapping):
            return cls()
        return cls(
            predicted_n=_count(raw, "predicted_n"),
            predicted_ms=_rate(raw, "predicted_ms"),
            tokens_per_s=_rate(raw, "predicted_per_second"),
            prompt_n=_count(raw, "prompt_n"),
            prompt_ms=_rate(raw, "prompt_ms"),
            cache_n=_count(raw, "cache_n"),
            draft_n=_count(raw, "draft_n"),
            draft_n_accepted=_count(raw, "draft_n_accepted"),
        )

    @property
    def measured(self) -> bool:
        """Whether these timings carry a generation speed."""
        return self.tokens_per_s > 0

    @property
    def acceptance(self) -> float | None:
        """Share of drafted tokens the target accepted; None when nothing was drafted."""
        return self.draft_n_accepted / self.draft_n if self.draft_n else None

    @property
    def prompt_s(self) -> float:
        """Seconds spent on the prompt (llama-server's view of time to first token)."""
        return self.prompt_ms / 1000


def metric_values(text: str, name: str) -> list[tuple[dict[str, str], float]]:
    """Every sample named `name` in Prometheus text, with its labels (llama-server's metrics or
    the proxy's re-export of them)."""
    return [
        (sample.labels, sample.value)
        for family in text_string_to_metric_families(text)
        for sample in family.samples
        if sample.name == name
    ]


def metric_value(text: str, name: str, **labels: str) -> float:
    """The sum of the samples named `name` whose labels include `labels` (0 when absent)."""
    return sum(
        value
        for have, value in metric_values(text, name)
        if all(have.get(k) == v for k, v in labels.items())
    )


def requests_held(metrics_text: str) -> int:
    """Requests a llama-server holds, from its /metrics: processing in a slot plus deferred
    (waiting for one)."""
    held = metric_value(metrics_text, f"{METRIC_PREFIX}requests_processing") + metric_value(
        metrics_text, f"{METRIC_PREFIX}requests_deferred"
    )
    return max(int(held), 0)


def slots_processing(slots: object) -> int | None:
    """Slots processing a request, from llama-server's /slots; None for anything but its list."""
    if not isinstance(slots, list):
        return None
    return sum(1 for s in slots if isinstance(s, dict) and s.get("is_processing"))


def slot_context(props: object) -> int | None:
    """Tokens one request may hold on a llama-server, from its /props; None if it does not say."""
    settings = props.get("default_generation_settings") if isinstance(props, dict) else None
    n_ctx = settings.get("n_ctx") if isinstance(settings, dict) else None
    if isinstance(n_ctx, bool) or not isinstance(n_ctx, int) or n_ctx <= 0:
        return None
    return n_ctx
