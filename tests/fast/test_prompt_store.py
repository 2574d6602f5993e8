"""Kept prompts on disk: checked against what made them, bounded, least recently used evicted."""

from __future__ import annotations

import json
from collections.abc import Callable
from pathlib import Path

import pytest

from proxy.backends.prompt_keeper import _holding
from proxy.backends.prompt_store import Fingerprint, PromptStore
from proxy.routing.prefixes import PromptPrefix

ENGINE = Fingerprint({"model_sha256": "aa", "ctx_size": "8192", "kv_unified": "True"})


def prefix(*blocks: str) -> PromptPrefix:
    """A prompt of these messages."""
    return PromptPrefix.of({"messages": [{"role": "user", "content": b} for b in blocks]})


def save(store: PromptStore, data: bytes, p: PromptPrefix, tokens: int = 2000) -> str:
    """What the keeper does: llama-server writes the slot file, the store takes it."""
    name = store.new_name()
    store.path_of(name).write_bytes(data)
    store.add(name, p, tokens)
    return name


def reopened(store: PromptStore, fingerprint: Fingerprint = ENGINE) -> PromptStore:
    """The same directory read again, as at the next start."""
    again = PromptStore(store.root, store.engine, fingerprint, store.limit_bytes)
    again.load()
    return again


@pytest.fixture
def store(tmp_path: Path) -> PromptStore:
    made = PromptStore(tmp_path / "prompts", "coder", ENGINE, limit_bytes=10_000)
    made.load()
    return made


def test_a_kept_prompt_is_found_again_after_a_restart(store: PromptStore) -> None:
    save(store, b"k" * 1000, prefix("system and tools", "task one"))
    [entry] = reopened(store).entries()
    assert entry.tokens == 2000 and entry.size == 1000
    kept, shared = reopened(store).covering(prefix("system and tools", "task two"))
    assert kept is not None and shared == prefix("system and tools").chars


@pytest.mark.parametrize(
    "damage, why",
    [
        (lambda path: path.write_bytes(b"k" * 500), "truncated"),
        (lambda path: path.write_bytes(b"x" * 1000), "damaged"),
        (lambda path: path.unlink(), "missing"),
        (lambda path: path.with_suffix(".json").write_text("{not json"), "unreadable"),
    ],
)
def test_a_damaged_file_is_refused_and_deleted(
    store: PromptStore,
    damage: Callable[[Path], object],
    why: str,
    capsys: pytest.CaptureFixture[str],
) -> None:
    name = save(store, b"k" * 1000, prefix("a", "b"))
    damage(store.path_of(name))
    again = reopened(store)
    assert again.entries() == []
    assert not list(store.root.glob(f"{name}*"))
    out = capsys.readouterr().out
    assert "kept prompt refused and deleted" in out and why in out


def test_a_file_made_by_another_model_or_setting_is_refused(
    store: PromptStore, capsys: pytest.CaptureFixture[str]
) -> None:
    save(store, b"k" * 1000, prefix("a", "b"))
    other_model = Fingerprint({**ENGINE.fields, "model_sha256": "bb"})
    assert reopened(store, other_model).entries() == []
    out = capsys.readouterr().out
    assert "another engine setup" in out and "model_sha256" in out
    assert not list(store.root.glob("coder--*"))


def test_another_engines_files_are_left_alone(store: PromptStore) -> None:
    save(store, b"k" * 1000, prefix("a", "b"))
    other = PromptStore(store.root, "draft", Fingerprint({"model_sha256": "cc"}), 10_000)
    assert other.load() == []
    assert len(reopened(store).entries()) == 1


def test_least_recently_used_goes_first_beyond_the_limit(store: PromptStore) -> None:
    first = save(store, b"1" * 4000, prefix("agent one", "x"))
    second = save(store, b"2" * 4000, prefix("agent two", "x"))
    kept, _ = store.covering(prefix("agent one", "y"))
    assert kept is not None and kept.name == first
    store.touch(kept)  # the first agent came back: the second is now the least recent
    save(store, b"3" * 4000, prefix("agent three", "x"))
    names = {e.name for e in reopened(store).entries()}
    assert first in names and second not in names and store.size <= store.limit_bytes


def test_a_longer_turn_of_the_same_conversation_replaces_the_earlier(store: PromptStore) -> None:
    save(store, b"1" * 1000, prefix("system", "task", "tool result 1"))
    later = save(store, b"2" * 1500, prefix("system", "task", "tool result 1", "tool result 2"))
    assert [e.name for e in reopened(store).entries()] == [later]


def test_a_slot_file_without_manifest_is_an_unfinished_save(store: PromptStore) -> None:
    store.path_of(store.new_name()).write_bytes(b"partial")
    reopened(store)
    assert not list(store.root.glob("coder--*.slot"))


def test_manifests_hold_no_prompt_text(store: PromptStore) -> None:
    name = save(store, b"k" * 1000, prefix("my secret system prompt", "task"))
    manifest = json.loads((store.root / f"{name}.json").read_text())
    assert "secret" not in json.dumps(manifest)


def test_the_slot_a_request_just_left_is_found_by_its_token_count() -> None:
    slots = [
        {"id": 0, "is_processing": False, "n_prompt_tokens": 0},
        {"id": 1, "is_processing": True, "n_prompt_tokens": 5000},
        {"id": 2, "is_processing": False, "n_prompt_tokens": 4999},
        {"id": 3, "is_processing": False, "n_prompt_tokens": 3000},
    ]
    assert _holding(slots, 5001) == 2
    assert _holding(slots, 9000) is None
