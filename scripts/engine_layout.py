"""Which strategies should share an engine: each layout's prompt and decode speed per strategy,
and its memory, beside the bare llama-server a user would run, measured in one run.

Layouts (from the config's plain, ngram and draft backends, whatever engines it names):
  bare               the plain backend's own process, the baseline
  plain+ngram        one engine holding both
  plain+ngram+draft  one engine holding all three (its draft model processes every prompt)
Each layout is started alone (nothing else runs), sent --rounds requests per strategy with a
prompt of about --tokens tokens no cache holds, and stopped; the layouts take turns round by
round, so the machine's drift falls on all of them alike.

    .venv/bin/python scripts/engine_layout.py [--config FILE] [--tokens 3000] [--rounds 2]

Not a test: it starts real llama-servers, about a minute per layout and round on two cores.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import psutil
import requests

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from loadtests.bare import BareServer, free_port, log  # noqa: E402
from proxy.backends.launch import LaunchSpec, engine_spec, prepare_backends  # noqa: E402
from proxy.config import load_settings  # noqa: E402
from proxy.workload import fresh_word  # noqa: E402

# What each strategy sends in an engine; the bare process gets nothing.
FIELDS: dict[str, dict[str, Any]] = {
    "plain": {"speculative.n_max": 0},
    "ngram": {"speculative.types": ["ngram-mod"]},
}


@dataclass
class Cell:
    """One layout's measurements of one strategy."""

    prompt_tps: list[float] = field(default_factory=list)
    decode_tps: list[float] = field(default_factory=list)


def prompt_text(tokens: int, word: str) -> str:
    """A code file of about `tokens` tokens, new to every cache (its first line is unique), its
    functions named with word, so the rewrite asked of it is new to the engine too: a shared
    engine's ngram-mod would otherwise copy the answer another strategy gave (issue 45)."""
    lines = [f"# request {uuid.uuid4().hex}"]
    i = 0
    while len(lines) * 12 < tokens:
        lines += [f"def step_{i}_{word}(state, value):", f"    state.total += value * {i}", ""]
        i += 1
    return "\n".join(lines)


def measure(url: str, tokens: int, fields: dict[str, Any]) -> tuple[float, float]:
    """(prompt tokens/s, decode tokens/s) of one request with a prompt no cache holds."""
    word = fresh_word(int(uuid.uuid4().int % 10**9))
    ask = f"Rewrite step_3_{word} to check value."
    body = {
        "messages": [
            {"role": "system", "content": "You are a coding assistant."},
            {"role": "user", "content": f"{prompt_text(tokens, word)}\n\n{ask}"},
        ],
        "max_tokens": 64,
        "temperature": 0,
        **fields,
    }
    resp = requests.post(f"{url}/v1/chat/completions", json=body, timeout=1800)
    resp.raise_for_status()
    timings = resp.json()["timings"]
    return float(timings["prompt_per_second"]), float(timings["predicted_per_second"])


def layouts(specs: list[LaunchSpec]) -> dict[str, tuple[LaunchSpec, list[str]]]:
    """Each layout's process and the strategies measured on it."""
    by_kind = {s.config.kind: s for s in specs if s.config.supervised}
    plain, ngram, draft = by_kind["plain"], by_kind["ngram"], by_kind["draft-simple"]
    return {
        "bare": (plain, ["plain"]),
        "plain+ngram": (engine_spec("engine", [plain, ngram]), ["plain", "ngram"]),
        "plain+ngram+draft": (engine_spec("engine", [plain, ngram, draft]), ["plain", "ngram"]),
    }


def main(argv: list[str] | None = None) -> int:
    """Measure every layout round by round and print the table."""
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--config", type=Path, help="default: the embedded CPU config")
    p.add_argument("--tokens", type=int, default=3000, help="tokens of each prompt")
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--log-dir", type=Path, default=Path("/tmp"))
    args = p.parse_args(argv)
    settings = load_settings(args.config)
    cells: dict[tuple[str, str], Cell] = {}
    memory: dict[str, float] = {}
    for round_ in range(1, args.rounds + 1):
        for name, (spec, strategies) in layouts(prepare_backends(settings)).items():
            port = free_port()
            command = spec.argv("127.0.0.1", port)
            log(f"round {round_}: {name}")
            with BareServer(command, port, args.log_dir / f"layout-{name}.log") as server:
                for strategy in strategies:
                    fields = {} if name == "bare" else FIELDS[strategy]
                    prompt, decode = measure(server.url, args.tokens, fields)
                    cell = cells.setdefault((name, strategy), Cell())
                    cell.prompt_tps.append(prompt)
                    cell.decode_tps.append(decode)
                assert server.process is not None
                rss = psutil.Process(server.process.pid).memory_info().rss / 2**30
                memory[name] = max(memory.get(name, 0.0), rss)
    base = cells[("bare", "plain")]
    base_prompt = statistics.median(base.prompt_tps)
    base_decode = statistics.median(base.decode_tps)
    print(
        "| layout | strategy | prompt t/s | × bare | decode t/s | × bare | resident GiB |\n"
        "| --- | --- | ---: | ---: | ---: | ---: | ---: |"
    )
    for (name, strategy), cell in cells.items():
        prompt = statistics.median(cell.prompt_tps)
        decode = statistics.median(cell.decode_tps)
        print(
            f"| {name} | {strategy} | {prompt:.1f} | {prompt / base_prompt:.2f} | "
            f"{decode:.1f} | {decode / base_decode:.2f} | {memory[name]:.2f} |"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
