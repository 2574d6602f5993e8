"""Routing benchmark: a mixed workload through `auto` against every backend pinned and the oracle.

Starts `specproxy serve` (default: the embedded CPU config) with a fresh scoreboard, waits for
calibration, then sends the same mixed workload of code, prose and echo requests once per mode:
each backend pinned, then `auto`. The oracle is the best pinned backend per task class, measured
in the same run. Prints a Markdown table; not a test (timings on a shared machine are noisy).

    .venv/bin/python scripts/routing_benchmark.py [--config FILE] [--tokens 128] [--rounds 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parent.parent
_LOOP = """def normalise(records):
    out = []
    for record in records:
        name = record.get("name", "").strip().lower()
        email = record.get("email", "").strip().lower()
        if not name or not email:
            continue
        out.append({"name": name, "email": email, "active": bool(record.get("active"))})
    return out
"""
_PARAGRAPH = (
    "The meeting has been moved to Thursday at three o'clock in the large conference room. "
    "Please bring the quarterly figures, the draft budget for next year and any questions "
    "you have about the new travel policy. Lunch will be served after the meeting. "
)
WORKLOAD: dict[str, list[str]] = {
    "code": [
        "Write a Python function that merges overlapping intervals, with a docstring and tests.",
        "Implement a thread-safe token bucket rate limiter in Python.",
        "Write a TypeScript function that debounces another function, with types.",
        "Scrivi in Python una funzione che legge un CSV e calcola la media di ogni colonna.",
    ],
    "prose": [
        "Write a short story about a lighthouse keeper who finds a message in a bottle.",
        "Explain to a ten-year-old why the sky is blue, in two paragraphs.",
        "Write a warm thank-you letter to a teacher who is retiring.",
        "Scrivi un breve racconto su un gatto che vive in una biblioteca.",
    ],
    "echo": [
        f"Add type hints to this Python code. Return the full code only.\n\n```python\n{_LOOP}```",
        f"Rename the function to clean_records and return the whole code.\n\n```python\n{_LOOP}```",
        f"Fix the punctuation and repeat this text unchanged otherwise:\n\n{_PARAGRAPH * 2}",
        "Repeat this sentence exactly five times, one per line: "
        "'The quick brown fox jumps over the lazy dog near the river bank.'",
    ],
}


def get_json(url: str) -> dict[str, object]:
    with urllib.request.urlopen(url, timeout=10) as resp:
        return dict(json.load(resp))


def start_proxy(
    config: Path | None, port: int, workdir: Path
) -> tuple[subprocess.Popen[str], Path]:
    log = workdir / "proxy.log"
    env = {
        **os.environ,
        "SPECPROXY_PORT": str(port),
        "SPECPROXY_LOG_FORMAT": "json",
        "SPECPROXY_SCOREBOARD_FILE": str(workdir / "scoreboard.json"),
    }
    argv = [sys.executable, "-m", "proxy", *(["--config", str(config)] if config else []), "serve"]
    with log.open("w") as fh:
        proc = subprocess.Popen(
            argv, cwd=ROOT, env=env, stdout=fh, stderr=subprocess.STDOUT, text=True
        )
    while '"calibration done"' not in log.read_text():
        if proc.poll() is not None:
            raise SystemExit(f"proxy exited:\n{log.read_text()[-2000:]}")
        time.sleep(1)
    return proc, log


def run_mode(
    client: openai.OpenAI, model: str, jobs: list[tuple[str, str]], tokens: int
) -> dict[str, object]:
    per_task: dict[str, list[float]] = defaultdict(lambda: [0.0, 0.0])  # tokens, seconds
    chosen: Counter[str] = Counter()
    for task, prompt in jobs:
        raw = client.chat.completions.with_raw_response.create(
            model=model,
            messages=[{"role": "user", "content": prompt}],
            max_tokens=tokens,
            temperature=0,
        )
        timings = json.loads(raw.text)["timings"]
        per_task[task][0] += timings["predicted_n"]
        per_task[task][1] += timings["predicted_ms"] / 1000
        chosen[f"{task}->{raw.headers['x-specproxy-backend']}"] += 1
        chosen[f"route:{raw.headers['x-specproxy-route']}"] += 1
    return {"per_task": dict(per_task), "chosen": chosen}


def tps(tokens_seconds: list[float]) -> float:
    return tokens_seconds[0] / tokens_seconds[1] if tokens_seconds[1] else 0.0


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path)
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--rounds", type=int, default=1, help="times each prompt is sent per mode")
    parser.add_argument("--port", type=int, default=8091)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="specproxy-routing-"))
    proc, _ = start_proxy(args.config, args.port, workdir)
    try:
        client = openai.OpenAI(
            base_url=f"http://127.0.0.1:{args.port}/v1", api_key="x", timeout=600
        )
        backends = [m.id for m in client.models.list() if not m.id.startswith("auto")]
        jobs = [(t, p) for t, ps in WORKLOAD.items() for p in ps] * args.rounds
        random.Random(1).shuffle(jobs)
        results = {}
        for mode in [*backends, "auto"]:
            print(f"running {mode} ...", file=sys.stderr, flush=True)
            results[mode] = run_mode(client, mode, jobs, args.tokens)
    finally:
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
    tasks = list(WORKLOAD)

    def total(mode: str) -> float:
        per = results[mode]["per_task"]
        return sum(per[t][0] for t in tasks) / sum(per[t][1] for t in tasks)  # type: ignore[index]

    best = {t: max(backends, key=lambda b: tps(results[b]["per_task"][t])) for t in tasks}  # type: ignore[index]
    oracle_tokens = sum(results[best[t]]["per_task"][t][0] for t in tasks)  # type: ignore[index]
    oracle_seconds = sum(results[best[t]]["per_task"][t][1] for t in tasks)  # type: ignore[index]
    oracle = oracle_tokens / oracle_seconds
    print(
        f"\n{len(jobs)} requests per mode, {args.tokens} max tokens, temperature 0, single stream\n"
    )
    print("| mode | " + " | ".join(f"{t} t/s" for t in tasks) + " | overall t/s | vs oracle |")
    print("| --- | " + " | ".join("---:" for _ in tasks) + " | ---: | ---: |")
    for mode in [*backends, "auto"]:
        per = results[mode]["per_task"]
        cells = " | ".join(f"{tps(per[t]):.1f}" for t in tasks)  # type: ignore[index]
        print(f"| {mode} | {cells} | {total(mode):.1f} | {total(mode) / oracle:.1%} |")
    oracle_cells = " | ".join(
        f"{tps(results[best[t]]['per_task'][t]):.1f} ({best[t]})" for t in tasks
    )  # type: ignore[index]
    print(f"| oracle | {oracle_cells} | {oracle:.1f} | 100.0% |")
    print(f"\nauto's choices: {dict(results['auto']['chosen'])}")
    # What exploring costs: the share of auto requests sent elsewhere, times how much slower
    # the other backends are than the best one for that class (measured above, same run).
    share = float(os.environ.get("SPECPROXY_EXPLORE_SHARE", "0.05"))
    losses = [
        1 - tps(results[b]["per_task"][t]) / tps(results[best[t]]["per_task"][t])  # type: ignore[index]
        for t in tasks
        for b in backends
        if b != best[t]
    ]
    cost = share * sum(losses) / len(losses) if losses else 0.0
    print(f"exploration: share {share:.0%}, expected cost {cost:.1%} of auto's tokens/s")
    beats = all(total("auto") > total(b) for b in backends)
    print(f"auto = {total('auto') / oracle:.1%} of the oracle; above every pinned backend: {beats}")


if __name__ == "__main__":
    main()
