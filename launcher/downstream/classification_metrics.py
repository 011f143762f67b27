"""Accuracy, macro-F1 and the majority-class baseline for the fine-tuning reports."""
from __future__ import annotations

from collections import Counter


def accuracy(labels: list[int], predictions: list[int]) -> float:
    if len(labels) != len(predictions) or not labels:
        raise ValueError("accuracy: labels and predictions must be non-empty and of equal length")
    return sum(int(y == p) for y, p in zip(labels, predictions)) / len(labels)


def macro_f1(labels: list[int], predictions: list[int], num_labels: int) -> float:
    """Unweighted mean of per-class F1 over ALL classes (a class never predicted scores 0)."""
    if len(labels) != len(predictions) or not labels:
        raise ValueError("macro_f1: labels and predictions must be non-empty and of equal length")
    scores = []
    for k in range(num_labels):
        tp = sum(1 for y, p in zip(labels, predictions) if y == k and p == k)
        fp = sum(1 for y, p in zip(labels, predictions) if y != k and p == k)
        fn = sum(1 for y, p in zip(labels, predictions) if y == k and p != k)
        scores.append(0.0 if tp == 0 else 2 * tp / (2 * tp + fp + fn))
    return sum(scores) / num_labels


def majority_label(train_labels: list[int]) -> int:
    """Most frequent training label (ties -> smallest label, so the choice is deterministic)."""
    counts = Counter(train_labels)
    return min(counts, key=lambda k: (-counts[k], k))


def scores(labels: list[int], predictions: list[int], num_labels: int) -> dict[str, float]:
    return {"accuracy": round(accuracy(labels, predictions), 5),
            "macro_f1": round(macro_f1(labels, predictions, num_labels), 5),
            "examples": len(labels)}
