"""What a GGUF file's header says: architecture, vocabulary and whether it has an MTP head."""

from __future__ import annotations

import hashlib
import mmap
import struct
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

_MAGIC = b"GGUF"
# GGUF value types -> struct format of a scalar (8 = string, 9 = array are special).
_SCALARS = {
    0: "B",
    1: "b",
    2: "H",
    3: "h",
    4: "I",
    5: "i",
    6: "f",
    7: "?",
    10: "Q",
    11: "q",
    12: "d",
}
_KEEP_ARRAYS = {"tokenizer.ggml.tokens"}
# The versions llama.cpp reads (v1 files predate llama-server).
_VERSIONS = (2, 3)


class GgufError(Exception):
    """The file is not a GGUF model we can use; the message names the file and the problem."""


@dataclass(frozen=True)
class GgufInfo:
    """The facts about one GGUF file that backend checks need."""

    path: Path
    architecture: str
    tokenizer_model: str
    n_tokens: int
    tokens_sha256: str
    bos_token_id: int | None
    eos_token_id: int | None
    has_mtp_head: bool
    tokens: tuple[str, ...]


class _Cursor:
    """Sequential little-endian reads over a memory-mapped header."""

    def __init__(self, buf: mmap.mmap) -> None:
        self.buf = buf
        self.pos = 0

    def scalar(self, fmt: str) -> Any:
        size = struct.calcsize(fmt)
        (value,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += size
        return value

    def string(self) -> str:
        n = self.scalar("Q")
        raw = self.buf[self.pos : self.pos + n]
        self.pos += n
        return raw.decode("utf-8", errors="replace")

    def value(self, vtype: int, keep: bool) -> Any:
        if vtype == 8:
            return self.string()
        if vtype == 9:
            etype, count = self.scalar("I"), self.scalar("Q")
            if etype in _SCALARS and not keep:
                self.pos += struct.calcsize(_SCALARS[etype]) * count
                return count
            items = [self.value(etype, keep) for _ in range(count)]
            return items if keep else count
        if vtype in _SCALARS:
            return self.scalar(_SCALARS[vtype])
        raise GgufError(f"unknown GGUF value type {vtype}")


@dataclass(frozen=True)
class GgufHeader:
    """A GGUF file's key/values (arrays as their length unless kept) and its tensor names."""

    version: int
    kv: dict[str, Any]
    # Per key: its value type and, for arrays, the element type (GGUF's numbering).
    types: dict[str, tuple[int, int | None]]
    tensor_names: tuple[str, ...]


def read_gguf_header(
    path: Path, keep_array: Callable[[str], bool] = _KEEP_ARRAYS.__contains__
) -> GgufHeader:
    """Parse the header (not the weights) of a GGUF file in well under a second.

    gguf.GGUFReader builds a numpy view per string and takes about 5 s on a 49k-token
    vocabulary; this reads the same header in a fraction of a second.
    """
    try:
        with path.open("rb") as fh, mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
            return _parse(path, buf, keep_array)
    except (OSError, ValueError, struct.error, UnicodeDecodeError) as exc:
        raise GgufError(f"{path}: not a readable GGUF model ({exc})") from exc


def _parse(path: Path, buf: mmap.mmap, keep_array: Callable[[str], bool]) -> GgufHeader:
    if buf[:4] != _MAGIC:
        raise GgufError(f"{path}: not a GGUF file (magic {bytes(buf[:4])!r}); pass a .gguf model")
    cur = _Cursor(buf)
    cur.pos = 4
    version = cur.scalar("I")
    if version not in _VERSIONS:
        raise GgufError(
            f"{path}: GGUF version {version}; llama-server reads versions "
            f"{' and '.join(map(str, _VERSIONS))}: convert the model with a current llama.cpp"
        )
    n_tensors, n_kv = cur.scalar("Q"), cur.scalar("Q")
    kv: dict[str, Any] = {}
    types: dict[str, tuple[int, int | None]] = {}
    for _ in range(n_kv):
        key = cur.string()
        vtype = cur.scalar("I")
        element = None
        if vtype == 9:
            element = struct.unpack_from("<I", buf, cur.pos)[0]
        kv[key] = cur.value(vtype, keep=keep_array(key))
        types[key] = (vtype, element)
    names = []
    for _ in range(n_tensors):
        names.append(cur.string())
        n_dims = cur.scalar("I")
        cur.pos += 8 * n_dims + 4 + 8
    return GgufHeader(version, kv, types, tuple(names))


def read_gguf_info(path: Path) -> GgufInfo:
    """The facts backend checks need, from the header of a GGUF file."""
    header = read_gguf_header(path)
    kv = header.kv
    has_mtp = any(name.endswith("nextn.eh_proj.weight") for name in header.tensor_names)
    tokens = kv.get("tokenizer.ggml.tokens", [])
    tokens = tokens if isinstance(tokens, list) else []
    return GgufInfo(
        path=path,
        architecture=str(kv.get("general.architecture", "unknown")),
        tokenizer_model=str(kv.get("tokenizer.ggml.model", "unknown")),
        n_tokens=len(tokens),
        tokens_sha256=hashlib.sha256("\x00".join(tokens).encode()).hexdigest(),
        bos_token_id=kv.get("tokenizer.ggml.bos_token_id"),
        eos_token_id=kv.get("tokenizer.ggml.eos_token_id"),
        has_mtp_head=has_mtp,
        tokens=tuple(tokens),
    )


# llama.cpp (common/speculative.cpp) tolerates this many extra tokens in one vocabulary.
MAX_VOCAB_SIZE_DIFFERENCE = 128


def vocab_mismatch(target: GgufInfo, draft: GgufInfo) -> str | None:
    """Why a draft cannot draft for a target (as llama.cpp would judge it), or None if it can."""
    if target.tokenizer_model != draft.tokenizer_model:
        return f"tokenizer {draft.tokenizer_model!r} != {target.tokenizer_model!r}"
    if abs(target.n_tokens - draft.n_tokens) > MAX_VOCAB_SIZE_DIFFERENCE:
        return f"vocabulary sizes {draft.n_tokens} and {target.n_tokens} differ too much"
    if (target.bos_token_id, target.eos_token_id) != (draft.bos_token_id, draft.eos_token_id):
        return "BOS/EOS token ids differ"
    if target.tokens_sha256 == draft.tokens_sha256:
        return None
    for i, (a, b) in enumerate(zip(target.tokens, draft.tokens, strict=False)):
        if a != b:
            return f"token {i} is {b!r} in the draft but {a!r} in the target"
    return None
