"""A TrainJob's ``status.trainerStatus`` (Trainer v2.3 progress) as a step shows it. Pure.

With the Trainer's ``TrainJobStatus`` feature gate on, a training process reports its progress
(percentage, estimated time left, metrics) to the Trainer's status server, which stores it in
``status.trainerStatus`` (see :mod:`kfp_trainer.progress`). :class:`ProgressLog` turns the
updates the launcher's watch sees into

* a line for the step's log when the progress *moves*: the first report, every ``step``
  percentage points, 100 %, and otherwise at most one line per ``quiet`` seconds when only the
  metrics or the estimate changed -- never one line per update;
* a bounded history (seconds since the launcher began following, percentage, estimate,
  metrics) for the run report.

Example:
    >>> log = ProgressLog()
    >>> log.observe({"trainerStatus": {"progressPercentage": 10, "estimatedRemainingSeconds": 200,
    ...              "metrics": [{"name": "loss", "value": "2.5"}], "lastUpdatedTime": "2026-01-01T00:00:00Z"}}, 5.0)
    'progress 10%, about 3m 20s left (loss=2.5)'
    >>> log.observe({"trainerStatus": {"progressPercentage": 12, "lastUpdatedTime": "2026-01-01T00:00:05Z"}}, 10.0) is None
    True
    >>> [p["percent"] for p in log.history]
    [10, 12]
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from .redaction import redact_text
from .timing import duration

MAX_HISTORY = 400
MAX_METRICS_SHOWN = 6


def read(status: Mapping[str, Any] | None) -> dict[str, Any] | None:
    """``status.trainerStatus`` as ``{percent, eta, metrics, updated}``, or None when absent or empty."""
    raw = (status or {}).get("trainerStatus")
    if not isinstance(raw, Mapping):
        return None
    pct, eta = raw.get("progressPercentage"), raw.get("estimatedRemainingSeconds")
    metrics = {
        str(m.get("name")): str(m.get("value"))
        for m in raw.get("metrics") or []
        if isinstance(m, Mapping) and m.get("name") not in (None, "")
    }
    point = {
        "percent": pct if isinstance(pct, (int, float)) and not isinstance(pct, bool) and math.isfinite(pct) else None,
        "eta": eta if isinstance(eta, (int, float)) and not isinstance(eta, bool) and math.isfinite(eta) else None,
        "metrics": metrics,
        "updated": str(raw.get("lastUpdatedTime") or ""),
    }
    return point if point["percent"] is not None or point["eta"] is not None or metrics else None


def describe(point: Mapping[str, Any]) -> str:
    """One line: ``progress 42%, about 3m 20s left (loss=0.25, learning_rate=2e-05)``."""
    parts = []
    if point.get("percent") is not None:
        parts.append(f"progress {point['percent']:g}%")
    else:
        parts.append("progress reported")
    if point.get("eta") is not None:
        parts.append(f"about {duration(point['eta'])} left")
    text = ", ".join(parts)
    metrics = list((point.get("metrics") or {}).items())
    if metrics:
        shown = ", ".join(f"{k}={v}" for k, v in metrics[:MAX_METRICS_SHOWN])
        more = f", +{len(metrics) - MAX_METRICS_SHOWN} more" if len(metrics) > MAX_METRICS_SHOWN else ""
        text += f" ({shown}{more})"
    return redact_text(text)


class ProgressLog:
    """Decides which trainerStatus updates get a log line, and keeps their history.

    Args:
        step: Percentage points the progress must move to earn a new line.
        quiet: Seconds between two lines when only metrics or the estimate changed.
    """

    def __init__(self, *, step: float = 5.0, quiet: float = 60.0) -> None:
        self.step = step
        self.quiet = quiet
        self.history: list[dict[str, Any]] = []
        self._last: dict[str, Any] | None = None
        self._printed: tuple[float | None, float] | None = None  # (percent, seconds) of the last line

    def observe(self, status: Mapping[str, Any] | None, seconds: float) -> str | None:
        """Record the trainerStatus in ``status`` seen ``seconds`` after following began; a log line or None."""
        point = read(status)
        if point is None or point == self._last:
            return None
        self._last = point
        self.history.append({"seconds": round(seconds, 3), **point})
        if len(self.history) > MAX_HISTORY:  # thin out, keeping the first and the latest
            self.history = self.history[:1] + self.history[1:-1:2] + self.history[-1:]
        pct = point["percent"]
        if self._printed is None:
            due = True
        else:
            last_pct, last_seconds = self._printed
            moved = pct is not None and (last_pct is None or abs(pct - last_pct) >= self.step or (pct >= 100 > last_pct))
            due = moved or seconds - last_seconds >= self.quiet
        if not due:
            return None
        self._printed = (pct, seconds)
        return describe(point)

    @property
    def last(self) -> dict[str, Any] | None:
        """The latest trainerStatus seen, as :func:`read` returns it."""
        return self._last

    def status(self) -> dict[str, Any]:
        """The latest metrics seen, in a TrainJob status's shape (``{"trainerStatus": {"metrics": [...]}}``)."""
        metrics = (self._last or {}).get("metrics") or {}
        return {"trainerStatus": {"metrics": [{"name": k, "value": v} for k, v in metrics.items()]}}
