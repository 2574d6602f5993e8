"""Pre-start checks on real GGUF files, and the llama-server command line for each kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.backends.gguf_info import GgufError, read_gguf_info, vocab_mismatch
from proxy.backends.launch import BackendConfigError, llama_server_argv, prepare_backend
from proxy.config import BackendConfig, Settings, default_cache_dir

pytestmark = pytest.mark.integration

MODELS = default_cache_dir() / "models"
SMOL = MODELS / "smollm2-135m-instruct-q4_1.gguf"
QWEN_05 = MODELS / "qwen2.5-coder-0.5b-instruct-q4_k_m.gguf"
QWEN_15 = MODELS / "qwen2.5-coder-1.5b-instruct-q4_k_m.gguf"
GEMMA = MODELS / "gemma-3-270m-base-q4_k_m.gguf"

needs_models = pytest.mark.skipif(
    not all(p.is_file() for p in (SMOL, QWEN_05, QWEN_15, GEMMA)),
    reason="models not provisioned; run `make test`",
)


@needs_models
def test_header_facts_of_real_models() -> None:
    smol, qwen = read_gguf_info(SMOL), read_gguf_info(QWEN_15)
    assert (smol.architecture, smol.n_tokens) == ("llama", 49_152)
    assert (qwen.architecture, qwen.n_tokens) == ("qwen2", 151_936)
    assert not smol.has_mtp_head and not qwen.has_mtp_head


@needs_models
def test_the_qwen_pair_and_self_drafting_are_compatible() -> None:
    assert vocab_mismatch(read_gguf_info(QWEN_15), read_gguf_info(QWEN_05)) is None
    assert vocab_mismatch(read_gguf_info(SMOL), read_gguf_info(SMOL)) is None


@needs_models
@pytest.mark.parametrize(("target", "draft"), [(QWEN_15, SMOL), (SMOL, GEMMA), (GEMMA, QWEN_05)])
def test_wrong_pairs_are_refused(target: Path, draft: Path) -> None:
    assert vocab_mismatch(read_gguf_info(target), read_gguf_info(draft))


@needs_models
def test_wrong_pair_error_names_both_files(tmp_path: Path) -> None:
    cfg = BackendConfig(name="bad", kind="draft-simple", model=str(QWEN_15), draft_model=str(SMOL))
    settings = Settings(backends=[cfg], cache_dir=tmp_path)
    with pytest.raises(BackendConfigError) as exc:
        prepare_backend(cfg, settings, Path("/bin/true"))
    message = str(exc.value)
    assert (
        str(QWEN_15) in message
        and str(SMOL) in message
        and "vocabulary sizes 49152 and 151936" in message
    )


@needs_models
def test_draft_mtp_needs_an_mtp_head(tmp_path: Path) -> None:
    cfg = BackendConfig(name="mtp", kind="draft-mtp", model=str(SMOL))
    with pytest.raises(BackendConfigError, match="no MTP head"):
        prepare_backend(cfg, Settings(backends=[cfg], cache_dir=tmp_path), Path("/bin/true"))


def test_not_a_gguf_file(tmp_path: Path) -> None:
    fake = tmp_path / "model.gguf"
    fake.write_bytes(b"PK\x03\x04 this is a zip")
    with pytest.raises(GgufError, match="not a GGUF file"):
        read_gguf_info(fake)
    empty = tmp_path / "empty.gguf"
    empty.write_bytes(b"")
    with pytest.raises(GgufError):
        read_gguf_info(empty)


def test_missing_model_file_lists_catalog(tmp_path: Path) -> None:
    cfg = BackendConfig(name="x", model=str(tmp_path / "nope.gguf"))
    with pytest.raises(BackendConfigError, match=r"qwen2\.5-coder-1\.5b"):
        prepare_backend(cfg, Settings(backends=[cfg], cache_dir=tmp_path), Path("/bin/true"))


def _argv(**kw: object) -> list[str]:
    cfg = BackendConfig.model_validate({"name": "b", "model": "m", **kw})
    draft = Path("/m/draft.gguf") if cfg.draft_model else None
    return llama_server_argv(Path("/bin/ls"), cfg, Path("/m/t.gguf"), draft, "127.0.0.1", 5000)


def test_argv_plain_is_loopback_with_metrics_and_no_speculation() -> None:
    argv = _argv(threads=2, ctx_size=2048, parallel=2)
    joined = " ".join(argv)
    assert "--host 127.0.0.1 --port 5000 --metrics" in joined
    assert "--ctx-size 2048 --parallel 2 --threads 2" in joined
    assert "--alias b" in joined and "--spec-type" not in argv


def test_argv_draft_simple() -> None:
    argv = _argv(
        kind="draft-simple",
        draft_model="d",
        draft_n_max=8,
        draft_n_min=1,
        draft_p_min=0.5,
        gpu_layers="all",
        draft_gpu_layers=0,
        draft_device="none",
        extra_args=["--flash-attn", "on"],
    )
    joined = " ".join(argv)
    assert "--spec-type draft-simple --spec-draft-model /m/draft.gguf" in joined
    assert "--spec-draft-n-max 8 --spec-draft-n-min 1 --spec-draft-p-min 0.5" in joined
    assert "--n-gpu-layers all" in joined and "--spec-draft-ngl 0" in joined
    assert "--spec-draft-device none" in joined
    assert argv[-2:] == ["--flash-attn", "on"]


@pytest.mark.parametrize(
    "variant", ["ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache"]
)
def test_argv_ngram_variants(variant: str) -> None:
    argv = _argv(kind="ngram", ngram_variant=variant)
    assert argv[argv.index("--spec-type") + 1] == variant
    assert "--spec-draft-model" not in argv


def test_argv_mtp_in_the_target_and_as_a_sidecar() -> None:
    assert "--spec-draft-model" not in _argv(kind="draft-mtp")
    sidecar = _argv(kind="draft-mtp", draft_model="mtp-head")
    assert "--spec-type draft-mtp --spec-draft-model /m/draft.gguf" in " ".join(sidecar)
