"""Train the classifier's linear model and write proxy/routing/classifier_weights.json.

Training data: the tuning part of the public evaluation set (``build_classifier_eval.py``) and
the project's labelled requests (``tests/data/labelled_requests.jsonl``). The test part is never
read here. The L2 strength is chosen by 5-fold cross-validation on the training data alone;
the model is a multinomial logistic regression over the binary features of
``TaskClassifier.features``, fitted by full-batch gradient descent (Adam), classes balanced.

    .venv/bin/python scripts/train_classifier.py [--eval-dir DIR]
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from collections import Counter
from pathlib import Path
from typing import Any

import numpy as np

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from proxy.routing.classifier import (  # noqa: E402
    TASK_CLASSES,
    WEIGHTS_FILE,
    LinearModel,
    TaskClassifier,
)
from proxy.testing.classifier_scores import ClassifierScores  # noqa: E402

REGRESSION = ROOT / "tests" / "data" / "labelled_requests.jsonl"
OUT = ROOT / "proxy" / "routing" / WEIGHTS_FILE
MIN_COUNT = 2
L2_CHOICES = (1e-3, 3e-3)
STEPS = 300


def eval_dir(arg: Path | None) -> Path:
    """Where the built evaluation set is (the tests look in the same places)."""
    candidates = [
        arg,
        Path(os.environ["SPECPROXY_CLASSIFIER_EVAL"])
        if "SPECPROXY_CLASSIFIER_EVAL" in os.environ
        else None,
        ROOT / "shared" / "classifier-eval",
        ROOT.parent / "shared" / "classifier-eval",
        ROOT / "build" / "classifier-eval",
    ]
    for path in candidates:
        if path is not None and (path / "tune.jsonl").exists():
            return path
    raise SystemExit("no evaluation set: run scripts/build_classifier_eval.py first")


def load(path: Path) -> list[dict[str, Any]]:
    with path.open(encoding="utf-8") as fh:
        return [json.loads(line) for line in fh if line.strip()]


def fit(x: np.ndarray, y: np.ndarray, sample_w: np.ndarray, l2: float) -> np.ndarray:
    """Weights (features x classes) of an L2-regularised multinomial logistic regression."""
    d = x.shape[1]
    k = len(TASK_CLASSES)
    w = np.zeros((d, k), dtype=np.float32)
    onehot = np.eye(k, dtype=np.float32)[y]
    m = np.zeros_like(w)
    v = np.zeros_like(w)
    lr, b1, b2 = 0.05, 0.9, 0.999
    sample_w = sample_w.astype(np.float32)
    total = float(sample_w.sum())
    for step in range(1, STEPS + 1):
        logits = x @ w
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        grad = x.T @ ((p - onehot) * sample_w[:, None]) / total
        grad[1:] += l2 * w[1:]  # row 0 is the bias
        m = b1 * m + (1 - b1) * grad
        v = b2 * v + (1 - b2) * grad * grad
        w -= lr * (m / (1 - b1**step)) / (np.sqrt(v / (1 - b2**step)) + 1e-8)
    return w


def matrix(rows: list[list[str]], vocab: dict[str, int]) -> np.ndarray:
    x = np.zeros((len(rows), len(vocab)), dtype=np.float32)
    for i, feats in enumerate(rows):
        for f in feats:
            j = vocab.get(f)
            if j is not None:
                x[i, j] = 1.0
    return x


def balanced_weights(y: np.ndarray) -> np.ndarray:
    counts = np.bincount(y, minlength=len(TASK_CLASSES)).astype(np.float64)
    weights: np.ndarray = (len(y) / (len(TASK_CLASSES) * counts))[y]
    return weights


def per_class(y: np.ndarray, pred: np.ndarray) -> dict[str, tuple[float, float]]:
    """(precision, recall) per class of the predicted class indices `pred` against `y`."""
    pairs = ((TASK_CLASSES[a], TASK_CLASSES[b]) for a, b in zip(y, pred, strict=True))
    return ClassifierScores.of(pairs, TASK_CLASSES).precision_recall()


def train(rows: list[list[str]], y: np.ndarray, l2: float) -> tuple[dict[str, int], np.ndarray]:
    counts = Counter(f for feats in rows for f in set(feats))
    names = ["bias", *sorted(f for f, c in counts.items() if c >= MIN_COUNT and f != "bias")]
    vocab = {f: i for i, f in enumerate(names)}
    w = fit(matrix(rows, vocab), y, balanced_weights(y), l2)
    return vocab, w


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--eval-dir", type=Path)
    args = parser.parse_args()
    tune = load(eval_dir(args.eval_dir) / "tune.jsonl")
    regression = load(REGRESSION)
    empty = TaskClassifier(model=LinearModel(TASK_CLASSES, {}))
    rows: list[list[str]] = []
    labels: list[int] = []
    keys: list[str] = []
    for item in [*tune, *regression]:
        if empty.hard_verdict(item["body"]) is not None:
            continue  # tools, FIM, odd bodies: decided without the model
        rows.append(empty.features(item["body"]))
        labels.append(TASK_CLASSES.index(item["label"]))
        keys.append(item.get("id") or json.dumps(item["body"], sort_keys=True))
    y = np.array(labels)
    print(f"{len(rows)} training requests ({len(tune)} tuning part, {len(regression)} labelled)")

    folds = np.array([int(hashlib.sha256(k.encode()).hexdigest()[:8], 16) % 5 for k in keys])
    best = None
    for l2 in L2_CHOICES:
        pred = np.zeros_like(y)
        for fold in range(5):
            train_idx, held = folds != fold, folds == fold
            vocab, w = train([rows[i] for i in np.flatnonzero(train_idx)], y[train_idx], l2)
            scores = matrix([rows[i] for i in np.flatnonzero(held)], vocab) @ w
            pred[held] = scores.argmax(axis=1)
        pr = per_class(y, pred)
        worst = min(min(p, r) for p, r in pr.values())
        shown = "  ".join(f"{c} P={p:.3f} R={r:.3f}" for c, (p, r) in pr.items())
        print(f"l2={l2:g}: 5-fold CV {shown}  (worst {worst:.3f})")
        if best is None or worst > best[0]:
            best = (worst, l2)
    assert best is not None
    l2 = best[1]
    vocab, w = train(rows, y, l2)
    weights = {
        name: [round(float(v), 4) for v in w[i]]
        for name, i in vocab.items()
        if np.abs(w[i]).max() >= 1e-3
    }
    OUT.write_text(
        json.dumps(
            {
                "classes": list(TASK_CLASSES),
                "l2": l2,
                "trained_on": len(rows),
                "weights": weights,
            },
            ensure_ascii=False,
            sort_keys=True,
        )
        + "\n",
        encoding="utf-8",
    )
    print(f"l2={l2:g}: {len(weights)} features -> {OUT.relative_to(ROOT)}")


if __name__ == "__main__":
    main()
