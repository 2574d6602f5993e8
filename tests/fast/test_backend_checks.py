"""Pre-start checks on generated GGUF files, and the llama-server command line for each kind."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.backend_config import BackendConfig
from proxy.backends.launch import BackendConfigError, llama_server_argv, prepare_backend
from proxy.config import Settings
from proxy.gguf import GgufError, read_gguf_info, vocab_mismatch
from tests.gguf_files import TOKENS, vocab_file


@pytest.fixture(scope="module")
def vocabs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("vocabs")
    renamed = [*TOKENS]
    renamed[7] = "other"
    return {
        "target": vocab_file(d / "target.gguf"),
        "copy": vocab_file(d / "copy.gguf"),
        "sibling": vocab_file(d / "sibling.gguf", [*TOKENS, *(f"x{i}" for i in range(100))]),
        "tokenizer": vocab_file(d / "spm.gguf", tokenizer="llama"),
        "size": vocab_file(d / "big.gguf", [*TOKENS, *(f"x{i}" for i in range(400))]),
        "special": vocab_file(d / "special.gguf", eos=2),
        "token": vocab_file(d / "token7.gguf", renamed),
    }


def test_same_vocabularies_draft_for_each_other(vocabs: dict[str, Path]) -> None:
    target = read_gguf_info(vocabs["target"])
    assert vocab_mismatch(target, read_gguf_info(vocabs["copy"])) is None
    # llama.cpp tolerates up to 128 extra tokens (Qwen2.5 0.5B and 1.5B differ in padding).
    assert vocab_mismatch(target, read_gguf_info(vocabs["sibling"])) is None


@pytest.mark.parametrize(
    ("draft", "why"),
    [
        ("tokenizer", "tokenizer 'llama' != 'gpt2'"),
        ("size", "vocabulary sizes 600 and 200 differ too much"),
        ("special", "BOS/EOS token ids differ"),
        ("token", "token 7 is 'other' in the draft but 'tok7' in the target"),
    ],
)
def test_wrong_pairs_are_refused_with_the_reason(
    vocabs: dict[str, Path], draft: str, why: str
) -> None:
    target = read_gguf_info(vocabs["target"])
    assert vocab_mismatch(target, read_gguf_info(vocabs[draft])) == why


def test_wrong_pair_error_names_both_files(vocabs: dict[str, Path], tmp_path: Path) -> None:
    target, draft = vocabs["target"], vocabs["size"]
    cfg = BackendConfig(name="bad", kind="draft-simple", model=str(target), draft_model=str(draft))
    settings = Settings(backends=[cfg], cache_dir=tmp_path)
    with pytest.raises(BackendConfigError) as exc:
        prepare_backend(cfg, settings, Path("/bin/true"))
    message = str(exc.value)
    assert str(target) in message and str(draft) in message
    assert "vocabulary sizes 600 and 200" in message and "same model family" in message


def test_draft_mtp_needs_an_mtp_head(vocabs: dict[str, Path], tmp_path: Path) -> None:
    cfg = BackendConfig(name="mtp", kind="draft-mtp", model=str(vocabs["target"]))
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
    "variant",
    ["ngram-simple", "ngram-mod", "ngram-map-k", "ngram-map-k4v", "ngram-cache", "copy-json"],
)
def test_argv_ngram_variants(variant: str) -> None:
    argv = _argv(kind="ngram", ngram_variant=variant)
    assert argv[argv.index("--spec-type") + 1] == variant
    assert "--spec-draft-model" not in argv


def test_argv_mtp_in_the_target_and_as_a_sidecar() -> None:
    assert "--spec-draft-model" not in _argv(kind="draft-mtp")
    sidecar = _argv(kind="draft-mtp", draft_model="mtp-head")
    assert "--spec-type draft-mtp --spec-draft-model /m/draft.gguf" in " ".join(sidecar)
