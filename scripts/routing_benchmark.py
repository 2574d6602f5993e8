"""Routing benchmark: a mixed workload through `auto` against every backend pinned and the oracle.

Two proxies on the same config (default: the embedded CPU config) run side by side, each with its
own backends, fresh scoreboard and calibration: one serves the workload through `auto`, the other
takes each prompt pinned to every backend. One request runs at a time and the order of auto and
the pinned backends rotates from prompt to prompt, so drift in the machine's speed hits every mode
alike. Separate backends keep their memories apart: ngram-mod remembers every prompt and answer it
has seen, so a prompt it already served comes back faster. The oracle is the best pinned backend
per task class; auto is reported as measured and with each of its choices priced at what that
backend measured pinned for the same prompt, with bootstrap intervals over the prompts. Prints a
Markdown table; not a test (timings on a shared machine are noisy).

The workload is the chat part of ``proxy.workload``'s measurement pool: whole-file and
search/replace edits of standard-library modules (echo), new code under a coding assistant's
system prompt (code) and technical questions (prose), none of them a request calibration sent,
so neither proxy's n-gram backend has seen an answer before it is measured.

Each mode gets its own copy of each prompt (``WorkloadRequest.renamed``: the names the answer
writes take a suffix of that mode and prompt), so each mode's text is new to the engine: pinned
plain and ngram share one engine, whose ngram-mod remembers every answer and would copy plain's
back to ngram on the same prompt (issue 45: 458 of 502 tokens accepted, 2.6x plain). Renamed
rather than restarted: a restart would also empty what ngram-mod learnt from earlier prompts,
which auto's engine keeps, and copies cost nothing. ``--identical-prompts`` sends every mode
the same text, to measure that copying.

``--runs N`` repeats the whole benchmark N times, each run with new proxies, new backends, a
new calibration and copies of the prompts no earlier run sent; it prints each run's summary and
then the tables over all runs' requests, whose bootstrap intervals resample every request.

    .venv/bin/python scripts/routing_benchmark.py [--config FILE] [--tokens 256] \
        [--echo 8 --code 4 --prose 4] [--identical-prompts] [--runs 1]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
from collections import Counter
from dataclasses import dataclass
from pathlib import Path

import openai

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.testing.running_proxy import RunningProxy, start_proxy  # noqa: E402
from proxy.workload import WorkloadRequest, fresh_word, measurement_pool  # noqa: E402

Messages = list[dict[str, str]]


@dataclass(frozen=True)
class Sample:
    """One request's outcome as the proxy reported it."""

    task: str
    backend: str
    route: str
    tokens: int
    seconds: float
    drafted: int = 0
    accepted: int = 0


# What the report says of each mode's text, by --identical-prompts.
TEXT_NOTE = {
    False: "each mode's text new to the engine: every mode sends its own copy of each prompt, "
    "the names the answer writes renamed for that mode (WorkloadRequest.renamed), so no engine "
    "meets an answer it generated for another mode",
    True: "every mode sent the same text (--identical-prompts): pinned modes sharing an engine "
    "may copy each other's answers",
}


def run_one(
    client: openai.OpenAI, model: str, task: str, messages: Messages, tokens: int
) -> Sample:
    raw = client.chat.completions.with_raw_response.create(
        model=model,
        # proxy.workload's messages are plain dicts of valid roles, not the SDK's TypedDicts.
        messages=messages,  # type: ignore[arg-type]
        max_tokens=tokens,
        temperature=0,
    )
    timings = json.loads(raw.text)["timings"]
    return Sample(
        task,
        raw.headers["x-specproxy-backend"],
        raw.headers["x-specproxy-route"],
        int(timings["predicted_n"]),
        timings["predicted_ms"] / 1000,
        int(timings.get("draft_n") or 0),
        int(timings.get("draft_n_accepted") or 0),
    )


def tps(samples: list[Sample]) -> float:
    seconds = sum(s.seconds for s in samples)
    return sum(s.tokens for s in samples) / seconds if seconds else 0.0


