"""Pre-start checks on a real, provisioned GGUF file."""

from __future__ import annotations

import pytest

from proxy.config import default_cache_dir
from proxy.gguf import read_gguf_info, vocab_mismatch

MODELS = default_cache_dir() / "models"
SMOL = MODELS / "smollm2-135m-instruct-q4_1.gguf"

needs_smollm2 = pytest.mark.skipif(
    not SMOL.is_file(), reason="SmolLM2 not provisioned; run `make test`"
)


@needs_smollm2
def test_header_facts_of_a_real_model() -> None:
    smol = read_gguf_info(SMOL)
    assert (smol.architecture, smol.tokenizer_model, smol.n_tokens) == ("llama", "gpt2", 49_152)
    assert not smol.has_mtp_head
    assert vocab_mismatch(smol, smol) is None
