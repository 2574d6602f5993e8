"""Prompts kept on disk across restarts: llama-server slot files, each with a manifest.

A slot file (`POST /slots/{id}?action=save`) holds token ids and the target's KV cache, and
llama-server checks little when it loads one (layer count and KV layout; not the model it came
from: docs/agents.md). So every file gets a manifest naming what made it — the model file's
sha256, our build's stamp, the context and KV settings — and its own size and sha256. A file
whose manifest names anything else, or whose bytes do not match, is refused with a log line and
deleted: never handed to llama-server.
"""

from __future__ import annotations

import hashlib
import json
import os
import secrets
import time
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from proxy.log import get_logger
from proxy.provision.pypi import sha256_of
from proxy.routing.prefixes import PromptPrefix

log = get_logger("prompt-store")
_MANIFEST = ".json"
_SLOT_FILE = ".slot"
_FORMAT = 1


@dataclass(frozen=True)
class Fingerprint:
    """What a slot file depends on: its engine's model, build, context and KV settings."""

    fields: Mapping[str, str]

    @property
    def digest(self) -> str:
        """A short hash of the fields, compared when a file is loaded."""
        blob = json.dumps(dict(self.fields), sort_keys=True).encode()
        return hashlib.sha256(blob).hexdigest()[:16]


@dataclass
class StoredPrompt:
    """One kept prompt: its slot file, what it holds and when it was last of use."""

    name: str  # the file's stem, also llama-server's `filename` (without the suffix)
    tokens: int
    size: int
    sha256: str
    prefix: PromptPrefix
    saved_at: float
    used_at: float

    @property
    def filename(self) -> str:
        """The slot file's name in the store's directory, as llama-server is given it."""
        return self.name + _SLOT_FILE

    def manifest(self, fingerprint: Fingerprint) -> dict[str, Any]:
        """The manifest written beside the slot file."""
        return {
            "format": _FORMAT,
            "fingerprint": fingerprint.digest,
            "made_by": dict(fingerprint.fields),
            "tokens": self.tokens,
            "size": self.size,
            "sha256": self.sha256,
            "prefix": {
                "fingerprints": [f.hex() for f in self.prefix.fingerprints],
                "ends": list(self.prefix.ends),
            },
            "saved_at": self.saved_at,
            "used_at": self.used_at,
        }


class Refused(Exception):
    """A kept prompt that must not be loaded; the message says why."""


def _read(manifest: Path, fingerprint: Fingerprint) -> StoredPrompt:
    """The kept prompt a manifest describes, checked against this engine and its file's bytes."""
    try:
        data = json.loads(manifest.read_text())
        prefix = PromptPrefix(
            tuple(bytes.fromhex(f) for f in data["prefix"]["fingerprints"]),
            tuple(int(e) for e in data["prefix"]["ends"]),
        )
        entry = StoredPrompt(
            name=manifest.name.removesuffix(_MANIFEST),
            tokens=int(data["tokens"]),
            size=int(data["size"]),
            sha256=str(data["sha256"]),
            prefix=prefix,
            saved_at=float(data["saved_at"]),
            used_at=float(data["used_at"]),
        )
        made_for = data["fingerprint"]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise Refused(f"unreadable manifest ({exc})") from None
    if data.get("format") != _FORMAT:
        raise Refused(f"manifest format {data.get('format')!r}, not {_FORMAT}")
    if made_for != fingerprint.digest:
        theirs = data.get("made_by") or {}
        changed = sorted(k for k in fingerprint.fields if theirs.get(k) != fingerprint.fields[k])
        raise Refused(f"made by another engine setup (differs in {', '.join(changed) or '?'})")
    slot_file = manifest.with_name(entry.filename)
    try:
        size = slot_file.stat().st_size
    except OSError:
        raise Refused("its slot file is missing") from None
    if size != entry.size:
        raise Refused(f"slot file is {size} bytes, its manifest says {entry.size} (truncated?)")
    if sha256_of(slot_file) != entry.sha256:
        raise Refused("slot file's sha256 does not match its manifest (damaged)")
    return entry


