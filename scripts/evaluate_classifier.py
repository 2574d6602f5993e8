"""Score the task classifier on the untouched test part of the public evaluation set.

The set is other projects' data, built by ``scripts/build_classifier_eval.py`` from snapshots of
their repositories and not committed (CommitPackFT samples come under each sampled repository's
own licence, which the built items do not carry one by one), so the test suite cannot score it:
this script does, wherever the built files are. It first checks that they hold exactly the
items, parts and labels pinned in ``tests/data/classifier_eval_split.tsv`` (which the suite
checks on its own) and that no request is in both parts; then prints per-class precision and
recall, the confusion matrix, accuracy per source, and exits 1 if a class is below its floor.

    .venv/bin/python scripts/evaluate_classifier.py [--eval-dir DIR] [--misses]

The files are looked for in --eval-dir, $SPECPROXY_CLASSIFIER_EVAL, shared/classifier-eval
(here or beside the checkout) and build/classifier-eval, as scripts/train_classifier.py does.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.routing.classifier import TaskClassifier  # noqa: E402
from proxy.testing.classifier_scores import ClassifierScores  # noqa: E402

SPLIT_FILE = ROOT / "tests" / "data" / "classifier_eval_split.tsv"
CLASSIFIED = ("code", "prose", "echo")
# What the test part reaches (measured: docs/routing.md, "The classifier's evaluation"); the
# issue's target is 0.95 per class.
TEST_PART_FLOOR = {"code": 0.75, "prose": 0.90, "echo": 0.90}


def eval_dir(arg: Path | None) -> Path:
    env = os.environ.get("SPECPROXY_CLASSIFIER_EVAL")
    for path in (
        arg,
        Path(env) if env else None,
        ROOT / "shared" / "classifier-eval",
        ROOT.parent / "shared" / "classifier-eval",
        ROOT / "build" / "classifier-eval",
    ):
        if path is not None and (path / "test.jsonl").exists():
            return path
    raise SystemExit(
        "no evaluation set: build it with scripts/build_classifier_eval.py --out DIR, then "
        "pass --eval-dir DIR (or set SPECPROXY_CLASSIFIER_EVAL)"
    )


def load(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def check_against_the_pinned_split(parts: dict[str, list[dict[str, Any]]]) -> list[str]:
    """What in the built files differs from the pinned split; nothing when they match."""
    lines = SPLIT_FILE.read_text(encoding="utf-8").splitlines()
    pinned = {i: (part, label) for i, part, label in (line.split("\t") for line in lines[1:])}
    problems: list[str] = []
    bodies: dict[str, str] = {}
    seen: set[str] = set()
    for part, items in parts.items():
        for item in items:
            seen.add(item["id"])
            if pinned.get(item["id"]) != (part, item["label"]):
                problems.append(f"{item['id']}: built as {part}/{item['label']}, pinned otherwise")
            if not (item.get("source") and item.get("licence") and item.get("basis")):
                problems.append(f"{item['id']}: no source, licence or basis")
            key = json.dumps(item["body"], sort_keys=True)
            if bodies.setdefault(key, part) != part:
                problems.append(f"{item['id']}: its request is in both parts")
    problems += [f"{i}: pinned but not built" for i in sorted(set(pinned) - seen)]
    return problems


def scores(items: list[dict[str, Any]], misses: bool) -> tuple[dict[str, tuple[float, float]], str]:
    """Per-class (precision, recall) and a printable report."""
    classifier = TaskClassifier()
    pairs: list[tuple[str, str]] = []
    by_source: Counter[tuple[str, bool]] = Counter()
    missed: list[str] = []
    for item in items:
        predicted = classifier.classify(item["body"])
        pairs.append((item["label"], predicted))
        source = item["id"].split("-", 1)[0]  # aider, oasst, mtbench, user (self-instruct)...
        by_source[source, predicted == item["label"]] += 1
        if predicted != item["label"]:
            missed.append(f"  {item['label']} -> {predicted}: {item['id']}")
    scored = ClassifierScores.of(pairs, CLASSIFIED)
    lines = [f"{len(items)} test-part items, accuracy {scored.accuracy():.3f}", *scored.report()]
    for source in sorted({s for s, _ in by_source}):
        good, bad = by_source[source, True], by_source[source, False]
        lines.append(f"  {source}: accuracy {good / (good + bad):.2f} ({good + bad} items)")
    if misses:
        lines += ["misclassified:", *missed]
    return scored.precision_recall(), "\n".join(lines)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-dir", type=Path)
    parser.add_argument("--misses", action="store_true", help="list every misclassified item")
    args = parser.parse_args()
    where = eval_dir(args.eval_dir)
    parts = {part: load(where / f"{part}.jsonl") for part in ("tune", "test")}
    problems = check_against_the_pinned_split(parts)
    if problems:
        print(f"{where} does not match {SPLIT_FILE.relative_to(ROOT)}:", file=sys.stderr)
        print("\n".join(problems[:20]), file=sys.stderr)
        return 1
    result, report = scores(parts["test"], args.misses)
    print(report)
    low = {c: pr for c, pr in result.items() if min(pr) < TEST_PART_FLOOR[c]}
    if low:
        print(f"below the floor {TEST_PART_FLOOR}: {low}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
