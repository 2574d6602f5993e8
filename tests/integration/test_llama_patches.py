"""The pinned llama.cpp sdist (kept in ~/.cache/specproxy) takes specproxy's patches: each applies
on its own, each verifies, and regen_patches.py writes the same series back from the tree."""

from __future__ import annotations

from pathlib import Path

import pytest

from proxy.config import default_cache_dir
from proxy.provision.llama_patches import (
    BUILD_MARKER,
    apply_patches,
    patch_files,
    patch_state,
)
from proxy.provision.llama_server import extract_sdist, patched_source, pinned_sdist, source_dir

INDEX = "https://pypi.org/simple"
NO_INDEX = "http://127.0.0.1:9/simple"


@pytest.fixture(scope="module")
def sdist() -> Path:
    """The pinned sdist from the cache (downloaded there once if an older specproxy left none)."""
    return pinned_sdist(default_cache_dir(), INDEX)


def test_the_pinned_sdist_patches_cleanly_and_every_patch_verifies(
    sdist: Path, tmp_path: Path
) -> None:
    source = extract_sdist(sdist, tmp_path)
    series = patch_files()
    # Each patch applies to the tree as extracted on its own, so each can be checked alone.
    assert [patch_state(source, p)[0] for p in series] == ["applies"] * len(series)
    assert apply_patches(source) == list(series)
    assert [patch_state(source, p)[0] for p in series] == ["applied"] * len(series)
    assert apply_patches(source) == []
    assert BUILD_MARKER.decode() in (source / "tools/server/server-schema.cpp").read_text()
    assert not [p for p in source.rglob("*") if p.suffix in (".orig", ".rej")]


def test_a_tree_an_older_series_left_is_extracted_again_from_the_cached_sdist(
    sdist: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    (cache / "src").mkdir(parents=True)
    (cache / "src" / sdist.name).symlink_to(sdist)
    source = extract_sdist(sdist, cache / "src")
    assert source == source_dir(cache)
    http = source / "tools/server/server-http.cpp"
    pristine = http.read_text()
    http.write_text(pristine.replace("return has_next;", "return has_next; // an older fix"))
    # No index: the extraction takes the cached sdist, nothing is downloaded.
    assert patched_source(cache, NO_INDEX) == source
    assert "// specproxy: done() ended the body" in http.read_text()
    assert [patch_state(source, p)[0] for p in patch_files()] == ["applied"] * len(patch_files())


def test_regen_patches_writes_the_series_back_unchanged(sdist: Path, tmp_path: Path) -> None:
    from scripts import regen_patches

    tree = tmp_path / "llama"
    regen_patches.init(tree, sdist.parent.parent, NO_INDEX)
    out = tmp_path / "out"
    regen_patches.write(tree, out)
    assert {p.name: p.read_bytes() for p in patch_files(out)} == {
        p.name: p.read_bytes() for p in patch_files()
    }
