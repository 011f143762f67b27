"""launcher/downstream/task_metrics.py's numpy metrics against scikit-learn and scipy (test dependencies
only): random inputs and the edge cases whose conventions matter (a class never predicted or absent,
constant sides, ties, one example)."""
from __future__ import annotations

import math
import random
import warnings

import pytest
from scipy.stats import pearsonr, spearmanr
from sklearn.metrics import (accuracy_score, f1_score, matthews_corrcoef, mean_absolute_error,
                             mean_squared_error)

from launcher.downstream.task_metrics import classification_metrics, regression_metrics, scores, spread


def _sklearn_classification(labels, predictions, num_labels):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # one class in both sides: a warning about the confusion matrix's shape
        return {"accuracy": accuracy_score(labels, predictions),
                "macro_f1": f1_score(labels, predictions, labels=list(range(num_labels)), average="macro",
                                     zero_division=0),
                "mcc": matthews_corrcoef(labels, predictions)}


def _scipy_regression(labels, predictions):
    constant = len(set(labels)) < 2 or len(set(predictions)) < 2
    return {"pearson": None if constant else pearsonr(labels, predictions).statistic,
            "spearman": None if constant else spearmanr(labels, predictions).statistic,
            "mse": mean_squared_error(labels, predictions), "mae": mean_absolute_error(labels, predictions)}


def _same(ours: dict, reference: dict) -> None:
    assert ours.keys() == reference.keys()
    for name, value in reference.items():
        if value is None:
            assert ours[name] is None, name
        else:
            assert ours[name] == pytest.approx(float(value), rel=1e-9, abs=1e-12), name


CLASSIFICATION_EDGES = [
    ([0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0], 4),  # class 3 in neither side: it still counts (F1 0) in macro-F1
    ([0, 1, 0, 1], [0, 0, 0, 0], 2),  # a constant prediction: MCC 0, class 1 never predicted
    ([1, 1, 1], [1, 1, 1], 2),  # both sides constant and right
    ([2, 2], [0, 1], 3),  # nothing right
    ([1], [0], 2), ([0], [0], 2),  # one example
    ([0, 1, 2, 3], [3, 2, 1, 0], 4), ([0, 1, 2, 3], [0, 1, 2, 3], 4),
]


@pytest.mark.parametrize("labels,predictions,num_labels", CLASSIFICATION_EDGES)
def test_classification_edge_cases_match_scikit_learn(labels, predictions, num_labels):
    _same(classification_metrics(labels, predictions, num_labels),
          _sklearn_classification(labels, predictions, num_labels))


def test_classification_random_inputs_match_scikit_learn():
    rng = random.Random(0)
    for _ in range(100):  # sklearn checks its inputs at ~30 ms a call under load: 100 draws keep the test short
        num_labels, n = rng.randint(2, 6), rng.randint(1, 60)
        seen = rng.randint(1, num_labels)  # some draws leave classes out of one side or both
        labels = [rng.randrange(seen) for _ in range(n)]
        predictions = [rng.randrange(num_labels) if rng.random() < 0.5 else y for y in labels]
        _same(classification_metrics(labels, predictions, num_labels),
              _sklearn_classification(labels, predictions, num_labels))


REGRESSION_EDGES = [
    ([0.5, 1.0, 3.0, -2.0], [0.1, 1.5, 2.0, -1.0]),
    ([1.0, 2.0], [0.5, 0.5]),  # a constant side: the correlations are undefined (None)
    ([3.0, 3.0, 3.0], [1.0, 2.0, 3.0]),
    ([1.0, 2.0, 2.0, 3.0, 3.0, 3.0], [1.0, 1.0, 2.0, 2.0, 5.0, 0.0]),  # ties on both sides: average ranks
    ([1.0, 2.0, 3.0], [3.0, 2.0, 1.0]), ([1.0, 2.0], [2.0, 4.0]),  # -1 and 1 exactly
    ([1e6, 1e6 + 1, 1e6 + 3], [-5e-4, 1e-4, 2e-4]),  # far from 0 and tiny
    ([2.5], [2.5]),  # one example
]


@pytest.mark.parametrize("labels,predictions", REGRESSION_EDGES)
def test_regression_edge_cases_match_scipy_and_scikit_learn(labels, predictions):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        _same(regression_metrics(labels, predictions), _scipy_regression(labels, predictions))


def test_regression_random_inputs_match_scipy_and_scikit_learn():
    rng = random.Random(1)
    for _ in range(100):  # as above
        n = rng.randint(2, 60)
        labels = [float(rng.randint(0, 4)) if rng.random() < 0.5 else rng.gauss(0, 3) for _ in range(n)]  # ties
        predictions = [y + rng.gauss(0, 2) if rng.random() < 0.7 else float(rng.randint(0, 2)) for y in labels]
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            _same(regression_metrics(labels, predictions), _scipy_regression(labels, predictions))


def test_scores_round_and_count():
    s = scores("classification", [0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0], 4)
    assert s == {"accuracy": round(4 / 6, 5), "macro_f1": round((1 / 2 + 2 / 3 + 4 / 5 + 0) / 4, 5),  # per-class 2tp/(2tp+fp+fn)
                 "mcc": round(matthews_corrcoef([0, 0, 1, 2, 2, 2], [0, 1, 1, 2, 2, 0]), 5), "examples": 6}
    r = scores("regression", [0.5, 1.0, 3.0, -2.0], [0.1, 1.5, 2.0, -1.0], 1)
    assert r["spearman"] == 1.0 and math.isclose(r["mse"], (0.16 + 0.25 + 1 + 1) / 4, abs_tol=1e-5)
    assert scores("regression", [1.0, 2.0], [0.5, 0.5], 1)["pearson"] is None
    with pytest.raises(ValueError):
        scores("classification", [], [], 2)
    assert spread([0.5, None, 0.7]) == {"mean": 0.6, "min": 0.5, "max": 0.7, "n": 2}
