"""Run-time work of a classifier evaluation: accuracy, per-class scores and a confusion matrix.

The confusion matrix goes to a ``dsl.ClassificationMetrics`` artifact in the shape the KFP
UI draws (categories, one row of integer counts per true class); every number logged is
finite.

Example:
    >>> confusion_matrix([0, 1, 1, 2], [0, 1, 2, 2], 3)
    [[1, 0, 0], [0, 1, 1], [0, 0, 1]]
    >>> scores([[1, 0, 0], [0, 1, 1], [0, 0, 1]])["accuracy"]
    0.75
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .common import finite, log


def confusion_matrix(truth: Sequence[int], predicted: Sequence[int], classes: int) -> list[list[int]]:
    """Counts ``[true class][predicted class]``.

    Raises:
        ValueError: The sequences differ in length or hold a class outside ``0..classes-1``.
    """
    if len(truth) != len(predicted):
        raise ValueError(f"{len(truth)} labels but {len(predicted)} predictions")
    matrix = [[0] * classes for _ in range(classes)]
    for t, p in zip(truth, predicted, strict=True):
        if not (0 <= int(t) < classes and 0 <= int(p) < classes):
            raise ValueError(f"class out of range 0..{classes - 1}: true {t}, predicted {p}")
        matrix[int(t)][int(p)] += 1
    return matrix


def scores(matrix: Sequence[Sequence[int]]) -> dict[str, float]:
    """Accuracy, macro precision/recall/F1 and per-class recall of a confusion matrix.

    A class that was never predicted (or never seen) counts as 0 for its precision (recall),
    so every value is finite.
    """
    n = len(matrix)
    total = sum(sum(row) for row in matrix)
    correct = sum(matrix[i][i] for i in range(n))
    out: dict[str, float] = {"accuracy": correct / total if total else 0.0, "examples": float(total)}
    precisions, recalls, f1s = [], [], []
    for i in range(n):
        predicted = sum(matrix[r][i] for r in range(n))
        actual = sum(matrix[i])
        precision = matrix[i][i] / predicted if predicted else 0.0
        recall = matrix[i][i] / actual if actual else 0.0
        f1 = 2 * precision * recall / (precision + recall) if precision + recall else 0.0
        precisions.append(precision)
        recalls.append(recall)
        f1s.append(f1)
        out[f"recall_class_{i}"] = recall
    out.update({"macro_precision": sum(precisions) / n, "macro_recall": sum(recalls) / n, "macro_f1": sum(f1s) / n})
    return out


def run_classifier_evaluation(
    *,
    model: Any,
    dataset: Any,
    metrics: Any,
    confusion: Any,
    split: str = "test",
    predict_fn: Callable[[str, str, str], tuple[list[int], list[int], list[str]]] | None = None,
) -> dict[str, float]:
    """Evaluate a digit classifier on one split; log metrics and the confusion matrix.

    Args:
        model: The trained model artifact (``.path``).
        dataset: The dataset artifact (``.path``) with ``<split>.npz``.
        metrics: Output ``dsl.Metrics``: accuracy, macro precision/recall/F1, per-class recall.
        confusion: Output ``dsl.ClassificationMetrics``: the confusion matrix.
        split: Split to evaluate.
        predict_fn: ``(model_dir, dataset_dir, split) -> (truth, predicted, categories)``;
            the digits classifier's by default.

    Returns:
        The logged metric values.
    """
    if predict_fn is None:
        predict_fn = _predict_digits
    truth, predicted, categories = predict_fn(str(model.path), str(dataset.path), split)
    matrix = confusion_matrix(truth, predicted, len(categories))
    values = {k: round(v, 6) for k, v in scores(matrix).items() if finite(v)}
    for name, value in values.items():
        metrics.log_metric(name, value)
    confusion.log_confusion_matrix(list(categories), matrix)
    log(f"evaluation on {split}: accuracy={values['accuracy']:.4f} macro_f1={values['macro_f1']:.4f} ({int(values['examples'])} examples)")
    return values


def _predict_digits(model_dir: str, dataset_dir: str, split: str) -> tuple[list[int], list[int], list[str]]:
    from ..trainers import digits

    x, y = digits.load_split(dataset_dir, split)
    model = digits.load_model(model_dir)
    return [int(v) for v in y], digits.predict(model, x), [str(c) for c in digits.CLASSES]
