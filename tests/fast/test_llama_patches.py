"""specproxy's llama.cpp patches on made-up trees: applied once and verified, an applied patch
skipped, a drifted file named by patch, file and hunk, a stale tree extracted again only once."""

from __future__ import annotations

import difflib
import hashlib
import io
import shutil
import subprocess
import tarfile
from pathlib import Path

import pytest

from proxy.provision import llama_server
from proxy.provision.llama_patches import (
    BUILD_MARKER,
    PatchFile,
    StalePatchError,
    apply_patches,
    is_specproxy_build,
    patch_files,
    patch_set_id,
    patch_state,
)
from proxy.provision.pypi import ProvisionError

# No download may happen: a fetch from here fails.
NO_INDEX = "http://127.0.0.1:9/simple"
QUEUE = "".join(f"line {n}\n" for n in range(1, 31))
HTTP = "int main() {\n    return has_next;\n}\n"


def _diff(path: str, before: str, after: str) -> str:
    """A unified diff of one file with git's a/ b/ names (applied with patch -p1)."""
    lines = difflib.unified_diff(
        before.splitlines(keepends=True), after.splitlines(keepends=True), f"a/{path}", f"b/{path}"
    )
    return "".join(lines)


def _tree(root: Path, files: dict[str, str]) -> Path:
    for name, text in files.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return root


UPSTREAM = {"server/queue.cpp": QUEUE, "server/http.cpp": HTTP}
# 0001 edits two places of queue.cpp; 0002 http.cpp and, far from 0001's lines, queue.cpp.
QUEUE_1 = QUEUE.replace("line 3\n", "line 3 (deadline)\n").replace("line 15\n", "wait_until\n")
QUEUE_2 = QUEUE.replace("line 28\n", "line 28 (types)\n")
QUEUE_BOTH = QUEUE_1.replace("line 28\n", "line 28 (types)\n")
HTTP_2 = HTTP.replace("has_next", "true")


def _series(directory: Path) -> tuple[Path, Path]:
    """Two made-up patches, the first with a header saying why, as regen_patches writes them."""
    directory.mkdir(parents=True, exist_ok=True)
    first = directory / "0001-deadline.patch"
    first.write_text(
        "deadline\n\nWhy: one deadline.\n\n" + _diff("server/queue.cpp", QUEUE, QUEUE_1)
    )
    second = directory / "0002-types.patch"
    second.write_text(
        _diff("server/http.cpp", HTTP, HTTP_2) + _diff("server/queue.cpp", QUEUE, QUEUE_2)
    )
    return first, second


def test_a_series_applies_once_and_every_patch_verifies(tmp_path: Path) -> None:
    series = _series(tmp_path / "patches")
    tree = _tree(tmp_path / "tree", UPSTREAM)
    assert apply_patches(tree, series) == list(series)
    assert (tree / "server/queue.cpp").read_text() == QUEUE_BOTH
    assert (tree / "server/http.cpp").read_text() == HTTP_2
    assert [patch_state(tree, p)[0] for p in series] == ["applied", "applied"]
    # GNU patch leaves no .orig or .rej files behind.
    assert sorted(p.name for p in (tree / "server").iterdir()) == ["http.cpp", "queue.cpp"]


def test_an_applied_patch_is_skipped(tmp_path: Path) -> None:
    first, second = _series(tmp_path / "patches")
    tree = _tree(tmp_path / "tree", {**UPSTREAM, "server/queue.cpp": QUEUE_1})
    assert [patch_state(tree, p)[0] for p in (first, second)] == ["applied", "applies"]
    assert apply_patches(tree, (first, second)) == [second]
    assert apply_patches(tree, (first, second)) == []
    assert (tree / "server/queue.cpp").read_text() == QUEUE_BOTH


def test_a_drifted_file_names_the_patch_its_file_and_hunk_and_nothing_is_applied(
    tmp_path: Path,
) -> None:
    first, second = _series(tmp_path / "patches")
    # Upstream moved the code of 0001's second hunk; its first would still apply.
    drifted = QUEUE.replace("line 16\n", "line 16 moved\n")
    tree = _tree(tmp_path / "tree", {**UPSTREAM, "server/queue.cpp": drifted})
    with pytest.raises(StalePatchError) as caught:
        apply_patches(tree, (first, second))
    message = str(caught.value)
    assert caught.value.patch == first
    assert "0001-deadline.patch" in message
    hunk = PatchFile.read(first).hunks["server/queue.cpp"][1]
    assert f"server/queue.cpp: hunk #2 ({hunk})" in message
    assert "hunk #1" not in message
    # Every patch is checked before any is applied: the tree is as it was.
    assert (tree / "server/queue.cpp").read_text() == drifted
    assert (tree / "server/http.cpp").read_text() == HTTP


