"""What each README command installs: `make serve` only what serving needs, `make test` what
the tests drive too (fast tier: apt-get is a recorder on an otherwise empty PATH)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.helpers import ROOT

SCRIPT = ROOT / "scripts" / "system-deps.sh"
TEST_TOOLS = {"prometheus", "podman", "chromium", "nodejs", "npm", "debootstrap", "runc"}
BUILD_TOOLS = {"cmake", "g++", "ninja-build", "ccache", "patch"}


def _installed_by(purpose: str, tmp_path: Path) -> set[str]:
    """The packages the script asks apt-get for on a machine that has none of them."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    log = tmp_path / "apt.log"
    recorder = bin_dir / "apt-get"
    recorder.write_text(f'#!/bin/sh\necho "$@" >> {log}\n')
    recorder.chmod(0o755)
    for tool in ("id", "sh", "cut"):
        found = shutil.which(tool)
        assert found is not None
        (bin_dir / tool).symlink_to(found)
    env = {**os.environ, "PATH": str(bin_dir)}
    bash = shutil.which("bash")
    assert bash is not None
    subprocess.run([bash, str(SCRIPT), purpose], env=env, check=True, capture_output=True)
    installs = [line.split() for line in log.read_text().splitlines() if "install" in line]
    return {word for words in installs for word in words if not word.startswith("-")} - {"install"}


@pytest.mark.skipif(os.geteuid() != 0, reason="the script calls sudo when not root")
def test_serving_installs_no_test_tool(tmp_path: Path) -> None:
    packages = _installed_by("serve", tmp_path)
    assert packages == BUILD_TOOLS


@pytest.mark.skipif(os.geteuid() != 0, reason="the script calls sudo when not root")
def test_testing_installs_node_npm_and_the_tools_tests_drive(tmp_path: Path) -> None:
    packages = _installed_by("test", tmp_path)
    assert packages >= BUILD_TOOLS | TEST_TOOLS
