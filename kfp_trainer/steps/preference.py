"""Run-time work of the ``evaluate_preferences`` component: preference metrics and the gate verdict."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

from .common import finite, log
from .evaluate import compare, read_metrics_artifact


def run_preference_eval(
    *,
    model: Any,
    dataset: Any,
    metrics: Any,
    reference_model: Any = None,
    split: str = "test",
    max_examples: int = 0,
    beta: float = 0.1,
    baseline: Any = None,
    gate_metric: str = "win_rate",
    min_improvement: float = 0.0,
    evaluate_fn: Callable[..., dict[str, Any]] | None = None,
) -> tuple[bool, str]:
    """Score a model on held-out preference pairs, log the metrics, and decide the gate verdict.

    Returns:
        ``(passed, summary)``: whether ``gate_metric`` beats the baseline's by at least ``min_improvement``.
    """
    if evaluate_fn is None:
        from ..trainers.preference_eval import evaluate_preferences

        evaluate_fn = evaluate_preferences
    started = time.monotonic()
    reference = str(reference_model.path) if reference_model is not None else None
    result = evaluate_fn(str(model.path), str(dataset.path), split=split, max_examples=max_examples or None, reference_dir=reference,
                         beta=float(beta or 0.1))  # fmt: skip
    values = {k: float(v) for k, v in result.items() if finite(v)}
    values["eval_seconds"] = round(time.monotonic() - started, 2)
    for name, value in values.items():
        metrics.log_metric(name, value)
    passed, summary = compare(values, read_metrics_artifact(baseline), gate_metric, float(min_improvement or 0.0))
    metrics.log_metric("gate_passed", 1.0 if passed else 0.0)
    log(f"preference evaluation on {split}: " + ", ".join(f"{k}={v:.6g}" for k, v in values.items()))
    log(f"gate: {summary}")
    return passed, summary