def test_a_partly_applied_or_missing_file_is_named(tmp_path: Path) -> None:
    _, second = _series(tmp_path / "patches")
    partly = _tree(tmp_path / "partly", {**UPSTREAM, "server/http.cpp": HTTP_2})
    state, failures = patch_state(partly, second)
    assert state == "stale"
    assert failures == [
        "server/http.cpp: already carries this change (the patch is partly applied)"
    ]
    missing = _tree(tmp_path / "missing", {"server/queue.cpp": QUEUE})
    state, failures = patch_state(missing, second)
    assert (state, failures) == ("stale", ["server/http.cpp: no such file"])


def test_without_gnu_patch_the_error_says_what_to_install(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    series = _series(tmp_path / "patches")
    monkeypatch.setattr(shutil, "which", lambda _name: None)
    with pytest.raises(ProvisionError, match="apt-get install patch"):
        apply_patches(_tree(tmp_path / "tree", UPSTREAM), series)


def test_the_build_stamp_holds_the_series_hash_and_a_changed_patch_changes_it(
    tmp_path: Path,
) -> None:
    assert f"\npatches={patch_set_id()}\n" in llama_server.build_stamp()
    series = _series(tmp_path / "patches")
    before = patch_set_id(series)
    series[1].write_text(series[1].read_text().replace("(types)", "(kinds)"))
    assert patch_set_id(series) != before
    renamed = series[1].rename(series[1].with_name("0003-types.patch"))
    assert patch_set_id((series[0], renamed)) not in (before, patch_set_id(series[:1]))


def test_the_series_is_ten_patches_and_one_adds_the_build_marker(tmp_path: Path) -> None:
    series = patch_files()
    assert [p.name[:4] for p in series] == [
        "0001",
        "0002",
        "0003",
        "0004",
        "0005",
        "0006",
        "0007",
        "0008",
        "0009",
        "0010",
    ]
    assert all(PatchFile.read(p).files for p in series)
    # The marker comes from a patch's added text, so only a binary built with it holds it.
    marker = BUILD_MARKER.decode()
    lines = [line for p in series for line in p.read_text().splitlines() if marker in line]
    assert lines and all(line.startswith("+") for line in lines)
    ours, stock = tmp_path / "ours", tmp_path / "stock"
    ours.write_bytes(b"\x7fELF" + b"\0" * 4096 + BUILD_MARKER + b"\0" * 64)
    stock.write_bytes(b"\x7fELF" + b"\0" * 4096)
    assert is_specproxy_build(ours) and not is_specproxy_build(stock)
    assert not is_specproxy_build(tmp_path / "missing")


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A cache holding a made-up pinned sdist (its sha256 made the pinned one)."""
    cache_dir = tmp_path / "cache"
    archive = cache_dir / "src" / llama_server._SDIST
    archive.parent.mkdir(parents=True)
    top = f"{llama_server._SDIST_TOP}/llama.cpp"
    with tarfile.open(archive, "w:gz") as tar:
        for name, text in {"CMakeLists.txt": "project(llama)\n", **UPSTREAM}.items():
            info = tarfile.TarInfo(f"{top}/{name}")
            info.size = len(text.encode())
            tar.addfile(info, io.BytesIO(text.encode()))
    monkeypatch.setattr(
        llama_server, "_SDIST_SHA256", hashlib.sha256(archive.read_bytes()).hexdigest()
    )
    return cache_dir


@pytest.fixture
def extractions(monkeypatch: pytest.MonkeyPatch) -> list[Path]:
    """Every extraction of the sdist, as it happens."""
    done: list[Path] = []
    extract = llama_server._extract

    def counted(tar: tarfile.TarFile, dest: Path) -> None:
        done.append(dest)
        extract(tar, dest)

    monkeypatch.setattr(llama_server, "_extract", counted)
    return done


def test_a_tree_another_series_left_is_extracted_again_once_and_patched(
    cache: Path, extractions: list[Path], tmp_path: Path
) -> None:
    series = _series(tmp_path / "patches")
    source = llama_server.patched_source(cache, NO_INDEX, series)
    assert len(extractions) == 1 and (source / "server/queue.cpp").read_text() == QUEUE_BOTH
    # An older version of 0002 was applied here: its files are neither pristine nor patched.
    (source / "server/http.cpp").write_text(HTTP.replace("has_next", "false"))
    assert llama_server.patched_source(cache, NO_INDEX, series) == source
    assert len(extractions) == 2
    assert (source / "server/http.cpp").read_text() == HTTP_2
    llama_server.patched_source(cache, NO_INDEX, series)
    assert len(extractions) == 2
    # The sdist stays in the cache for the next extraction.
    assert (cache / "src" / llama_server._SDIST).is_file()


def test_a_patch_that_does_not_fit_the_sdist_is_an_error_without_extracting_every_run(
    cache: Path, extractions: list[Path], tmp_path: Path
) -> None:
    first, _ = _series(tmp_path / "patches")
    unfit = first.with_name("0002-unfit.patch")
    unfit.write_text(_diff("server/http.cpp", HTTP.replace("main", "start"), HTTP_2))
    source = llama_server.patched_source(cache, NO_INDEX, (first,))
    (source / "server/http.cpp").write_text("left by an older series\n")
    for _ in range(2):
        with pytest.raises(ProvisionError) as caught:
            llama_server.patched_source(cache, NO_INDEX, (first, unfit))
        message = str(caught.value)
        assert (
            "0002-unfit.patch" in message
            and "server/http.cpp: hunk #1 (@@ -1,3 +1,3 @@)" in message
        )
        assert "as extracted" in message and "regen_patches.py" in message
    # Extracted for the first run, again once for the stale tree, then never.
    assert len(extractions) == 2
    # Nothing of the series was applied to the tree that does not fit it.
    assert (source / "server/queue.cpp").read_text() == QUEUE


def test_regen_patches_writes_the_series_back_from_a_tree_edited_in_git(
    cache: Path, tmp_path: Path
) -> None:
    from scripts import regen_patches

    series = _series(tmp_path / "patches")
    originals = [p.read_text() for p in series]
    tree = tmp_path / "llama"
    regen_patches.init(tree, cache, NO_INDEX, tmp_path / "patches")
    log = subprocess.run(
        ["git", "-C", str(tree), "log", "--format=%s", "upstream..HEAD"],
        check=True,
        capture_output=True,
        text=True,
    )
    assert log.stdout.split() == ["types", "deadline"]
    assert (tree / "server/queue.cpp").read_text() == QUEUE_BOTH
    # A new concern, written as code in the tree and committed, becomes the next patch.
    (tree / "server/spec.cpp").write_text("// a new speculator\n")
    _commit(tree, "new-speculator\n\nWhy: faster.")
    out = tmp_path / "written"
    out.mkdir()
    (out / "0009-gone.patch").write_text("removed: no commit writes it\n")
    regen_patches.write(tree, out)
    written = patch_files(out)
    names = ["0001-deadline.patch", "0002-types.patch", "0003-new-speculator.patch"]
    assert [p.name for p in written] == names
    assert written[0].read_text().startswith("deadline\n\nWhy: one deadline.\n\ndiff --git")
    assert written[2].read_text().startswith("new-speculator\n\nWhy: faster.\n\ndiff --git")
    fresh = _tree(tmp_path / "fresh", UPSTREAM)
    assert apply_patches(fresh, written) == list(written)
    assert (fresh / "server/spec.cpp").read_text() == "// a new speculator\n"
    assert (fresh / "server/queue.cpp").read_text() == QUEUE_BOTH
    assert [p.read_text() for p in series] == originals
    # Two commits editing the same lines would make a series whose patches cannot each verify.
    (tree / "server/http.cpp").write_text(HTTP_2.replace("true", "false"))
    _commit(tree, "overlapping")
    with pytest.raises(SystemExit, match="same lines"):
        regen_patches.write(tree, out)


def _commit(tree: Path, message: str) -> None:
    git = ["git", "-C", str(tree), "-c", "user.name=t", "-c", "user.email=t@t"]
    subprocess.run([*git, "add", "--all"], check=True)
    subprocess.run([*git, "commit", "-qm", message], check=True)


def test_regen_patches_init_stops_at_a_patch_that_moved_and_goes_on_once_resolved(
    cache: Path, tmp_path: Path
) -> None:
    from scripts import regen_patches

    first, _ = _series(tmp_path / "patches")
    # 0001 as written for another upstream, where line 15 read otherwise.
    first.write_text(
        _diff("server/queue.cpp", QUEUE.replace("line 15\n", "line 15 old\n"), QUEUE_1)
    )
    tree = tmp_path / "llama"
    with pytest.raises(SystemExit, match=r"0001-deadline\.patch does not apply"):
        regen_patches.init(tree, cache, NO_INDEX, tmp_path / "patches")
    assert "<<<<<<<" in (tree / "server/queue.cpp").read_text()
    (tree / "server/queue.cpp").write_text(QUEUE_1)
    _commit(tree, "deadline")
    regen_patches.init(tree, cache, NO_INDEX, tmp_path / "patches")
    assert (tree / "server/queue.cpp").read_text() == QUEUE_BOTH
    assert (tree / "server/http.cpp").read_text() == HTTP_2
