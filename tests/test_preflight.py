"""Start-up checks: a taken port, an unwritable cache or a missing model stop the proxy at once."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, TEST_CONFIG


def serve(*args: str, config: Path = TEST_CONFIG, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "--config", str(config), "serve", *args],
        cwd=ROOT,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=60,
    )


def no_llama_server_started() -> bool:
    found = subprocess.run(["pgrep", "-f", "llama-server.*--alias"], capture_output=True)
    return found.returncode == 1


def test_a_taken_port_is_one_line_and_nothing_starts() -> None:
    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        before = no_llama_server_started()
        result = serve("--port", str(port))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"specproxy: port {port} on 127.0.0.1 is already in use (another specproxy or "
        "server?); stop it, or pick another port with --port / SPECPROXY_PORT"
    ]
    assert "Traceback" not in result.stderr + result.stdout
    if before:
        assert no_llama_server_started()


def test_an_unwritable_cache_and_a_missing_model_are_named(tmp_path: Path) -> None:
    blocker = tmp_path / "file"
    blocker.write_text("not a directory")
    config = tmp_path / "c.yaml"
    config.write_text(
        "backends:\n"
        "  - {name: a, model: smollm2-135m}\n"
        f"  - {{name: b, model: {tmp_path}/missing.gguf}}\n"
    )
    result = serve("--port", "0", config=config, SPECPROXY_CACHE_DIR=str(blocker / "cache"))
    assert result.returncode == 2
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 2, result.stderr
    assert f"model {tmp_path}/missing.gguf is not a file" in lines[0]
    assert f"cache directory {blocker / 'cache'} is not writable" in lines[1]
    assert "SPECPROXY_CACHE_DIR" in lines[1]
