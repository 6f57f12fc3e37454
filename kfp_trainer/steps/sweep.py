"""Run-time work of choosing the best of several trained models by one metric.

Example:
    >>> best_index([{"val_accuracy": 0.9}, {"val_accuracy": 0.95}, {}], "val_accuracy")
    1
    >>> best_index([{"loss": 0.3}, {"loss": 0.2}], "loss")
    1
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from ..errors import UserError
from .common import copy_dir, finite, log
from .evaluate import read_metrics_artifact


def best_index(candidates: Sequence[Mapping[str, Any]], metric: str, *, higher_is_better: bool | None = None) -> int:
    """Index of the candidate with the best finite ``metric``; the first one on ties.

    Lower is better for losses, errors and perplexity (see
    :func:`kfp_trainer.metrics.lower_is_better`) unless ``higher_is_better`` says otherwise.

    Raises:
        UserError: No candidate has a finite value of ``metric``.
    """
    from ..metrics import lower_is_better

    higher = (not lower_is_better(metric)) if higher_is_better is None else higher_is_better
    scored = [(i, float(c[metric])) for i, c in enumerate(candidates) if finite(c.get(metric))]
    if not scored:
        seen = sorted({k for c in candidates for k in c})
        raise UserError(f"no candidate has a numeric {metric!r}: the metrics they have are {', '.join(seen) or 'none'}")
    best = max(scored, key=lambda item: (item[1] if higher else -item[1], -item[0]))
    return best[0]


def comparison_table(rows: Sequence[Mapping[str, Any]], metric: str, best: int) -> str:
    """Markdown table of every candidate's parameters and metrics, the best marked."""
    columns = sorted({k for r in rows for k in r if k != "trainjob"})
    columns.sort(key=lambda c: (c != metric, c))
    lines = ["| # | " + " | ".join(columns) + " | TrainJob |", "|---:|" + "---:|" * len(columns) + "---|"]
    for i, row in enumerate(rows):
        cells = [_cell(row.get(c)) for c in columns]
        mark = f"**{i}** (best)" if i == best else str(i)
        lines.append(f"| {mark} | " + " | ".join(cells) + f" | {row.get('trainjob', '')} |")
    return "\n".join(lines)


def _cell(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.6g}"
    return "" if value is None else str(value)


def hyperparameters(model: Any) -> dict[str, Any]:
    """The hyper-parameters a trainer recorded in ``training_info.json`` beside the model, if any."""
    info = Path(str(getattr(model, "path", "") or "")) / "training_info.json"
    try:
        found = json.loads(info.read_text()).get("hyperparameters") if info.is_file() else None
    except ValueError:
        found = None
    return dict(found) if isinstance(found, dict) else {}


def run_select_best(
    *,
    models: Sequence[Any],
    metrics: Sequence[Any],
    metric: str,
    best_model: Any,
    best_metrics: Any,
    comparison: Any,
    higher_is_better: bool | None = None,
) -> int:
    """Pick the model whose metrics are best by ``metric``; copy it out with a comparison table.

    Each row of the table shows a model's hyper-parameters (from its ``training_info.json``)
    and metrics, so the order in which KFP collects the loop's outputs does not matter.

    Args:
        models: The trained models (one per sweep point, in the sweep's order).
        metrics: Their metrics artifacts (same order).
        metric: Metric to choose by.
        best_model: Output ``dsl.Model``: a copy of the winner with metadata.
        best_metrics: Output ``dsl.Metrics``: the winner's metrics and its index.
        comparison: Output ``dsl.Markdown``: every point's parameters and metrics.
        higher_is_better: Direction of ``metric``; guessed from its name when unset.

    Returns:
        Index of the best model.

    Raises:
        UserError: Models and metrics differ in number, or none has the metric.
    """
    if len(models) != len(metrics) or not models:
        raise UserError(f"{len(models)} models but {len(metrics)} metrics: give one metrics artifact per model")
    values = [read_metrics_artifact(m) for m in metrics]
    best = best_index(values, metric, higher_is_better=higher_is_better)
    winner = models[best]
    copy_dir(winner.path, best_model.path)
    best_model.metadata.update(dict(getattr(winner, "metadata", None) or {}))
    points = [hyperparameters(m) for m in models]
    point = points[best]
    best_model.metadata.update({"selected_by": metric, metric: values[best][metric], "sweep_index": best,
                                "source_model": getattr(winner, "uri", ""), "hyperparameters": json.dumps(point, sort_keys=True)})
    for name, value in sorted(values[best].items()):
        best_metrics.log_metric(name, value)
    best_metrics.log_metric("sweep_index", float(best))
    rows = []
    for i, (model, scores) in enumerate(zip(models, values, strict=True)):
        row: dict[str, Any] = dict(points[i])
        row.update(scores)
        row["trainjob"] = (getattr(model, "metadata", None) or {}).get("trainjob", "")
        rows.append(row)
    text = f"# Sweep: best by `{metric}`\n\n" + comparison_table(rows, metric, best) + "\n"
    Path(comparison.path).parent.mkdir(parents=True, exist_ok=True)
    Path(comparison.path).write_text(text, encoding="utf-8")
    log(f"best of {len(models)} by {metric}: #{best} {point or ''} {metric}={values[best][metric]:.6g}")
    return best
