"""Restoring a kept prompt against computing it again: why specproxy keeps prompts as slot files.

The default config's shared engine (its own command line, slot files on) is sent one prompt of
about --tokens tokens: its prompt time is what a cold first turn costs. Its slot is then saved
(`POST /slots/0?action=save`), erased and restored, with the page cache dropped before the
restore when the machine allows it (root), so the file is read from disk; a second request with
the same start checks the restored prompt is found. Printed per 10 k tokens.

    .venv/bin/python scripts/prompt_restore_benchmark.py [--config FILE] [--tokens 10000]

Not a test: it starts a real llama-server and takes a few minutes on two cores.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtests.bare import BareServer, free_port, log  # noqa: E402
from proxy.backends.launch import engine_spec, prepare_backends  # noqa: E402
from proxy.config import load_settings  # noqa: E402


def _drop_page_cache() -> bool:
    """Drop the kernel's page cache (root only); whether it was dropped."""
    try:
        subprocess.run(["sync"], check=True)
        Path("/proc/sys/vm/drop_caches").write_text("3\n")
    except OSError:
        return False
    return True


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=None)
    parser.add_argument("--tokens", type=int, default=10000)
    args = parser.parse_args()
    settings = load_settings(args.config)
    specs = prepare_backends(settings)
    engines = settings.engines()
    if engines:
        name = next(iter(engines))
        spec = engine_spec(name, [s for s in specs if s.config.engine == name])
    else:
        spec = specs[0]
    with tempfile.TemporaryDirectory(prefix="specproxy-restore-") as tmp:
        port = free_port()
        argv = [*spec.argv("127.0.0.1", port), "--slot-save-path", tmp]
        # Words of a few characters: about one token each with Qwen's and SmolLM's tokenizers.
        text = " ".join(f"w{i % 97}" for i in range(args.tokens // 2))
        with BareServer(argv, port, Path(tmp) / "llama-server.log") as server:

            def ask(question: str) -> dict[str, float]:
                body: dict[str, Any] = {
                    "messages": [
                        {"role": "system", "content": text},
                        {"role": "user", "content": question},
                    ],
                    "max_tokens": 1,
                    "id_slot": 0,
                }
                resp = requests.post(f"{server.url}/v1/chat/completions", json=body, timeout=3600)
                resp.raise_for_status()
                timings: dict[str, float] = resp.json()["timings"]
                return timings

            log(f"computing a {args.tokens}-token prompt")
            cold = ask("Say hi.")
            saved = requests.post(
                f"{server.url}/slots/0?action=save", json={"filename": "kept.slot"}, timeout=600
            ).json()
            requests.post(f"{server.url}/slots/0?action=erase", timeout=60).raise_for_status()
            dropped = _drop_page_cache()
            restored = requests.post(
                f"{server.url}/slots/0?action=restore", json={"filename": "kept.slot"}, timeout=600
            ).json()
            warm = ask("Say bye.")
    tokens = cold["prompt_n"] + cold["cache_n"]
    per = 10000 / tokens
    compute_s = cold["prompt_ms"] / 1000
    restore_s = restored["timings"]["restore_ms"] / 1000
    print(f"prompt: {tokens:.0f} tokens; slot file {saved['n_written'] / 2**20:.0f} MiB")
    print(f"computed:  {compute_s:8.2f} s  ({compute_s * per:.1f} s per 10 k tokens)")
    print(f"saved:     {saved['timings']['save_ms'] / 1000:8.3f} s")
    print(
        f"restored:  {restore_s:8.3f} s  ({restore_s * per:.3f} s per 10 k tokens, "
        f"{'from disk: page cache dropped' if dropped else 'page cache not dropped'})"
    )
    print(f"after restore, the same start: {warm['cache_n']:.0f} of {tokens:.0f} tokens cached")
    print(f"restore is {compute_s / restore_s:.0f}x faster than computing")


if __name__ == "__main__":
    main()
