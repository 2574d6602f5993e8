"""Time TaskClassifier.classify per request: labelled set, a typical coding chat, huge bodies."""

from __future__ import annotations

import argparse
import functools
import json
import statistics
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from proxy.routing.classifier import TaskClassifier

DATA = Path(__file__).resolve().parent.parent / "tests" / "data" / "labelled_requests.jsonl"

# A Continue-style coding-assistant prompt of about 2 KB, as such clients send on every turn.
TYPICAL_SYSTEM = """You are an expert software developer. You give helpful and concise responses.

When you write code blocks, always include the language and the file path in the info string, \
for example ```python src/app/main.py. When you propose changes to an existing file, only show \
the parts that change and use comments like "// ... existing code ..." for the rest, unless the \
user explicitly asks for the whole file.

Rules:
- Prefer the libraries and conventions already used in the user's workspace.
- Never invent APIs; if you are unsure that a function exists, say so.
- Keep explanations short: a sentence or two before the code, and bullet points after it only \
if there is something the user must know (migrations, breaking changes, environment variables).
- If the user's question is ambiguous, ask one clarifying question instead of guessing.
- Use the user's language for prose, English for identifiers.
- Write tests with the framework the project already uses; do not add new dependencies unless \
the user agrees, and mention any new dependency explicitly.
- When a change touches public interfaces, list the call sites that need updating.
- Security first: never log secrets, validate input at the boundaries, and prefer parameterised \
queries over string concatenation.
- Keep functions small and typed; prefer pure helpers that are easy to test, and explain any \
performance trade-off you make in one sentence.
- For database changes, write the migration first and keep it reversible; never edit a \
migration that has already been applied in production.

The user is working in a repository with the following open files: src/server/routes.ts, \
src/server/db.ts, src/server/auth.ts, package.json, tsconfig.json, .eslintrc.cjs. The user's \
IDE is VS Code on macOS. The project uses Node 20, Express 4, TypeScript 5 in strict mode, \
the pg driver with a small query helper in src/server/db.ts, and Vitest for tests."""
TYPICAL_USER = (
    "In src/server/routes.ts the /orders handler returns every order in the table. Can you add "
    "pagination with limit and offset query parameters, validate them (limit max 100), and "
    "make sure the total count is returned in an X-Total-Count header? We use Express with "
    "TypeScript and pg."
)


def sample(fn: Callable[[], object], reps: int) -> list[int]:
    """Wall time in ns of ``reps`` calls, one sample per call."""
    out: list[int] = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        fn()
        out.append(time.perf_counter_ns() - start)
    return out


def summary(name: str, ns: list[int]) -> str:
    ordered = sorted(ns)

    def pct(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(len(ordered) * q))] / 1000

    # p90 is shown too: on a shared machine p99 mostly measures other processes' time slices.
    return (
        f"{name:<42} median {statistics.median(ordered) / 1000:7.1f} µs  "
        f"p90 {pct(0.90):7.1f} µs  p99 {pct(0.99):7.1f} µs  (n={len(ordered)})"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--reps", type=int, default=30, help="repetitions per request")
    parser.add_argument("--data", type=Path, default=DATA)
    args = parser.parse_args()

    with args.data.open(encoding="utf-8") as fh:
        items: list[dict[str, Any]] = [json.loads(line) for line in fh if line.strip()]
    classifier = TaskClassifier()
    for item in items:  # warm-up: imports, regex caches, the system-prompt cache
        classifier.classify(item["body"])

    # A fixed reference loop, to compare figures across machines of different speed.
    reference = sample(lambda: sum(range(1000)), 2000)
    print(summary("reference: sum(range(1000))", reference))

    per_class: dict[str, list[int]] = {}
    overall: list[int] = []
    for _ in range(args.reps):
        for item in items:
            body = item["body"]
            start = time.perf_counter_ns()
            classifier.classify(body)
            elapsed = time.perf_counter_ns() - start
            overall.append(elapsed)
            per_class.setdefault(item["label"], []).append(elapsed)
    print(summary(f"labelled set ({len(items)} requests)", overall))
    for label in sorted(per_class):
        print(summary(f"  {label}", per_class[label]))

    typical = {
        "model": "auto",
        "messages": [
            {"role": "system", "content": TYPICAL_SYSTEM},
            {"role": "user", "content": TYPICAL_USER},
        ],
    }
    reps = max(2000, args.reps * 100)
    title = f"typical chat ({len(TYPICAL_SYSTEM)} B system, {len(TYPICAL_USER)} B user)"
    print(summary(title, sample(lambda: classifier.classify(typical), reps)))
    uncached = TaskClassifier(system_cache_size=0)
    print(
        summary("  same, system-prompt cache off", sample(lambda: uncached.classify(typical), reps))
    )

    prose = "The keeper walked along the shore and counted the boats. " * 4000
    code = "```python\n" + "def step(x):\n    return x + 1\n\n" * 8000 + "```"
    for name, text in (("prose", prose), ("code", code)):
        body = {"messages": [{"role": "user", "content": "Rewrite this:\n\n" + text}]}
        label = f"huge {name} body ({len(text) // 1000} KB)"
        print(summary(label, sample(functools.partial(classifier.classify, body), 200)))


if __name__ == "__main__":
    main()
