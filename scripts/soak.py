"""Soak: mixed load for a long time while a backend is killed every few minutes.

Reports requests served, errors by kind, and the proxy's memory and open file descriptors at
start and end. Not part of CI.

    .venv/bin/python scripts/soak.py [--config tests/configs/test.yaml] [--minutes 30]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import sys
import tempfile
import threading
import time
import urllib.request
from collections import Counter
from pathlib import Path
from typing import Any

import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.testing.running_proxy import start_proxy  # noqa: E402

PROMPTS = [
    ("Write a Python function that checks if a string is a palindrome.", False),
    ("Tell me a short story about a fox.", True),
    ("Repeat this sentence three times: the cat sleeps on the sofa.", True),
    ("Explain what a hash map is.", False),
]


def proxy_usage(pid: int) -> tuple[int, int]:
    """Resident memory in KiB and open file descriptors of a process."""
    rss = next(
        int(line.split()[1])
        for line in Path(f"/proc/{pid}/status").read_text().splitlines()
        if line.startswith("VmRSS:")
    )
    return rss, len(os.listdir(f"/proc/{pid}/fd"))


def health(url: str) -> dict[str, Any]:
    with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
        return dict(json.load(resp))


def worker(url: str, stop: threading.Event, served: Counter[str], errors: Counter[str]) -> None:
    client = openai.OpenAI(base_url=f"{url}/v1", api_key="x", max_retries=0, timeout=120)
    rng = random.Random()
    while not stop.is_set():
        prompt, stream = rng.choice(PROMPTS)
        try:
            if stream:
                chunks = client.chat.completions.create(
                    model="auto", messages=[{"role": "user", "content": prompt}],
                    max_tokens=48, stream=True,
                )  # fmt: skip
                events = list(chunks)
                if not events:
                    errors["empty stream"] += 1
                    continue
            else:
                client.chat.completions.create(
                    model="auto", messages=[{"role": "user", "content": prompt}], max_tokens=48
                )
            served["ok"] += 1
        except openai.APIStatusError as exc:
            errors[f"HTTP {exc.status_code} {getattr(exc, 'code', '')}"] += 1
        except openai.APIError as exc:
            errors[type(exc).__name__] += 1


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path, default=ROOT / "tests" / "configs" / "test.yaml")
    parser.add_argument("--minutes", type=float, default=30)
    parser.add_argument("--kill-every", type=float, default=180, help="seconds between kills")
    parser.add_argument("--clients", type=int, default=4)
    parser.add_argument("--port", type=int, default=8093)
    args = parser.parse_args()
    workdir = Path(tempfile.mkdtemp(prefix="specproxy-soak-"))
    running = start_proxy(args.config, workdir / "proxy.log", port=args.port, inherit_env=True)
    proxy, url = running.process, running.url
    running.wait_ready(600)
    start_usage = proxy_usage(proxy.pid)
    served: Counter[str] = Counter()
    errors: Counter[str] = Counter()
    stop = threading.Event()
    threads = [
        threading.Thread(target=worker, args=(url, stop, served, errors))
        for _ in range(args.clients)
    ]
    for t in threads:
        t.start()
    kills = 0
    end = time.monotonic() + args.minutes * 60
    next_kill = time.monotonic() + args.kill_every
    while time.monotonic() < end:
        time.sleep(1)
        if time.monotonic() >= next_kill:
            backends = health(url)["backends"]
            assert isinstance(backends, dict)
            name, victim = random.choice([(n, b) for n, b in backends.items() if b["pid"]])
            os.kill(victim["pid"], signal.SIGKILL)
            kills += 1
            print(f"killed {name} (pid {victim['pid']}) after {served['ok']} requests", flush=True)
            next_kill += args.kill_every
    stop.set()
    for t in threads:
        t.join(180)
    end_usage = proxy_usage(proxy.pid)
    final = health(url)
    running.stop()
    restarts = {n: b["restarts"] for n, b in final["backends"].items()}
    print(f"\n{args.minutes:g} minutes, {args.clients} clients, {kills} backend kills")
    print(f"requests served: {served['ok']}; errors: {dict(errors) or 'none'}")
    print(f"restarts per backend: {restarts}; final status: {final['status']}")
    print(f"proxy RSS {start_usage[0] / 1024:.1f} MiB -> {end_usage[0] / 1024:.1f} MiB; "
          f"open fds {start_usage[1]} -> {end_usage[1]}")  # fmt: skip


if __name__ == "__main__":
    main()
