"""The task classifier's precision and recall per class, from labelled and predicted classes:
computed here once for its tests, its evaluation and its training scripts."""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class ClassifierScores:
    """How many requests of each label were predicted as each class, and what follows."""

    classes: tuple[str, ...]
    confusion: Counter[tuple[str, str]]  # (label, predicted) -> requests

    @classmethod
    def of(cls, pairs: Iterable[tuple[str, str]], classes: Sequence[str]) -> ClassifierScores:
        """Scores of (label, predicted) pairs over `classes`."""
        return cls(tuple(classes), Counter(pairs))

    def accuracy(self) -> float:
        """The share of all requests predicted as their label."""
        right = sum(self.confusion[c, c] for c in self.classes)
        return right / max(self.confusion.total(), 1)

    def precision_recall(self) -> dict[str, tuple[float, float]]:
        """Per class, (precision, recall); 0 for a class never predicted or never labelled."""
        result: dict[str, tuple[float, float]] = {}
        for cls in self.classes:
            hits = self.confusion[cls, cls]
            predicted_as = sum(self.confusion[other, cls] for other in self.classes)
            actual = sum(self.confusion[cls, other] for other in self.classes)
            result[cls] = (hits / max(predicted_as, 1), hits / max(actual, 1))
        return result

    def report(self) -> list[str]:
        """Printable lines: each class's precision and recall, then the confusion matrix."""
        shown = [
            f"{c}: precision {p:.3f} recall {r:.3f}"
            for c, (p, r) in self.precision_recall().items()
        ]
        header = "label \\ predicted " + " ".join(f"{c:>7}" for c in self.classes)
        rows = [
            f"{label:>17} " + " ".join(f"{self.confusion[label, c]:>7}" for c in self.classes)
            for label in self.classes
        ]
        return [*shown, header, *rows]
