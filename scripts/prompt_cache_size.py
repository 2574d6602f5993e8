"""How much RAM one prompt takes in each backend's RAM prompt cache, measured, and the
`cache_ram_mib` that keeps a number of agent sessions' prompts.

Each backend of the config is started alone with its own command line but `--cache-ram 1`, sent
one prompt of about --tokens tokens, then a second one: llama-server saves the idle slot's prompt
to its RAM cache and, finding it larger than 1 MiB, logs its exact size. A draft backend's entry
holds the draft model's KV too.

    .venv/bin/python scripts/prompt_cache_size.py [--config FILE] [--tokens 2000] \
        [--sessions 8] [--session-tokens 20000]

Not a test: it starts real llama-servers and takes a minute or two per backend on two cores.
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtests.bare import BareServer, free_port, log  # noqa: E402
from proxy.backends.launch import prepare_backends  # noqa: E402
from proxy.config import load_settings  # noqa: E402

_SIZE = re.compile(r"prompt state size ([0-9.]+) MiB exceeds cache size limit")


def entry_mib(argv: list[str], tokens: int, log_path: Path) -> tuple[float, int]:
    """(MiB of one cached prompt, its tokens) for a server started with argv."""
    port = int(argv[argv.index("--port") + 1])
    # Words of a few characters: about one token each with Qwen's and SmolLM's tokenizers.
    text = " ".join(f"w{i % 97}" for i in range(tokens // 2))
    with BareServer(argv, port, log_path) as server:
        first = requests.post(
            f"{server.url}/completion",
            json={"prompt": text, "n_predict": 1, "cache_prompt": True},
            timeout=1800,
        ).json()
        # A second prompt starts a task: the idle slot's prompt is saved to the RAM cache.
        requests.post(
            f"{server.url}/completion", json={"prompt": "hello", "n_predict": 1}, timeout=600
        ).raise_for_status()
    sizes = _SIZE.findall(log_path.read_text(errors="replace"))
    if not sizes:
        raise SystemExit(f"llama-server logged no prompt state size; see {log_path}")
    held = int(first["timings"]["prompt_n"]) + int(first["timings"]["cache_n"]) + 1
    return float(sizes[-1]), held


def main(argv: list[str] | None = None) -> int:
    """Measure every supervised backend of the config and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, help="default: the embedded CPU config")
    p.add_argument("--tokens", type=int, default=2000, help="tokens of the measured prompt")
    p.add_argument("--sessions", type=int, default=8, help="agent sessions to keep")
    p.add_argument("--session-tokens", type=int, default=20000, help="tokens of each")
    p.add_argument("--out", type=Path, default=Path("prompt-cache-size"), help="logs folder")
    args = p.parse_args(argv)
    settings = load_settings(args.config)
    args.out.mkdir(parents=True, exist_ok=True)
    print(
        f"| backend | cache_ram_mib now | MiB per 1,000 tokens | one {args.session_tokens:,}-token "
        f"prompt, MiB | {args.sessions} of them, MiB |"
    )
    print("| --- | ---: | ---: | ---: | ---: |")
    for spec in prepare_backends(settings):
        if spec.binary is None:
            continue  # an external server's memory is not ours to size
        argv = spec.argv("127.0.0.1", free_port())
        if "--cache-ram" in argv:
            at = argv.index("--cache-ram")
            del argv[at : at + 2]
        argv += ["--cache-ram", "1"]
        name = spec.config.name
        log(f"measuring {name}")
        mib, tokens = entry_mib(argv, args.tokens, args.out / f"{name}.log")
        per_token = mib / tokens
        one = per_token * args.session_tokens
        print(
            f"| {name} | {spec.config.cache_ram_mib} | {per_token * 1000:.1f} | {one:.0f} | "
            f"{one * args.sessions:.0f} |",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
