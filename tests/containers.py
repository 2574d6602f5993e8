"""Podman helpers for the image tests: settings for this kind of host, the base image, the build."""

from __future__ import annotations

import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest

from proxy.config import default_cache_dir
from proxy.provision.llama_server import build_dir, build_stamp
from tests.helpers import ROOT

IMAGE = "localhost/specproxy:test"
# No registry is reachable on the CI machines: the base is debootstrapped from Debian's mirror.
DEFAULT_BASE = "localhost/debian:bookworm"
CA_BUNDLE = Path("/etc/ssl/certs/ca-certificates.crt")
BUILD_TIMEOUT_S = 3600
HOST_CACHE = "/var/cache/specproxy-host"


def podman_env() -> dict[str, str]:
    """The environment for podman: the repository's containers.conf unless the caller set one."""
    env = dict(os.environ)
    env.setdefault("CONTAINERS_CONF", str(ROOT / "deploy" / "podman" / "containers.conf"))
    return env


def podman(
    *args: str, timeout: float = 120, check: bool = True
) -> subprocess.CompletedProcess[str]:
    """Run one podman command and return its result; failures carry podman's output."""
    result = subprocess.run(
        ["podman", *args], env=podman_env(), capture_output=True, text=True, timeout=timeout
    )
    if check and result.returncode != 0:
        raise AssertionError(
            f"podman {' '.join(args[:3])} ... exited {result.returncode}:\n"
            f"{result.stdout[-3000:]}\n{result.stderr[-3000:]}"
        )
    return result


def require_podman() -> None:
    """Skip, saying what to install, where podman is missing (system-deps.sh test has it)."""
    missing = [t for t in ("podman", "runc", "debootstrap") if shutil.which(t) is None]
    if missing:
        pytest.skip(f"{', '.join(missing)} not installed: run scripts/system-deps.sh test (Debian)")


def ca_mount() -> list[str]:
    """Mount the host's CA bundle where Debian keeps it: HTTPS from a container needs it here."""
    return ["-v", f"{CA_BUNDLE}:{CA_BUNDLE}:ro"] if CA_BUNDLE.is_file() else []


def ensure_base_image() -> str:
    """The base image: $SPECPROXY_IMAGE_BASE, else a debootstrapped Debian bookworm."""
    base = os.environ.get("SPECPROXY_IMAGE_BASE")
    if base:
        return base
    subprocess.run(
        [str(ROOT / "scripts" / "base-image.sh"), DEFAULT_BASE],
        env=podman_env(),
        check=True,
        timeout=900,
    )
    return DEFAULT_BASE


def reuse_host_build() -> list[str]:
    """Build options that hand the image the host's provisioned llama-server instead of compiling.

    Only where the binary is the one the image would build: the test base (Debian 12) on a Debian 12
    host, whose build's stamp names the same source and flags (provisioning checks it again inside
    the build). Saves a 15-30 min compile on each fresh CI machine; SPECPROXY_IMAGE_COMPILE=1 to
    compile anyway.
    """
    if os.environ.get("SPECPROXY_IMAGE_COMPILE") == "1" or os.environ.get("SPECPROXY_IMAGE_BASE"):
        return []
    os_release = Path("/etc/os-release")
    if "VERSION_CODENAME=bookworm" not in (os_release.read_text() if os_release.is_file() else ""):
        return []
    cache = default_cache_dir()
    stamp = build_dir(cache) / ".specproxy-complete"
    if not (stamp.is_file() and stamp.read_text() == build_stamp()):
        return []
    return ["-v", f"{cache}:{HOST_CACHE}:ro", "--build-arg", f"LLAMA_SERVER_CACHE={HOST_CACHE}"]


def image_id(name: str) -> str | None:
    """The id a tag points at now, or None."""
    result = podman("image", "inspect", "--format", "{{.Id}}", name, check=False)
    return result.stdout.strip() if result.returncode == 0 else None


def build(
    tag: str, containerfile: Path, *build_args: str, log: Path, stages: tuple[str, ...] = ()
) -> float:
    """Build an image (niced; layer and ccache caches kept), drop the ones it replaces; seconds.

    Each named stage is tagged too (<tag>-<stage>, from cached layers): it stays as the next
    build's layer cache, and the stage image it replaces is removed rather than left dangling.
    """
    targets = [(tag, []), *((f"{tag}-{s}", ["--target", s]) for s in stages)]
    start = time.monotonic()
    with log.open("w") as out:
        for name, target in targets:
            previous = image_id(name)
            result = subprocess.run(
                [
                    "nice", "-n", "19", "podman", "build", "--layers", "--network", "host",
                    "--format", "docker", "-f", str(containerfile), "-t", name, *target,
                    *ca_mount(), *build_args, str(ROOT),
                ],
                env=podman_env(), stdout=out, stderr=subprocess.STDOUT, text=True,
                timeout=BUILD_TIMEOUT_S,
            )  # fmt: skip
            if result.returncode != 0:
                raise AssertionError(f"podman build of {name} failed:\n{log.read_text()[-4000:]}")
            if previous is not None and previous != image_id(name):
                podman("rmi", previous, check=False)
    return time.monotonic() - start
