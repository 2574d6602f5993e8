"""What each README command installs: `make serve` only what serving needs, `make test` what
the tests drive too (fast tier: apt-get is a recorder on an otherwise empty PATH); without apt,
what it names for installing by hand, and that the build's tools by other names are enough."""

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


def _without_apt(tmp_path: Path, tools: dict[str, str], purpose: str = "serve") -> tuple[int, str]:
    """Run the script on a PATH with no apt-get and only `tools` (name -> what --version says)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, version in tools.items():
        tool = bin_dir / name
        tool.write_text(f'#!/bin/sh\necho "{version}"\n')
        tool.chmod(0o755)
    bash = shutil.which("bash")
    assert bash is not None
    done = subprocess.run(
        [bash, str(SCRIPT), purpose],
        env={**os.environ, "PATH": str(bin_dir)},
        capture_output=True,
        text=True,
        check=False,
    )
    return done.returncode, done.stderr


# What a machine without apt may have instead of Debian's names: clang++ and make, no ccache.
BUILD_WITHOUT_APT = {"cmake": "cmake 3.28", "clang++": "clang 17", "make": "GNU Make 4.4"}


def test_without_apt_the_build_tools_by_other_names_are_enough(tmp_path: Path) -> None:
    status, _ = _without_apt(tmp_path, {**BUILD_WITHOUT_APT, "patch": "GNU patch 2.7.6"})
    assert status == 0


def test_without_apt_it_names_what_to_install_and_no_llama_server_of_ones_own(
    tmp_path: Path,
) -> None:
    # A BSD patch is there but is not GNU patch, which the llama.cpp patches need.
    status, err = _without_apt(tmp_path, {"make": "GNU Make 4.4", "patch": "patch 2.0-12u11"})
    assert status == 1
    for missing in ("cmake", "a C++ compiler", "GNU patch"):
        assert missing in err
    assert "ninja or make" not in err
    # A stock llama-server is no way around the build with the default config's shared engine.
    assert "SPECPROXY_LLAMA_SERVER" not in err


def test_without_apt_testing_names_the_tools_the_tests_drive(tmp_path: Path) -> None:
    status, err = _without_apt(
        tmp_path, {**BUILD_WITHOUT_APT, "patch": "GNU patch 2.7.6", "npm": "10.0"}, "test"
    )
    assert status == 1
    for missing in ("prometheus", "podman", "chromium", "node"):
        assert missing in err
    assert "npm" not in err and "cmake" not in err