def bootstrap(auto: list[Sample], pinned: list[Sample], rounds: int = 2000) -> tuple[float, ...]:
    """Resample prompts: the share of resamples where auto is faster, and the 5-95 % ratio range.

    The two lists are aligned by prompt, so each resample compares both on the same prompts.
    """
    rng = random.Random(0)
    ratios = sorted(
        tps([auto[i] for i in idx]) / tps([pinned[i] for i in idx])
        for idx in (rng.choices(range(len(auto)), k=len(auto)) for _ in range(rounds))
    )
    wins = sum(r > 1 for r in ratios) / rounds
    return wins, ratios[rounds // 20], ratios[-rounds // 20]


def mode_messages(
    jobs: list[tuple[str, WorkloadRequest]],
    modes: list[str],
    identical: bool = False,
    run: int = 0,
) -> dict[str, list[Messages]]:
    """What each mode sends for each job: a copy of its own (``renamed`` with a word no other
    mode, job and run gets), or with identical, the job's own text."""
    first = run * len(jobs) * len(modes)
    return {
        mode: [
            request.messages
            if identical
            else request.renamed(fresh_word(first + i * len(modes) + m)).messages
            for i, (_, request) in enumerate(jobs)
        ]
        for m, mode in enumerate(modes)
    }


def run_workload(
    config: Path | None,
    port: int,
    jobs: list[tuple[str, WorkloadRequest]],
    tokens: int,
    identical: bool = False,
    run: int = 0,
) -> dict[str, list[Sample]]:
    """Each prompt through `auto` on one proxy and pinned to every backend on another.

    Two proxies, each with its own backends and fresh scoreboard, so auto's backends never see
    the pinned requests (ngram-mod remembers every prompt and answer). Pinned backends that share
    an engine would see each other's: every mode sends its own copy of each prompt
    (``mode_messages``). Both stay up for the whole run, only one request runs at a time, and the
    order of auto and the pinned backends rotates from prompt to prompt, so a machine that slows
    down over minutes slows every mode alike.
    """
    workdirs = [Path(tempfile.mkdtemp(prefix="specproxy-routing-")) for _ in range(2)]
    proxies: list[RunningProxy] = []
    try:
        # Only auto's proxy calibrates: the pinned one routes nothing, and calibration's
        # requests are not the benchmark's, so they teach its n-gram backend nothing it meets.
        for i, workdir in enumerate(workdirs):
            calibrate = {} if i == 0 else {"SPECPROXY_CALIBRATION_REQUESTS": "0"}
            proxy = start_proxy(
                config, workdir / "proxy.log", port=port + i, inherit_env=True, **calibrate
            )
            proxies.append(proxy)
            proxy.wait_ready(3600, calibrated=True)
        auto_client, pinned_client = (
            openai.OpenAI(base_url=f"{proxy.url}/v1", api_key="x", timeout=600) for proxy in proxies
        )
        backends = [m.id for m in pinned_client.models.list() if "auto" not in m.id]
        modes = ["auto", *backends]
        sent = mode_messages(jobs, modes, identical, run)
        results: dict[str, list[Sample]] = {mode: [] for mode in modes}
        for i, (task, _) in enumerate(jobs):
            print(f"prompt {i + 1}/{len(jobs)}", file=sys.stderr)
            for mode in modes[i % len(modes) :] + modes[: i % len(modes)]:
                client = auto_client if mode == "auto" else pinned_client
                results[mode].append(run_one(client, mode, task, sent[mode][i], tokens))
        return results
    finally:
        for proxy in proxies:
            proxy.stop()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--config", type=Path)
    # An edit's answer is a whole file, and ngram-mod drafts only once 24 tokens of context
    # match: 64-token answers would hide most of what it does on edits.
    parser.add_argument("--tokens", type=int, default=256)
    parser.add_argument("--port", type=int, default=8091)
    # Edits are a large share of what editing assistants send, and the share where a router
    # has most to win or lose.
    for task, count in (("echo", 8), ("code", 4), ("prose", 4)):
        parser.add_argument(f"--{task}", type=int, default=count, help=f"{task} requests")
    parser.add_argument(
        "--identical-prompts",
        action="store_true",
        help="send every mode the same text (measures what an engine copies from another mode)",
    )
    parser.add_argument(
        "--runs", type=int, default=1, help="independent runs, each with its own calibration"
    )
    args = parser.parse_args()
    tasks = ["echo", "code", "prose"]
    jobs = [(t, r) for t in tasks for r in measurement_pool(t)[: getattr(args, t)]]
    random.Random(1).shuffle(jobs)
    results: dict[str, list[Sample]] = {}
    for run in range(args.runs):
        print(f"run {run + 1}/{args.runs}", file=sys.stderr)
        measured = run_workload(
            args.config, args.port, jobs, args.tokens, args.identical_prompts, run
        )
        if args.runs > 1:
            print(f"run {run + 1}: {summary(measured, tasks)}", flush=True)
        for mode, samples in measured.items():
            results.setdefault(mode, []).extend(samples)
    report(results, tasks, args.tokens, args.identical_prompts, args.runs)


def oracle_of(results: dict[str, list[Sample]], tasks: list[str]) -> tuple[dict[str, str], float]:
    """The best pinned backend per class, and the speed of sending each class to its best."""
    backends = [m for m in results if m != "auto"]
    best = {
        t: max(backends, key=lambda b: tps([s for s in results[b] if s.task == t])) for t in tasks
    }
    return best, tps([s for t in tasks for s in results[best[t]] if s.task == t])


def summary(results: dict[str, list[Sample]], tasks: list[str]) -> str:
    """One run in a line: auto against the oracle and against each pinned backend."""
    _, oracle = oracle_of(results, tasks)
    auto = tps(results["auto"])
    pinned = ", ".join(
        f"/ {b} {auto / tps(samples):.3f}" for b, samples in results.items() if b != "auto"
    )
    return f"auto {auto:.1f} t/s = {auto / oracle:.1%} of the oracle; {pinned}"


def report(
    results: dict[str, list[Sample]],
    tasks: list[str],
    tokens: int,
    identical: bool,
    runs: int,
) -> None:
    """The tables, the choices and the intervals over every request measured."""
    backends = [m for m in results if m != "auto"]
    jobs = len(results["auto"])

    def of(mode: str, task: str) -> list[Sample]:
        return [s for s in results[mode] if s.task == task]

    best, oracle = oracle_of(results, tasks)
    over = f" over {runs} runs" if runs > 1 else ""
    print(f"\n{jobs} requests per mode{over}, {tokens} max tokens, temperature 0, single stream")
    print(f"{TEXT_NOTE[identical]}\n")
    print("| mode | " + " | ".join(f"{t} t/s" for t in tasks) + " | overall t/s | vs oracle |")
    print("| --- | " + " | ".join("---:" for _ in tasks) + " | ---: | ---: |")
    for mode in [*backends, "auto"]:
        row = " | ".join(f"{tps(of(mode, t)):.1f}" for t in tasks)
        overall = tps(results[mode])
        print(f"| {mode} | {row} | {overall:.1f} | {overall / oracle:.1%} |")
    oracle_cells = " | ".join(f"{tps(of(best[t], t)):.1f} ({best[t]})" for t in tasks)
    print(f"| oracle | {oracle_cells} | {oracle:.1f} | 100.0% |")
    choices = Counter(f"{s.task}->{s.backend} ({s.route})" for s in results["auto"])
    print(f"\nauto's choices: {dict(sorted(choices.items()))}")
    # Exploration's cost, measured: the time auto's probes took beyond what the oracle's backend
    # for their class took per token in the pinned phase, as a share of auto's whole time.
    probes = [s for s in results["auto"] if s.route == "explore"]
    extra = sum(s.seconds - s.tokens / tps(of(best[s.task], s.task)) for s in probes)
    auto_seconds = sum(s.seconds for s in results["auto"])
    share = os.environ.get("SPECPROXY_EXPLORE_SHARE", "0.05")
    print(
        f"exploration (share {share}): {len(probes)} probes, {extra:+.1f} s against the oracle, "
        f"{extra / auto_seconds:+.1%} of auto's generation time"
    )
    beats = all(tps(results["auto"]) > tps(results[b]) for b in backends)
    print(
        f"auto = {tps(results['auto']) / oracle:.1%} of the oracle; "
        f"above every pinned backend: {beats}"
    )
    # Timing noise aside, what auto's choices are worth: each priced at what the pinned backend it
    # chose measured for the same prompt.
    priced = [results[s.backend][i] for i, s in enumerate(results["auto"])]
    beats = all(tps(priced) > tps(results[b]) for b in backends)
    print(
        f"auto's choices at the pinned backends' speeds for the same prompts: {tps(priced):.1f} "
        f"t/s = {tps(priced) / oracle:.1%} of the oracle; above every pinned backend: {beats}"
    )
    # How sure: which prompts happened to be in the workload matters as much as timing noise.
    for label, auto in (("auto", results["auto"]), ("priced auto", priced)):
        for b in backends:
            wins, low, high = bootstrap(auto, results[b])
            print(
                f"  {label} / {b}: {tps(auto) / tps(results[b]):.3f} (90% bootstrap interval "
                f"over prompts {low:.3f}-{high:.3f}; faster in {wins:.0%} of resamples)"
            )
    # Copying shows as acceptance near 1: what each mode's drafts got accepted, per class.
    print("draft acceptance (accepted / drafted tokens):")
    for mode in [*backends, "auto"]:
        cells = []
        for task in tasks:
            drafted = sum(s.drafted for s in of(mode, task))
            accepted = sum(s.accepted for s in of(mode, task))
            cells.append(f"{task} {accepted / drafted:.2f}" if drafted else f"{task} -")
        print(f"  {mode}: " + ", ".join(cells))
    print("per class, auto / each pinned backend (90% bootstrap interval over prompts):")
    for task in tasks:
        same = [i for i, s in enumerate(results["auto"]) if s.task == task]
        cells = []
        for b in backends:
            auto_t, pinned_t = [results["auto"][i] for i in same], [results[b][i] for i in same]
            _, low, high = bootstrap(auto_t, pinned_t)
            cells.append(f"/ {b} {tps(auto_t) / tps(pinned_t):.2f} ({low:.2f}-{high:.2f})")
        print(f"  {task}: " + ", ".join(cells))


if __name__ == "__main__":
    main()
