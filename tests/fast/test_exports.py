"""What specproxy exports, pinned: the `specproxy` command and its options, the package's public
names, and the HTTP routes the app registers. Clients, scripts and deployments depend on each;
changing one must be a deliberate edit of this file, not a side effect (fast tier).
"""

from __future__ import annotations

import ast
import contextlib
import io
import json
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

import proxy
from proxy.api.app import build_app
from proxy.backends.launch import prepare_backends
from proxy.cli import main
from proxy.config import Settings
from tests.helpers import ROOT, clean_env

# `specproxy [COMMAND] --help`'s usage line per command: its options and arguments.
CLI_USAGE = {
    (): "usage: specproxy [-h] [--config CONFIG] {serve,provision,models,bench} ...",
    ("serve",): "usage: specproxy serve [-h] [--host HOST] [--port PORT]",
    ("provision",): "usage: specproxy provision [-h] [MODEL ...]",
    ("models",): "usage: specproxy models [-h]",
    ("bench",): "usage: specproxy bench [-h] [--out OUT] [--tokens TOKENS] [--repeats REPEATS] "
    "[--tasks TASKS] [--temperatures TEMPERATURES] [--n-max N_MAX]",
}
CONSOLE_SCRIPTS = {"specproxy": "proxy.cli:main"}
# What `import proxy` defines (beyond what every module has).
PACKAGE_NAMES = ["__version__"]
# The OpenAI, Anthropic and llama.cpp surfaces (proxy/api/surfaces.py), each a POST.
SURFACE_PATHS = [
    "/v1/chat/completions",
    "/v1/completions",
    "/v1/responses",
    "/v1/messages",
    "/infill",
    "/completion",
    "/tokenize",
    "/detokenize",
    "/apply-template",
    "/v1/embeddings",
    "/v1/chat/completions/input_tokens",
    "/v1/responses/input_tokens",
    "/v1/messages/count_tokens",
]
# Every route of the app (proxy/api/routes.py add_routes); aiohttp answers HEAD beside GET.
ROUTES = sorted(
    [("POST", path) for path in SURFACE_PATHS]
    + [
        (method, path)
        for path in ("/", "/v1/models", "/health", "/metrics", "/scoreboard", "/ui", "/ui/live")
        for method in ("GET", "HEAD")
    ]
    + [("POST", "/admin/backends/{name}/restart")]
)


def usage(*command: str, monkeypatch: pytest.MonkeyPatch) -> str:
    """The usage line `specproxy COMMAND --help` prints, unwrapped."""
    monkeypatch.setenv("COLUMNS", "1000")  # argparse wraps at the terminal's width
    out = io.StringIO()
    with contextlib.redirect_stdout(out), pytest.raises(SystemExit) as exited:
        main([*command, "--help"])
    assert exited.value.code == 0
    return out.getvalue().splitlines()[0]


@pytest.mark.parametrize("command", sorted(CLI_USAGE), ids=lambda c: " ".join(c) or "specproxy")
def test_the_cli_commands_and_their_options(
    command: tuple[str, ...], monkeypatch: pytest.MonkeyPatch
) -> None:
    assert usage(*command, monkeypatch=monkeypatch) == CLI_USAGE[command]


def test_the_console_script_is_the_cli() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["scripts"] == CONSOLE_SCRIPTS


def test_the_packages_public_names() -> None:
    # A fresh interpreter: here `proxy` also carries every submodule the tests imported.
    probe = (
        "import json, proxy, types; "
        "plain = set(vars(types.ModuleType('m'))) | {'__file__', '__path__', '__cached__', "
        "'__builtins__'}; "
        "print(json.dumps(sorted(set(vars(proxy)) - plain)))"
    )
    result = subprocess.run(
        [sys.executable, "-c", probe], cwd=ROOT, env=clean_env(), capture_output=True, text=True
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout) == PACKAGE_NAMES
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert proxy.__version__ == project["version"]


def test_the_http_routes(tmp_path: Path) -> None:
    settings = Settings(
        backends=[{"name": "b", "url": "http://127.0.0.1:9"}],
        cache_dir=tmp_path,
        scoreboard_file=tmp_path / "scoreboard.json",
    )
    app = build_app(settings, prepare_backends(settings))
    routes = sorted((r.method, r.resource.canonical) for r in app.router.routes() if r.resource)
    assert routes == ROUTES


def test_scripts_import_nothing_from_tests() -> None:
    # Scripts run without the test suite (and its conftest) on the path.
    for script in sorted((ROOT / "scripts").rglob("*.py")):
        for node in ast.walk(ast.parse(script.read_text(), str(script))):
            names = (
                [a.name for a in node.names]
                if isinstance(node, ast.Import)
                else [node.module or ""]
                if isinstance(node, ast.ImportFrom)
                else []
            )
            assert not any(n == "tests" or n.startswith("tests.") for n in names), script.name
