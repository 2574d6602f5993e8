"""The configurations the lab compares, derived from the configured backends."""

from __future__ import annotations

from dataclasses import dataclass

from proxy.backend_config import BackendConfig
from proxy.llamacpp import DRAFT_N_MAX_SWEEP


@dataclass(frozen=True)
class Variant:
    """One row group of the table: a backend configuration and how the table names it."""

    label: str
    config: BackendConfig
    sweep: bool = False

    @property
    def is_plain(self) -> bool:
        """Whether this is the no-speculation baseline."""
        return self.config.kind == "plain"


def _label(cfg: BackendConfig) -> str:
    if cfg.kind == "plain":
        return "plain"
    if cfg.kind == "ngram":
        return cfg.ngram_variant
    if cfg.kind in ("draft-simple", "draft-ngram"):
        return f"{cfg.kind} n-max {cfg.n_max}"
    return f"draft-mtp n-max {cfg.n_max}"


def lab_variants(
    backends: list[BackendConfig], n_max_sweep: tuple[int, ...] = DRAFT_N_MAX_SWEEP
) -> list[Variant]:
    """Every configured backend, plus each draft-simple backend at every n-max of the sweep."""
    variants: list[Variant] = []
    seen: set[str] = set()
    for cfg in backends:
        label = _label(cfg) if cfg.supervised else f"{cfg.name} (external)"
        if label in seen:
            label = f"{label} [{cfg.name}]"
        seen.add(label)
        variants.append(Variant(label, cfg))
        if cfg.kind != "draft-simple" or not cfg.supervised:
            continue
        for n in n_max_sweep:
            if n == cfg.n_max:
                continue
            swept = cfg.model_copy(update={"name": f"{cfg.name}-n{n}", "draft_n_max": n})
            variants.append(Variant(f"draft-simple n-max {n}", swept, sweep=True))
    return sorted(variants, key=lambda v: (not v.is_plain,))
