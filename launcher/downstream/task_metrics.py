"""Fine-tuning metrics from scikit-learn and scipy (never hand-written), baselines and seed spreads.

Classification: accuracy, macro-F1 over every class of the task's label mapping (a class never
predicted scores 0: `zero_division=0`), Matthews correlation (MCC). Regression: Pearson and Spearman
correlation (scipy.stats; None when either side is constant, where they are undefined), mean squared
and mean absolute error. Baselines: the most frequent train class / the train mean, predicted for
every example. docs/finetune.md says the same for users.
"""
from __future__ import annotations

import math
import warnings
from collections import Counter

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
    if task_type == "classification":
        from sklearn.metrics import accuracy_score, f1_score, matthews_corrcoef

        values = {"accuracy": accuracy_score(labels, predictions),
                  "macro_f1": f1_score(labels, predictions, labels=list(range(num_labels)), average="macro",
                                       zero_division=0),
                  "mcc": matthews_corrcoef(labels, predictions)}
    else:
        from scipy.stats import pearsonr, spearmanr
        from sklearn.metrics import mean_absolute_error, mean_squared_error

        constant = len(set(labels)) < 2 or len(set(predictions)) < 2
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # scipy warns on constant input; that case is None below
            values = {"pearson": None if constant else float(pearsonr(labels, predictions).statistic),
                      "spearman": None if constant else float(spearmanr(labels, predictions).statistic),
                      "mse": mean_squared_error(labels, predictions), "mae": mean_absolute_error(labels, predictions)}
    return {**{k: _round(v) for k, v in values.items()}, "examples": len(labels)}


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
