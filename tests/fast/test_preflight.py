"""Start-up checks: a taken port, an unwritable cache, a missing model or binary, an invalid
config stop the proxy at once, with one line each and before any llama-server is built or run.

`specproxy serve` runs as a subprocess with the caller's SPECPROXY_* variables removed
(`clean_env`): `SPECPROXY_LLAMA_SERVER=/x pytest` must not add a line of its own.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from proxy.backends.launch import prepare_backends
from proxy.config import load_settings
from tests.gguf_files import vocab_file
from tests.helpers import ROOT, TEST_CONFIG, clean_env, taken_port


def serve(*args: str, config: Path = TEST_CONFIG, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, "-m", "proxy", "--config", str(config), "serve", *args],
        cwd=ROOT,
        env=clean_env(**env),
        capture_output=True,
        text=True,
        timeout=60,
    )


def llama_server_leaving_a_mark(tmp_path: Path) -> tuple[Path, Path]:
    """A stand-in llama-server that only writes its arguments to a file: (binary, that file).

    Whether this file exists says whether the proxy under test ran its llama-server, whatever
    other llama-server processes run on the machine.
    """
    mark = tmp_path / "llama-server-ran"
    binary = tmp_path / "llama-server"
    binary.write_text(f'#!/bin/sh\necho "$@" > "{mark}"\n')
    binary.chmod(0o755)
    return binary, mark


def test_a_taken_port_is_one_line_and_nothing_starts(tmp_path: Path) -> None:
    binary, mark = llama_server_leaving_a_mark(tmp_path)
    model = vocab_file(tmp_path / "model.gguf")
    config = tmp_path / "c.yaml"
    config.write_text(f"llama_server: '{binary}'\nbackends:\n  - {{name: p, model: '{model}'}}\n")
    # On a free port this config runs that binary at once: nothing to build or download first.
    (spec,) = prepare_backends(load_settings(config))
    assert spec.argv("127.0.0.1", 8080)[0] == str(binary)
    with taken_port() as port:
        result = serve("--port", str(port), config=config)
    assert result.returncode == 2
    assert result.stderr.strip().splitlines() == [
        f"specproxy: port {port} on 127.0.0.1 is already in use (another specproxy or "
        "server?); stop it, or pick another port with --port / SPECPROXY_PORT"
    ]
    assert "Traceback" not in result.stderr + result.stdout
    assert not mark.exists(), f"llama-server ran before the port was checked: {mark.read_text()}"


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
