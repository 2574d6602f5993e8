"""Start-up checks that run before anything is built or spawned: port, cache, model files."""

from __future__ import annotations

import errno
import os
import socket
import tempfile
from pathlib import Path

from proxy.config import Settings
from proxy.provision.models import CATALOG, GENERATED


class PreflightError(Exception):
    """The proxy cannot start as configured; one line per problem, each saying what to do."""


def _missing_models(settings: Settings) -> list[str]:
    problems = []
    for backend in settings.backends:
        for field, ref in (("model", backend.model), ("draft_model", backend.draft_model)):
            if ref is None or ref in CATALOG or ref in GENERATED:
                continue
            if not Path(ref).expanduser().is_file():
                problems.append(
                    f"backend {backend.name!r}: {field} {ref} is not a file; fix the path or "
                    f"use a catalog name (`specproxy models`)"
                )
    return problems


def _needs_cache(settings: Settings) -> bool:
    supervised = [b for b in settings.backends if b.supervised]
    catalog = any(
        ref in CATALOG or ref in GENERATED
        for b in supervised
        for ref in (b.model, b.draft_model)
        if ref
    )
    return catalog or bool(supervised and settings.llama_server is None)


def _unwritable_cache(settings: Settings) -> list[str]:
    if not _needs_cache(settings):
        return []
    cache = settings.cache_dir
    try:
        cache.mkdir(parents=True, exist_ok=True)
        with tempfile.NamedTemporaryFile(dir=cache, prefix=".write-check-"):
            pass
    except OSError as exc:
        return [
            f"cache directory {cache} is not writable ({exc.strerror or exc}); set "
            "SPECPROXY_CACHE_DIR or cache_dir to a writable directory"
        ]
    return []


def _bad_binary(settings: Settings) -> list[str]:
    binary = settings.llama_server
    if binary is None or not any(b.supervised for b in settings.backends):
        return []
    if not binary.is_file() or not os.access(binary, os.X_OK):
        return [
            f"llama_server {binary} is not an executable file; fix the path or unset "
            "SPECPROXY_LLAMA_SERVER to have specproxy build one"
        ]
    return []


def bind_listener(host: str, port: int) -> socket.socket:
    """The proxy's listening socket, bound before any backend starts; PreflightError if taken."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
        sock.listen(512)
    except OSError as exc:
        sock.close()
        if exc.errno == errno.EADDRINUSE:
            raise PreflightError(
                f"port {port} on {host} is already in use (another specproxy or server?); stop "
                "it, or pick another port with --port / SPECPROXY_PORT"
            ) from None
        raise PreflightError(
            f"cannot listen on {host}:{port}: {exc.strerror or exc}; check --host / --port"
        ) from None
    sock.setblocking(False)
    return sock


def check_files(settings: Settings) -> None:
    """Model paths, the cache directory and a configured binary; every problem at once."""
    problems = [*_missing_models(settings), *_unwritable_cache(settings), *_bad_binary(settings)]
    if problems:
        raise PreflightError("\n".join(problems))
