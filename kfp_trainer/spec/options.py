"""The launcher's own inputs (time limits, log choice, backend, workspace path), checked. Pure.

Example:
    >>> check_launch_options(start_timeout=float("nan"))
    Traceback (most recent call last):
    ...
    kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
      - start_timeout: got nan; expected a number of seconds >= 0 (0 means no limit)
"""

from __future__ import annotations

import math
import re
from typing import Any

from ..errors import InvalidSpecErrors, ValidationError
from ..metrics import metric_filter_problem
from . import rules

BACKENDS = ("auto", "kubernetes", "local")
_LOGS = re.compile(r"all|none|[0-9]{1,4}")


def _seconds(value: Any) -> bool:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return False
    return math.isfinite(value) and value >= 0


def check_launch_options(
    *,
    start_timeout: Any = 0.0,
    run_timeout: Any = 0.0,
    queue_timeout: Any = 0.0,
    logs: Any = "0",
    backend: Any = "auto",
    workspace_path: Any = "",
    delete_after_success: Any = False,
    metric_names: Any = "",
) -> None:
    """Raise :class:`InvalidSpecErrors` naming every launcher option that is not usable.

    Args:
        start_timeout: Seconds the job may take to start, time queued left out; 0 means no limit.
        run_timeout: Seconds the trainer may run; 0 means no limit.
        queue_timeout: Seconds the job may wait suspended in its queue; 0 means no limit.
        logs: Trainer node index (``"0"``), ``"all"`` or ``"none"``.
        backend: ``auto``, ``kubernetes`` or ``local``.
        workspace_path: ``""`` or the absolute path of the pipeline workspace (no ``..``).
        delete_after_success: A boolean.
        metric_names: The metrics to keep: comma-separated names and ``re:REGEX`` patterns
            (:class:`~kfp_trainer.metrics.MetricFilter`); ``""`` or None: every one.
    """
    errors: list[ValidationError] = []
    for field, value in (("start_timeout", start_timeout), ("run_timeout", run_timeout), ("queue_timeout", queue_timeout)):
        if not _seconds(value):
            errors.append(ValidationError(field, value, "a number of seconds >= 0 (0 means no limit)"))
    if not rules.ok(_LOGS, str(logs) if isinstance(logs, int) and not isinstance(logs, bool) else logs):
        errors.append(ValidationError("logs", logs, "a trainer node index (0, 1, ...), all or none"))
    if backend not in BACKENDS:
        errors.append(ValidationError("backend", backend, ", ".join(BACKENDS)))
    if workspace_path not in ("", None):
        errors += rules.check_local_path("workspace_path", workspace_path, absolute=True)
    if not isinstance(delete_after_success, bool):
        errors.append(ValidationError("delete_after_success", delete_after_success, "true or false"))
    problem = metric_filter_problem(metric_names)
    if problem:
        errors.append(ValidationError("metric_names", metric_names, problem))
    if errors:
        raise InvalidSpecErrors(errors)
