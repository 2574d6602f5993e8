"""Device policy benchmark: what sharing one CPU between backends costs, policy by policy.

Starts the embedded default config (Qwen2.5-Coder-1.5B served plain, with a draft and with
n-grams) three ways, one after the other, twice in alternating order so the machine's drift hits
each alike:

- unscheduled: every backend `threads: 2`, the device's capacity raised so nothing waits — how
  specproxy behaved before the device scheduler (the oversubscription cliff);
- serialised (the default): `threads: 2` each on a 2-thread device, so backends take turns and
  requests for the backend already decoding join its batch;
- partitioned: `threads: 1` each, so two backends decode side by side on a core each.

Per policy it measures single-stream speed, then 2, 4 and 8 streams sent at the same moment,
half pinned to `plain` and half to `ngram` (the pattern that fell off the cliff), and the same
counts all pinned to `plain` (batching in one process). Aggregate tokens/s = all tokens the
streams generated / the wall time until the last finished; the device wait is what the proxy
reported per request (X-Specproxy-Device-Wait). Prints a Markdown table; not a test.

    .venv/bin/python scripts/device_policy.py [--tokens 64] [--rounds 2]
"""

from __future__ import annotations

import argparse
import asyncio
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path

import aiohttp
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.config import DEFAULT_CONFIG  # noqa: E402
from proxy.llamacpp import Timings  # noqa: E402
from proxy.testing.running_proxy import start_proxy  # noqa: E402

POLICIES: dict[str, tuple[int, int]] = {
    # name: (threads per backend, device capacity)
    "unscheduled": (2, 6),
    "serialised": (2, 2),
    "partitioned": (1, 2),
}
PROMPT = "Write a Python function that merges overlapping intervals, with a docstring and tests."
CELL_TIMEOUT_S = 120.0


@dataclass
class Cell:
    """One measurement: streams sent together and what they made."""

    policy: str
    pattern: str
    streams: int
    aggregate_tps: float
    slowest_stream_tps: float
    wall_s: float
    wait_p50_s: float
    wait_max_s: float
    timed_out: bool = False


def write_config(threads: int, capacity: int, path: Path) -> None:
    config = yaml.safe_load(DEFAULT_CONFIG.read_text())
    for backend in config["backends"]:
        backend["threads"] = threads
    config["devices"] = {"cpu": {"capacity": capacity}}
    config["calibration_requests"] = 0
    path.write_text(yaml.safe_dump(config))


async def one(
    session: aiohttp.ClientSession, url: str, model: str, tokens: int
) -> tuple[int, float, float, float]:
    """(tokens, llama-server tokens/s, device wait, finish time) of one pinned request."""
    body = {
        "model": model,
        "messages": [{"role": "user", "content": PROMPT}],
        "max_tokens": tokens,
        "temperature": 0,
    }
    async with session.post(f"{url}/v1/chat/completions", json=body) as resp:
        data = await resp.json()
        wait = float(resp.headers.get("X-Specproxy-Device-Wait", "0"))
    timings = Timings.parse(data.get("timings"))
    return (
        timings.predicted_n,
        timings.tokens_per_s,
        wait,
        time.monotonic(),
    )


async def cell(
    session: aiohttp.ClientSession,
    url: str,
    policy: str,
    pattern: str,
    models: list[str],
    tokens: int,
) -> Cell:
    start = time.monotonic()
    try:
        async with asyncio.timeout(CELL_TIMEOUT_S):
            results = await asyncio.gather(*(one(session, url, m, tokens) for m in models))
    except TimeoutError:
        return Cell(policy, pattern, len(models), 0.0, 0.0, CELL_TIMEOUT_S, 0.0, 0.0, True)
    wall = max(r[3] for r in results) - start
    waits = [r[2] for r in results]
    return Cell(
        policy,
        pattern,
        len(models),
        aggregate_tps=sum(r[0] for r in results) / wall,
        slowest_stream_tps=min(r[0] / (r[3] - start) for r in results),
        wall_s=wall,
        wait_p50_s=statistics.median(waits),
        wait_max_s=max(waits),
    )


async def measure(policy: str, tokens: int, workdir: Path) -> list[Cell]:
    threads, capacity = POLICIES[policy]
    config = workdir / f"{policy}.yaml"
    write_config(threads, capacity, config)
    proxy = start_proxy(config, workdir / f"{policy}.log", inherit_env=True)
    url = proxy.url
    cells: list[Cell] = []
    try:
        await asyncio.to_thread(proxy.wait_ready, 900)
        timeout = aiohttp.ClientTimeout(total=None)
        async with aiohttp.ClientSession(timeout=timeout) as session:
            for model in ("plain", "ngram"):  # warm each backend's prompt cache
                await one(session, url, model, 4)
            for _ in range(2):
                cells.append(await cell(session, url, policy, "single", ["plain"], tokens))
            for n in (2, 4, 8):
                mixed = ["plain", "ngram"] * (n // 2)
                cells.append(await cell(session, url, policy, "plain+ngram", mixed, tokens))
                cells.append(await cell(session, url, policy, "plain only", ["plain"] * n, tokens))
                print(f"  {policy}: {n} streams done", file=sys.stderr, flush=True)
    finally:
        proxy.stop()
    return cells


def report(cells: list[Cell]) -> str:
    rows = [
        "| policy | streams | pattern | aggregate t/s | slowest stream t/s | wall s "
        "| device wait p50 / max s |",
        "| --- | ---: | --- | ---: | ---: | ---: | ---: |",
    ]
    keys = sorted(
        {(c.policy, c.streams, c.pattern) for c in cells},
        key=lambda k: (list(POLICIES).index(k[0]), k[1], k[2]),
    )
    for policy, streams, pattern in keys:
        group = [c for c in cells if (c.policy, c.streams, c.pattern) == (policy, streams, pattern)]
        if any(c.timed_out for c in group):
            done = [c for c in group if not c.timed_out]
            rows.append(
                f"| {policy} | {streams} | {pattern} | timed out in {len(group) - len(done)} of "
                f"{len(group)} runs (> {CELL_TIMEOUT_S:.0f} s) | | | |"
            )
            continue

        def mean(attr: str) -> float:
            return float(statistics.mean(getattr(c, attr) for c in group))  # noqa: B023

        rows.append(
            f"| {policy} | {streams} | {pattern} | {mean('aggregate_tps'):.1f} "
            f"| {mean('slowest_stream_tps'):.1f} | {mean('wall_s'):.1f} "
            f"| {mean('wait_p50_s'):.2f} / {max(c.wait_max_s for c in group):.2f} |"
        )
    return "\n".join(rows)


async def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=64)
    parser.add_argument("--rounds", type=int, default=2)
    parser.add_argument("--policies", nargs="+", default=list(POLICIES), choices=list(POLICIES))
    args = parser.parse_args()
    cells: list[Cell] = []
    with tempfile.TemporaryDirectory(prefix="device-policy-") as tmp:
        order = list(args.policies)
        for r in range(args.rounds):
            for policy in order if r % 2 == 0 else reversed(order):
                print(f"round {r + 1}: {policy}", file=sys.stderr, flush=True)
                cells += await measure(policy, args.tokens, Path(tmp))
    print(report(cells))


if __name__ == "__main__":
    asyncio.run(main())
