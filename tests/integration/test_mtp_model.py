"""The tiny MTP model: its layout, and llama-server drafting with it at a dialled acceptance."""

from __future__ import annotations

import json
import os
import subprocess
import urllib.error
import urllib.request
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import gguf
import numpy as np
import pytest

from proxy.gguf import read_gguf_header
from proxy.llamacpp import metric_value
from proxy.provision.mtp_model import write_tiny_mtp_model
from tests.helpers import free_port, wait_for

TOKENIZER_SOURCE = Path.home() / ".cache/specproxy/models/smollm2-135m-instruct-q4_1.gguf"
DEFAULT_SERVER = Path.home() / ".cache/specproxy/build-11434/bin/llama-server"


@pytest.fixture(scope="module")
def tokenizer_source() -> Path:
    if not TOKENIZER_SOURCE.is_file():
        pytest.skip(f"SmolLM2 GGUF (tokenizer source) not found at {TOKENIZER_SOURCE}")
    return TOKENIZER_SOURCE


@pytest.fixture(scope="module")
def llama_server() -> Path:
    binary = Path(os.environ.get("SPECPROXY_LLAMA_SERVER", DEFAULT_SERVER))
    if not binary.is_file():
        pytest.skip(f"llama-server not found at {binary} (set SPECPROXY_LLAMA_SERVER)")
    return binary


def test_layout_is_glm4moe_with_nextn_and_smollm_vocab(
    tmp_path: Path, tokenizer_source: Path
) -> None:
    model = tmp_path / "tiny-mtp.gguf"
    write_tiny_mtp_model(model, tokenizer_source)

    reader = gguf.GGUFReader(model)
    assert reader.fields["general.architecture"].contents() == "glm4moe"
    assert reader.fields["glm4moe.nextn_predict_layers"].contents() == 1
    n_layer = reader.fields["glm4moe.block_count"].contents()
    names = {t.name for t in reader.tensors}
    assert f"blk.{n_layer - 1}.nextn.eh_proj.weight" in names

    source = read_gguf_header(tokenizer_source, keep_array=lambda key: True).kv
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    assert len(tokens) == 49152
    assert tokens == source["tokenizer.ggml.tokens"]
    assert reader.fields["tokenizer.chat_template"].contents() == source["tokenizer.chat_template"]
    assert not list(tmp_path.glob("*.tmp")), "temporary file left behind"


def test_same_seed_same_bytes_and_noise_only_touches_eh_proj(
    tmp_path: Path, tokenizer_source: Path
) -> None:
    a, b, noisy = tmp_path / "a.gguf", tmp_path / "b.gguf", tmp_path / "noisy.gguf"
    write_tiny_mtp_model(a, tokenizer_source, seed=3)
    write_tiny_mtp_model(b, tokenizer_source, seed=3)
    write_tiny_mtp_model(noisy, tokenizer_source, seed=3, eh_proj_noise=0.01)
    assert a.read_bytes() == b.read_bytes()

    # Compared as bytes because GGUFReader takes seconds per file on this vocabulary.
    clean, dirty = np.fromfile(a, dtype=np.uint8), np.fromfile(noisy, dtype=np.uint8)
    assert clean.shape == dirty.shape
    diff = np.flatnonzero(clean != dirty)
    eh_proj_bytes = 128 * 256 * 4
    assert 0 < diff[-1] - diff[0] < eh_proj_bytes


def _get(url: str) -> tuple[int, str]:
    try:
        with urllib.request.urlopen(url, timeout=5) as resp:
            return resp.status, resp.read().decode()
    except urllib.error.HTTPError as e:
        with e:
            return e.code, e.read().decode()


def _tail(log: Path) -> str:
    return log.read_text(errors="replace")[-3000:]


@contextmanager
def _serve(binary: Path, model: Path, log: Path) -> Iterator[str]:
    port = free_port()
    cmd = [str(binary), "-m", str(model), "--spec-type", "draft-mtp", "--port", str(port),
           "--host", "127.0.0.1", "-t", "1", "-c", "1024", "--metrics"]  # fmt: skip
    base = f"http://127.0.0.1:{port}"
    with log.open("wb") as log_file:
        proc = subprocess.Popen(cmd, stdout=log_file, stderr=subprocess.STDOUT)

        def healthy() -> bool:
            if proc.poll() is not None:
                pytest.fail(f"llama-server exited {proc.returncode}:\n{_tail(log)}")
            return _get(base + "/health")[0] == 200

        try:
            # OSError: not listening yet.
            wait_for(healthy, 60, lambda: f"llama-server:\n{_tail(log)}", 0.1, (OSError,))
            yield base
        finally:
            proc.terminate()
            try:
                proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _chat(base: str) -> dict[str, Any]:
    body = {
        "messages": [{"role": "user", "content": "Tell me a story about a lighthouse keeper."}],
        "temperature": 0,
        "max_tokens": 48,
    }
    req = urllib.request.Request(
        base + "/v1/chat/completions",
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=60) as resp:
        result: dict[str, Any] = json.loads(resp.read())
        return result


def _acceptance(timings: dict[str, Any]) -> float:
    draft_n = int(timings.get("draft_n", 0))
    assert draft_n > 0, f"no drafting happened: {timings}"
    return float(timings["draft_n_accepted"]) / draft_n


def test_exact_mtp_head_is_accepted(
    tmp_path: Path, tokenizer_source: Path, llama_server: Path
) -> None:
    model = tmp_path / "exact.gguf"
    write_tiny_mtp_model(model, tokenizer_source)
    with _serve(llama_server, model, tmp_path / "server.log") as base:
        reply = _chat(base)
        assert reply["choices"][0]["message"]["content"]
        assert _acceptance(reply["timings"]) >= 0.9

        status, metrics = _get(base + "/metrics")
        assert status == 200
        drafted = metric_value(metrics, "llamacpp:spec_decode_num_draft_tokens_total")
        assert drafted > 0, metrics


def test_noisy_mtp_head_is_mostly_rejected(
    tmp_path: Path, tokenizer_source: Path, llama_server: Path
) -> None:
    model = tmp_path / "noisy.gguf"
    write_tiny_mtp_model(model, tokenizer_source, eh_proj_noise=0.04)
    with _serve(llama_server, model, tmp_path / "server.log") as base:
        assert _acceptance(_chat(base)["timings"]) < 0.5
