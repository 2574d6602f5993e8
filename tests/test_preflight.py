"""Start-up checks: a taken port, an unwritable cache, a missing model or binary, an invalid
config stop the proxy at once, with one line each and before any llama-server is built or run.

`specproxy serve` runs as a subprocess with the caller's SPECPROXY_* variables removed
(`clean_env`): `SPECPROXY_LLAMA_SERVER=/x pytest` must not add a line of its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.conftest import ROOT, TEST_CONFIG
from tests.helpers import clean_env, taken_port


def serve(*args: str, config: Path = TEST_CONFIG, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "--config", str(config), "serve", *args],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def no_llama_server_started() -> bool:
    found = subprocess.run(["pgrep", "-f", "llama-server.*--alias"], capture_output=True)
    return found.returncode == 1


def test_a_taken_port_is_one_line_and_nothing_starts() -> None:
    with taken_port() as port:
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


def test_a_missing_user_binary_is_a_clear_error(tmp_path: Path) -> None:
    config = tmp_path / "c.yaml"
    config.write_text("backends:\n  - {name: p, model: smollm2-135m}\n")
    binary = tmp_path / "no-such-llama-server"
    result = serve("--port", "0", config=config, SPECPROXY_LLAMA_SERVER=str(binary))
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"specproxy: llama_server {binary} is not an executable file; fix the path or unset "
        "SPECPROXY_LLAMA_SERVER to have specproxy build one"
    ]


def test_an_invalid_config_exits_with_the_field_named(tmp_path: Path) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("backends:\n  - {name: p, model: m, threads: 0}\n")
    result = serve(config=config)
    assert result.returncode == 2, result.stderr
    assert "invalid configuration" in result.stderr and "backends.0.threads" in result.stderr
    assert "Traceback" not in result.stderr