class PromptStore:
    """One engine's kept prompts in a directory it shares with other engines, bounded in bytes,
    least recently used evicted first."""

    def __init__(self, root: Path, engine: str, fingerprint: Fingerprint, limit_bytes: int):
        self.root = root
        self.engine = engine
        self.fingerprint = fingerprint
        self.limit_bytes = limit_bytes
        self._entries: dict[str, StoredPrompt] = {}

    def load(self) -> list[StoredPrompt]:
        """Read and check this engine's files (blocking: sha256 of each), refusing and deleting
        what does not match; the kept prompts, least recently used first."""
        self.root.mkdir(parents=True, exist_ok=True, mode=0o700)
        self._entries = {}
        for manifest in sorted(self.root.glob(f"{self.engine}--*{_MANIFEST}")):
            try:
                entry = _read(manifest, self.fingerprint)
            except Refused as exc:
                log.warning(
                    "kept prompt refused and deleted",
                    engine=self.engine,
                    file=manifest.name.removesuffix(_MANIFEST) + _SLOT_FILE,
                    why=str(exc),
                )
                self._delete(manifest.name.removesuffix(_MANIFEST))
                continue
            self._entries[entry.name] = entry
        # A slot file without a manifest: a save the proxy did not finish (it stopped mid-way).
        for orphan in self.root.glob(f"{self.engine}--*{_SLOT_FILE}"):
            if orphan.name.removesuffix(_SLOT_FILE) not in self._entries:
                orphan.unlink(missing_ok=True)
        return self.entries()

    def entries(self) -> list[StoredPrompt]:
        """The kept prompts, least recently used first."""
        return sorted(self._entries.values(), key=lambda e: e.used_at)

    def new_name(self) -> str:
        """A fresh file stem for the next save."""
        return f"{self.engine}--{secrets.token_hex(6)}"

    def path_of(self, entry_name: str) -> Path:
        """Where the slot file of this stem lives."""
        return self.root / (entry_name + _SLOT_FILE)

    def covering(self, prefix: PromptPrefix) -> tuple[StoredPrompt | None, int]:
        """The kept prompt sharing the longest start with `prefix`, and those characters."""
        best, shared = None, 0
        for entry in self._entries.values():
            chars = prefix.shared_chars(entry.prefix)
            if chars > shared:
                best, shared = entry, chars
        return best, shared

    def add(self, name: str, prefix: PromptPrefix, tokens: int) -> StoredPrompt:
        """Take the slot file llama-server just wrote under `name` (blocking: its sha256), drop
        the kept prompts it extends, and evict beyond the byte limit."""
        path = self.path_of(name)
        now = time.time()
        entry = StoredPrompt(name, tokens, path.stat().st_size, sha256_of(path), prefix, now, now)
        for old in list(self._entries.values()):
            # The same conversation, earlier: the new file holds all of it and more.
            if prefix.shared_chars(old.prefix) == old.prefix.chars:
                self.remove(old.name)
        self._write_manifest(entry)
        self._entries[name] = entry
        self._evict()
        return entry

    def touch(self, entry: StoredPrompt) -> None:
        """Note that a new prompt started like this one: it is of use, evict it last."""
        entry.used_at = time.time()
        self._write_manifest(entry)

    def remove(self, name: str) -> None:
        """Forget a kept prompt and delete its files."""
        self._entries.pop(name, None)
        self._delete(name)

    @property
    def size(self) -> int:
        """Bytes the kept prompts take."""
        return sum(e.size for e in self._entries.values())

    def _evict(self) -> None:
        for entry in self.entries():
            if self.size <= self.limit_bytes:
                break
            log.info("kept prompt evicted", engine=self.engine, tokens=entry.tokens)
            self.remove(entry.name)

    def _write_manifest(self, entry: StoredPrompt) -> None:
        path = self.root / (entry.name + _MANIFEST)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(entry.manifest(self.fingerprint)))
        os.replace(tmp, path)

    def _delete(self, name: str) -> None:
        for suffix in (_MANIFEST, _SLOT_FILE):
            (self.root / (name + suffix)).unlink(missing_ok=True)
