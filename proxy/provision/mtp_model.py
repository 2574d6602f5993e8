"""Write a tiny glm4moe GGUF whose built-in MTP head drafts with a dialable acceptance rate."""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any

import gguf
import numpy as np

from proxy.gguf import read_gguf_header

TINY_MTP_GENERATOR_VERSION = 1

_ARCH = "glm4moe"
_N_EMBD = 128
_N_HEAD = 2
_HEAD_DIM = 64
_N_FF = 256
_N_FF_EXP = 128
_N_EXPERT = 2
_N_TRUNK = 2
# The nextn (MTP) block is stored as the last block and counted in block_count.
_MTP_BLOCK = _N_TRUNK

# llama.cpp token types: only NORMAL tokens may be predicted (see _tensors).
_TOKEN_TYPE_NORMAL = 1


def write_tiny_mtp_model(
    path: Path, tokenizer_source: Path, *, eh_proj_noise: float = 0.0, seed: int = 0
) -> None:
    """Write the model to ``path`` atomically.

    The trunk's attention and FFN outputs are zero, so it is a bigram model: the next token
    depends only on the current one. With ``eh_proj`` = [I | 0] the MTP head sees only the
    embedding of the token it was handed and so predicts exactly what the trunk will; gaussian
    noise of std ``eh_proj_noise`` on ``eh_proj`` lowers acceptance smoothly (about 0.01 → 0.7,
    0.04 → 0.1). The tokenizer and chat template are copied from ``tokenizer_source``.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp_name = tempfile.mkstemp(prefix=path.name + ".", suffix=".tmp", dir=path.parent)
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        writer = gguf.GGUFWriter(tmp, _ARCH)
        try:
            token_types = _copy_tokenizer(writer, tokenizer_source)
            _add_hparams(writer, n_vocab=len(token_types))
            rng = np.random.default_rng(seed)
            for name, array in _tensors(rng, token_types, eh_proj_noise).items():
                writer.add_tensor(name, array)
            writer.write_header_to_file()
            writer.write_kv_data_to_file()
            writer.write_tensors_to_file()
        finally:
            writer.close()
        # mkstemp creates the file 0600; the server may run as another user.
        tmp.chmod(0o644)
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)


def _copy_tokenizer(writer: gguf.GGUFWriter, source: Path) -> np.ndarray[Any, Any]:
    """Copy every ``tokenizer.*`` key (vocab, merges, chat template); return the token types."""
    token_types: np.ndarray[Any, Any] | None = None
    header = read_gguf_header(source, keep_array=lambda key: key.startswith("tokenizer."))
    for key, value in header.kv.items():
        if not key.startswith("tokenizer."):
            continue
        vtype, element = header.types[key]
        writer.add_key_value(
            key,
            value,
            gguf.GGUFValueType(vtype),
            None if element is None else gguf.GGUFValueType(element),
        )
        if key == "tokenizer.ggml.token_type":
            token_types = np.asarray(value, dtype=np.int32)
    if token_types is None:
        raise ValueError(f"{source} has no tokenizer.ggml.token_type")
    return token_types


def _add_hparams(writer: gguf.GGUFWriter, *, n_vocab: int) -> None:
    writer.add_name("specproxy tiny MTP")
    writer.add_vocab_size(n_vocab)
    writer.add_context_length(4096)
    writer.add_embedding_length(_N_EMBD)
    writer.add_block_count(_N_TRUNK + 1)
    writer.add_nextn_predict_layers(1)
    writer.add_leading_dense_block_count(_N_TRUNK)
    writer.add_feed_forward_length(_N_FF)
    writer.add_expert_feed_forward_length(_N_FF_EXP)
    writer.add_head_count(_N_HEAD)
    writer.add_head_count_kv(_N_HEAD)
    writer.add_key_length(_HEAD_DIM)
    writer.add_value_length(_HEAD_DIM)
    writer.add_rope_dimension_count(_HEAD_DIM // 2)
    writer.add_layer_norm_rms_eps(1e-5)
    # The MTP graph asserts its block is MoE, so the smallest valid MoE it is.
    writer.add_expert_count(_N_EXPERT)
    writer.add_expert_used_count(1)
    writer.add_expert_shared_count(1)
    writer.add_expert_weights_scale(1.0)
    writer.add_expert_weights_norm(True)
    writer.add_expert_gating_func(gguf.ExpertGatingFuncType.SIGMOID)


def _tensors(
    rng: np.random.Generator, token_types: np.ndarray[Any, Any], eh_proj_noise: float
) -> dict[str, np.ndarray[Any, Any]]:
    """Tensors in numpy order (the reverse of ggml's ``ne``)."""
    n_vocab = len(token_types)

    def rand(*shape: int) -> np.ndarray[Any, Any]:
        return (rng.standard_normal(shape) * 0.1).astype(np.float32)

    def zeros(*shape: int) -> np.ndarray[Any, Any]:
        return np.zeros(shape, dtype=np.float32)

    def ones(n: int) -> np.ndarray[Any, Any]:
        return np.ones(n, dtype=np.float32)

    output = rng.standard_normal((n_vocab, _N_EMBD)).astype(np.float16)
    # A zero row scores 0 while the best of ~49k random rows scores well above it, so the
    # bigram chain never reaches EOS or a control token and every reply runs to max_tokens.
    output[token_types != _TOKEN_TYPE_NORMAL] = 0
    tensors: dict[str, np.ndarray[Any, Any]] = {
        "token_embd.weight": rng.standard_normal((n_vocab, _N_EMBD)).astype(np.float16),
        "output_norm.weight": ones(_N_EMBD),
        # Untied, so the head is not argmax(e·e), which would always repeat the input token.
        "output.weight": output,
    }
    n_qkv = _N_HEAD * _HEAD_DIM
    for bid in range(_N_TRUNK + 1):
        blk = f"blk.{bid}."
        tensors |= {
            blk + "attn_norm.weight": ones(_N_EMBD),
            blk + "attn_q.weight": rand(n_qkv, _N_EMBD),
            blk + "attn_k.weight": rand(n_qkv, _N_EMBD),
            blk + "attn_v.weight": rand(n_qkv, _N_EMBD),
            # Zero output projections reduce every block to its residual path.
            blk + "attn_output.weight": zeros(_N_EMBD, n_qkv),
            blk + "post_attention_norm.weight": ones(_N_EMBD),
        }
        if bid < _N_TRUNK:
            tensors |= {
                blk + "ffn_gate.weight": rand(_N_FF, _N_EMBD),
                blk + "ffn_up.weight": rand(_N_FF, _N_EMBD),
                blk + "ffn_down.weight": zeros(_N_EMBD, _N_FF),
            }
    blk = f"blk.{_MTP_BLOCK}."
    # [I | 0] keeps the token embedding and drops the trunk's hidden state, which (being the
    # previous token's) would otherwise make the head predict a skip-gram.
    eh_proj = np.hstack([np.eye(_N_EMBD), np.zeros((_N_EMBD, _N_EMBD))])
    eh_proj += rng.standard_normal(eh_proj.shape) * eh_proj_noise
    tensors |= {
        blk + "ffn_gate_inp.weight": rand(_N_EXPERT, _N_EMBD),
        blk + "exp_probs_b.bias": zeros(_N_EXPERT),
        blk + "ffn_gate_exps.weight": rand(_N_EXPERT, _N_FF_EXP, _N_EMBD),
        blk + "ffn_up_exps.weight": rand(_N_EXPERT, _N_FF_EXP, _N_EMBD),
        blk + "ffn_down_exps.weight": zeros(_N_EXPERT, _N_EMBD, _N_FF_EXP),
        blk + "ffn_gate_shexp.weight": rand(_N_FF_EXP, _N_EMBD),
        blk + "ffn_up_shexp.weight": rand(_N_FF_EXP, _N_EMBD),
        blk + "ffn_down_shexp.weight": zeros(_N_EMBD, _N_FF_EXP),
        blk + "nextn.eh_proj.weight": eh_proj.astype(np.float32),
        blk + "nextn.enorm.weight": ones(_N_EMBD),
        blk + "nextn.hnorm.weight": ones(_N_EMBD),
        blk + "nextn.shared_head_norm.weight": ones(_N_EMBD),
    }
    return tensors
