"""One backend's configuration: the llama-server it is, or the servers it reaches."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from proxy.llamacpp import DEFAULT_DRAFT_N_MAX

# draft-ngram: n-gram lookup drafts where it finds a match, the draft model everywhere else.
BackendKind = Literal["plain", "draft-simple", "ngram", "draft-ngram", "draft-mtp"]
# The kinds that draft with a separate draft model.
DRAFT_MODEL_KINDS = ("draft-simple", "draft-ngram")
# copy-json (specproxy's build): copies from the conversation's text through JSON escaping.
NgramVariant = Literal[
    "ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "copy-json"
]
# The speculators that draft only for a request naming them (speculative.types).
NAMED_ONLY_SPECULATORS = ("copy-json",)
# Each n-gram speculator's longest draft in llama.cpp (common_speculative_n_max): ngram-mod's
# n_max, the map speculators' m-gram size; copy-json shares ngram-mod's.
NGRAM_DRAFT_CAP = {
    "ngram-simple": 48,
    "ngram-mod": 64,
    "ngram-map-k": 48,
    "ngram-map-k4v": 48,
    "ngram-cache": 8,
    "copy-json": 64,
}
GpuLayers = int | Literal["auto", "all"]
# `auto` and `auto-<task class>` route; a backend may not take such a name.
_ROUTING_ID_RE = re.compile(r"^auto(-.*)?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _http_url(url: str) -> str:
    if not re.match(r"^https?://[^/\s]+", url):
        raise ValueError(f"url {url!r} must look like http://host:port")
    return url.rstrip("/")


class BackendConfig(BaseModel):
    """One llama-server backend: supervised (model given) or external (url given)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(description="id for pinning (`model`), metrics and logs")
    kind: BackendKind = Field(
        default="plain",
        description="`plain`, `draft-simple`, `ngram`, `draft-ngram` (n-gram lookup where it "
        "finds a match, the draft model elsewhere), `draft-mtp`",
    )
    ngram_variant: NgramVariant = Field(
        default="ngram-mod",
        description="the n-gram speculator: `ngram-mod`, `ngram-simple`, `ngram-map-k`, "
        "`ngram-map-k4v`, `ngram-cache`, or specproxy's `copy-json` (copies the conversation's "
        "text into JSON strings and out of them; docs/configuration.md, section copy-json)",
    )
    model: str | None = Field(
        default=None, description="catalog model name or path to a .gguf file (target model)"
    )
    draft_model: str | None = Field(
        default=None, description="catalog model name or .gguf path of the draft / MTP head"
    )
    draft_n_max: int | None = Field(
        default=None, ge=1, le=64, description="longest draft (`--spec-draft-n-max`)"
    )
    draft_n_min: int | None = Field(
        default=None, ge=0, le=64, description="shortest draft (`--spec-draft-n-min`)"
    )
    draft_p_min: float | None = Field(
        default=None,
        ge=0.0,
        le=1.0,
        description="a draft stops below this probability (`--spec-draft-p-min`)",
    )
    gpu_layers: GpuLayers | None = Field(
        default=None, description="layers offloaded to the GPU (`-ngl`): a number, auto, all"
    )
    draft_gpu_layers: GpuLayers | None = Field(
        default=None, description="the draft model's offloaded layers (`--spec-draft-ngl`)"
    )
    draft_device: str | None = Field(
        default=None, description="the draft model's device (`--spec-draft-device`)"
    )
    threads: int | None = Field(
        default=None,
        ge=1,
        description="`-t`; on `cpu` also the backend's share of the device (all its cores "
        "when unset)",
    )
    device: str | None = Field(
        default=None,
        description="the device it decodes on, shared with the backends that name the same one "
        "(default: cpu, or cuda:0 when gpu_layers offloads layers; each external server its own)",
    )
    ctx_size: int = Field(default=4096, ge=128, description="context tokens (`-c`)")
    parallel: int = Field(
        default=1, ge=1, le=256, description="slots: requests decoding at once (`-np`)"
    )
    kv_unified: bool = Field(
        default=False,
        description="one KV cache shared by all slots, so each request may use the whole "
        "ctx_size (llama-server --kv-unified); otherwise each slot gets ctx_size / parallel",
    )
    batch_size: int | None = Field(
        default=None,
        ge=32,
        description="prompt tokens per llama-server step (--batch-size): a cancelled prompt "
        "stops at the end of its step, so a smaller one frees the device sooner",
    )
    cache_ram_mib: int | None = Field(
        default=None,
        ge=-1,
        description="RAM for llama-server's prompt cache of idle slots (`--cache-ram`; its "
        "default is 8192 MiB per process, 0 disables it); scripts/prompt_cache_size.py "
        "measures what a config's backends need for agents' prompts",
    )
    max_concurrency: int | None = Field(
        default=None, ge=1, description="requests sent at once (default: parallel)"
    )
    extra_args: list[str] = Field(
        default_factory=list, description="any other llama-server flags, as a list"
    )
    engine: str | None = Field(
        default=None,
        description="backends naming the same engine are served by one llama-server: one copy "
        "of the weights, one batch, one prompt cache; each request carries its backend's "
        "speculation. They must agree on everything but kind and the draft settings",
    )
    specproxy_build: bool = Field(
        default=False,
        description="for `url` / `urls`: the servers run specproxy's own llama-server build "
        "(its container image does), so connections to them are kept and a client may set "
        "speculation per request (a backend the proxy starts: read from its binary)",
    )
    repair_tool_calls: bool = Field(
        default=True,
        description="an answer that is only tool calls written as text (a fenced ```json "
        "block, bare JSON, `<tools>`, `<tool_call>`), each naming a declared tool with "
        "arguments its schema accepts, reaches the client as those calls (docs/surfaces.md, "
        "Tool calls written as text); false leaves every answer as the model wrote it",
    )
    url: str | None = Field(default=None, description="an already running llama-server")
    urls: list[str] | None = Field(
        default=None,
        min_length=1,
        description="replicas: llama-servers all serving this configuration; a host name stands "
        "for every address it resolves to (re-resolved every resolve_interval_s)",
    )

    @field_validator("name")
    @classmethod
    def _name_is_an_id(cls, name: str) -> str:
        if not _NAME_RE.match(name):
            raise ValueError(
                f"backend name {name!r} must be 1-64 characters of letters, digits, '.', '_', '-'"
            )
        if _ROUTING_ID_RE.match(name):
            raise ValueError(f"backend name {name!r} is reserved for routing; choose another")
        return name

    @field_validator("url")
    @classmethod
    def _url_is_http(cls, url: str | None) -> str | None:
        return None if url is None else _http_url(url)

    @field_validator("urls")
    @classmethod
    def _urls_are_http(cls, urls: list[str] | None) -> list[str] | None:
        if urls is None:
            return None
        checked = [_http_url(u) for u in urls]
        dupes = sorted({u for u in checked if checked.count(u) > 1})
        if dupes:
            raise ValueError(f"urls must be different servers; repeated: {', '.join(dupes)}")
        return checked

    @model_validator(mode="after")
    def _complete_for_its_kind(self) -> BackendConfig:
        if self.url is not None and self.urls is not None:
            raise ValueError(
                f"backend {self.name!r}: set either `url` (one server) or `urls` (replicas), "
                "not both"
            )
        if self.url is None and self.urls is None and self.model is None:
            raise ValueError(
                f"backend {self.name!r}: set `model` (a catalog name or .gguf path) to have the "
                "proxy start llama-server, or `url` / `urls` to use ones already running"
            )
        if not self.supervised and self.model is not None:
            raise ValueError(
                f"backend {self.name!r}: set either `model` or `url` / `urls`, not both"
            )
        if self.supervised and self.kind in DRAFT_MODEL_KINDS and self.draft_model is None:
            raise ValueError(
                f"backend {self.name!r}: kind {self.kind} needs `draft_model` (a model with the "
                "target's vocabulary, e.g. qwen2.5-coder-0.5b for qwen2.5-coder-1.5b)"
            )
        if self.kind in ("plain", "ngram") and self.draft_model is not None:
            raise ValueError(
                f"backend {self.name!r}: kind {self.kind} uses no draft model; remove "
                "`draft_model` or set kind: draft-simple"
            )
        return self

    @property
    def request_context(self) -> int:
        """Tokens one request may hold (prompt and answer) as configured: llama-server's
        per-slot context before it reads the model."""
        return self.ctx_size if self.kv_unified else self.ctx_size // self.parallel

    @property
    def n_max(self) -> int:
        """Tokens drafted per step: the configured draft_n_max or llama-server's default."""
        return self.draft_n_max or DEFAULT_DRAFT_N_MAX

    @property
    def draft_cap(self) -> int:
        """The longest draft its process makes (0 for plain decoding): a request may ask for a
        shorter one, never a longer."""
        return max((NGRAM_DRAFT_CAP.get(s, self.n_max) for s in self.speculators), default=0)

    @property
    def spec_type(self) -> str | None:
        """The llama-server `--spec-type` this backend runs, None for plain decoding."""
        if self.kind == "plain":
            return None
        if self.kind == "ngram":
            return self.ngram_variant
        if self.kind == "draft-ngram":
            return f"{self.ngram_variant},draft-simple"
        return self.kind

    @property
    def speculators(self) -> list[str]:
        """Each speculator this backend drafts with (llama-server's names); none for plain."""
        return [] if self.spec_type is None else self.spec_type.split(",")

    @property
    def names_its_speculators(self) -> bool:
        """Whether its requests must name their speculators: one of them (copy-json) drafts only
        for a request that does, even on a process of its own."""
        return any(s in NAMED_ONLY_SPECULATORS for s in self.speculators)

    @property
    def device_name(self) -> str:
        """The device this backend decodes on: configured, else derived from where it runs."""
        if self.device is not None:
            return self.device
        if not self.supervised:
            # Replicas are each their own device (proxy/backends/external.py); this is the first.
            return f"url:{self.replica_urls[0]}"
        if self.gpu_layers is not None and self.gpu_layers != 0:
            return "cuda:0"
        return "cpu"

    @property
    def supervised(self) -> bool:
        """Whether the proxy starts and owns this backend's process."""
        return self.url is None and self.urls is None

    @property
    def replica_urls(self) -> list[str]:
        """The external servers as configured (`url` is one replica); none when supervised."""
        return [self.url] if self.url is not None else list(self.urls or [])


# What one llama-server process is: backends sharing an engine must agree on all of it.
ENGINE_FIELDS = (
    "model",
    "threads",
    "gpu_layers",
    "device",
    "ctx_size",
    "parallel",
    "kv_unified",
    "batch_size",
    "cache_ram_mib",
    "max_concurrency",
    "extra_args",
    "draft_gpu_layers",
    "draft_device",
)
