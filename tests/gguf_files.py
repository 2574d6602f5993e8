"""GGUF files written by tests: a vocabulary and nothing else, all the vocabulary checks read."""

from __future__ import annotations

from pathlib import Path

import gguf

TOKENS = [f"tok{i}" for i in range(200)]


def vocab_file(
    path: Path,
    tokens: list[str] = TOKENS,
    tokenizer: str = "gpt2",
    bos: int = 0,
    eos: int = 1,
) -> Path:
    """A GGUF that holds only a vocabulary: all the vocabulary checks read."""
    writer = gguf.GGUFWriter(str(path), "llama")
    writer.add_tokenizer_model(tokenizer)
    writer.add_token_list(tokens)
    writer.add_bos_token_id(bos)
    writer.add_eos_token_id(eos)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return path
