"""Run-time work of the ``evaluate_model`` component: metrics of a causal LM and the gate verdict."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from .common import finite, log


def compare(candidate: Mapping[str, Any], baseline: Mapping[str, Any] | None, metric: str, min_delta: float) -> tuple[bool, str]:
    """Whether ``candidate`` beats ``baseline`` on ``metric`` by at least ``min_delta``.

    Lower is better for losses, errors and perplexity; higher otherwise. Without a
    baseline, the candidate passes when its value is finite.

    Example:
        >>> compare({"exact_match": 0.9}, {"exact_match": 0.1}, "exact_match", 0.05)
        (True, 'exact_match 0.9 vs baseline 0.1 (+0.8, needed +0.05): improved')
        >>> compare({"loss": 2.0}, {"loss": 1.0}, "loss", 0.0)[0]
        False
    """
    from ..metrics import lower_is_better

    value = candidate.get(metric)
    if not finite(value):
        return False, f"{metric} missing or not a number in the candidate's metrics"
    if not baseline or not finite(baseline.get(metric)):
        return True, f"{metric} {value:.6g} (no baseline to compare with)"
    base = float(baseline[metric])
    delta = float(value) - base
    gain = -delta if lower_is_better(metric) else delta
    ok = gain >= min_delta
    sign = "-" if lower_is_better(metric) else "+"
    return ok, (
        f"{metric} {value:.6g} vs baseline {base:.6g} ({delta:+.6g}, needed {sign}{min_delta:g}): "
        + ("improved" if ok else "not improved enough")
    )


def read_metrics_artifact(artifact: Any) -> dict[str, float]:
    """Metric values of an input ``dsl.Metrics`` artifact (its metadata, else its file)."""
    if artifact is None:
        return {}
    values = {k: v for k, v in (getattr(artifact, "metadata", None) or {}).items() if finite(v)}
    if values:
        return values
    path = Path(str(getattr(artifact, "path", "") or ""))
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except ValueError:
            return {}
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if finite(v)}
    return {}


def run_lm_eval(model_dir: str, tasks: list[str], limit: int | None) -> dict[str, float]:
    """Scores from lm-evaluation-harness when it is installed; empty (with a log line) when not."""
    try:
        import lm_eval
    except ImportError:
        log(f"lm_eval_tasks={tasks} skipped: the lm-eval package is not installed in this image")
        return {}
    results = lm_eval.simple_evaluate(model="hf", model_args=f"pretrained={model_dir}", tasks=list(tasks), limit=limit)
    scores: dict[str, float] = {}
    for task, values in (results or {}).get("results", {}).items():
        for key, value in values.items():
            if finite(value):
                scores[f"lm_eval/{task}/{key.split(',')[0]}"] = float(value)
    return scores


def run_evaluate(
    *,
    model: Any,
    dataset: Any,
    metrics: Any,
    split: str = "test",
    max_examples: int = 0,
    baseline: Any = None,
    gate_metric: str = "exact_match",
    min_improvement: float = 0.0,
    lm_eval_tasks: list[str] | None = None,
    evaluate_fn: Callable[..., dict[str, Any]] | None = None,
) -> tuple[bool, str]:
    """Evaluate a model on a dataset split, log metrics, and decide the gate verdict.

    Returns:
        ``(passed, summary)``: whether ``gate_metric`` beats the baseline by at least
        ``min_improvement`` (lower-is-better metrics count decreases), and why.
    """
    if evaluate_fn is None:
        from ..trainers.evaluate import evaluate

        evaluate_fn = evaluate
    started = time.monotonic()
    result = evaluate_fn(str(model.path), str(dataset.path), split=split, max_examples=max_examples or None)
    values = {k: float(v) for k, v in result.items() if finite(v)}
    if lm_eval_tasks:
        values.update(run_lm_eval(str(model.path), list(lm_eval_tasks), max_examples or None))
    values["eval_seconds"] = round(time.monotonic() - started, 2)
    for name, value in values.items():
        metrics.log_metric(name, value)
    base = read_metrics_artifact(baseline)
    passed, summary = compare(values, base, gate_metric, float(min_improvement or 0.0))
    metrics.log_metric("gate_passed", 1.0 if passed else 0.0)
    log(f"evaluation on {split}: " + ", ".join(f"{k}={v:.6g}" for k, v in values.items()))
    log(f"gate: {summary}")
    return passed, summary
