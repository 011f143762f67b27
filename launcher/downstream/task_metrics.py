"""Fine-tuning metrics (numpy; tests check each against scikit-learn and scipy), baselines and seed spreads.

Classification: accuracy, macro-F1 over every class of the task's label mapping (a class never
predicted scores 0, as scikit-learn's `zero_division=0`), Matthews correlation (MCC, scikit-learn's
multi-class form: 0 when either side is constant). Regression: Pearson and Spearman correlation (ties
get average ranks; None when either side is constant, where they are undefined), mean squared and mean
absolute error. Baselines: the most frequent train class / the train mean, predicted for every example.
docs/finetune.md says the same for users. Why not scikit-learn and scipy themselves: importing them
took ~1 s of each fine-tune's start-up, for a few sums (tests/unit/test_task_metrics.py compares).
"""
from __future__ import annotations

import math
from collections import Counter

import numpy as np

from launcher.common.errors import UserError

# metric -> True when higher is better (model selection and the console table read this)
METRICS = {"classification": {"accuracy": True, "macro_f1": True, "mcc": True},
           "regression": {"pearson": True, "spearman": True, "mse": False, "mae": False},
           # computed by sentence-transformers' InformationRetrievalEvaluator (launcher.downstream.retrieval)
           "retrieval": {"ndcg@10": True, "mrr@10": True, "recall@1": True, "recall@10": True, "map@100": True}}
DEFAULT_SELECT = {"classification": "macro_f1", "regression": "pearson", "retrieval": "ndcg@10"}


def check_select_metric(task_type: str, name: str | None) -> str:
    """The model-selection metric (default per task type); a name of the other task type is refused."""
    if name is None:
        return DEFAULT_SELECT[task_type]
    if name not in METRICS[task_type]:
        raise UserError(f"--select-metric: {name!r} is not a {task_type} metric (one of: {', '.join(METRICS[task_type])})")
    return name


def scores(task_type: str, labels: list, predictions: list, num_labels: int) -> dict:
    """Every metric of the task type on one split, rounded to 5 digits, plus the example count."""
    if len(labels) != len(predictions) or not labels:
        raise ValueError("scores: labels and predictions must be non-empty and of equal length")
    values = (classification_metrics(labels, predictions, num_labels) if task_type == "classification"
              else regression_metrics(labels, predictions))
    return {**{k: _round(v) for k, v in values.items()}, "examples": len(labels)}


def classification_metrics(labels: list[int], predictions: list[int], num_labels: int) -> dict[str, float]:
    """accuracy, macro_f1 (classes 0..num_labels-1) and mcc, unrounded."""
    y, p = np.asarray(labels, dtype=np.int64), np.asarray(predictions, dtype=np.int64)
    classes = np.arange(num_labels)
    true_positive = ((y == p)[:, None] & (y[:, None] == classes)).sum(axis=0)
    predicted = (p[:, None] == classes).sum(axis=0)
    actual = (y[:, None] == classes).sum(axis=0)
    denominator = predicted + actual  # 2tp + fp + fn
    f1 = np.divide(2 * true_positive, denominator, out=np.zeros(num_labels), where=denominator > 0)
    return {"accuracy": float(np.mean(y == p)), "macro_f1": float(f1.mean()), "mcc": _mcc(y, p)}


def _mcc(y: np.ndarray, p: np.ndarray) -> float:
    """Multi-class Matthews correlation from the confusion matrix's sums (over the classes either side has)."""
    _, codes = np.unique(np.concatenate([y, p]), return_inverse=True)
    y_codes, p_codes = codes[:len(y)], codes[len(y):]
    size = int(codes.max()) + 1
    t_sum = np.bincount(y_codes, minlength=size).astype(np.float64)
    p_sum = np.bincount(p_codes, minlength=size).astype(np.float64)
    n = float(len(y))
    cov_tp = float(np.sum(y_codes == p_codes)) * n - np.dot(t_sum, p_sum)
    cov_pp, cov_tt = n ** 2 - np.dot(p_sum, p_sum), n ** 2 - np.dot(t_sum, t_sum)
    return 0.0 if cov_pp * cov_tt == 0 else float(cov_tp / np.sqrt(cov_tt * cov_pp))


def regression_metrics(labels: list[float], predictions: list[float]) -> dict[str, float | None]:
    """pearson, spearman (None when either side is constant), mse and mae, unrounded."""
    y, p = np.asarray(labels, dtype=np.float64), np.asarray(predictions, dtype=np.float64)
    constant = len(set(labels)) < 2 or len(set(predictions)) < 2
    return {"pearson": None if constant else _pearson(y, p),
            "spearman": None if constant else _pearson(_average_ranks(y), _average_ranks(p)),
            "mse": float(np.mean((y - p) ** 2)), "mae": float(np.mean(np.abs(y - p)))}


def _pearson(x: np.ndarray, y: np.ndarray) -> float:
    x, y = x - x.mean(), y - y.mean()
    return float(np.clip(np.dot(x, y) / (np.linalg.norm(x) * np.linalg.norm(y)), -1.0, 1.0))


def _average_ranks(x: np.ndarray) -> np.ndarray:
    """Ranks 1..n; tied values share the mean of their ranks."""
    order = np.argsort(x, kind="stable")
    ordered = x[order]
    starts = np.flatnonzero(np.r_[True, ordered[1:] != ordered[:-1]])  # first position of each run of equal values
    ends = np.r_[starts[1:], len(x)]
    ranks = np.empty(len(x))
    ranks[order] = np.repeat((starts + ends + 1) / 2, ends - starts)
    return ranks


def _round(value) -> float | None:
    return None if value is None or not math.isfinite(float(value)) else round(float(value), 5)


def majority_label(train_labels: list[int]) -> int:
    """Most frequent training label (ties -> smallest label, so the choice is deterministic)."""
    counts = Counter(train_labels)
    return min(counts, key=lambda k: (-counts[k], k))


def baseline_prediction(task_type: str, train_labels: list):
    """What the baseline predicts for every example: the majority train class or the train mean."""
    if task_type == "classification":
        return majority_label(train_labels)
    return sum(train_labels) / len(train_labels)


def better(task_type: str, metric: str, new: float | None, old: float | None) -> bool:
    """Is `new` a better value of `metric` than `old`? An undefined value (None) is never better."""
    if new is None:
        return False
    if old is None:
        return True
    return new > old if METRICS[task_type][metric] else new < old


def spread(values: list) -> dict:
    """mean, min, max and n of the defined values (None entries, e.g. an undefined correlation, skipped)."""
    defined = [v for v in values if v is not None]
    if not defined:
        return {"mean": None, "min": None, "max": None, "n": 0}
    return {"mean": round(sum(defined) / len(defined), 5), "min": min(defined), "max": max(defined), "n": len(defined)}
