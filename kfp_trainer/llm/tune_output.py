"""What a torchtune run leaves in its ``output_dir``: the loss log, and which settings it may take.

torchtune's recipes log every step to ``<output_dir>/logs/log_<time>.txt`` (one file per run,
``Step 3 | loss:11.9 lr:2e-05 tokens_per_second_per_gpu:16.8``); a resumed run writes a new
file and goes on counting steps. :func:`log_points` reads them all, oldest first, so a step
run again after a resume keeps its newest value. The rest is pure.

Example:
    >>> [(p.name, p.value, p.step) for p in points_in("Step 2 | loss:11.8 lr:2e-05")]
    [('loss', 11.8, 2.0), ('learning_rate', 2e-05, 2.0)]
"""

from __future__ import annotations

import math
import re
from pathlib import Path

from kfp_trainer.errors import ValidationError
from kfp_trainer.metrics import MetricPoint

from .tune_command import IMMUTABLE_CONFIGS

_STEP = re.compile(r"^Step (\d+) \| (.*)$")
_PAIR = re.compile(r"([A-Za-z_][\w.]*):([-+0-9.eE]+|nan|inf)")
_NAMES = {"lr": "learning_rate"}
_OVERRIDE = re.compile(r"^[A-Za-z_][\w.]*=[^\n]*$")


def points_in(text: str) -> list[MetricPoint]:
    """Metric points of one torchtune log file's text (``lr`` becomes ``learning_rate``)."""
    out = []
    for line in text.splitlines():
        m = _STEP.match(line.strip())
        if not m:
            continue
        step = float(m.group(1))
        for name, raw in _PAIR.findall(m.group(2)):
            value = float(raw)
            if math.isfinite(value):
                out.append(MetricPoint(_NAMES.get(name, name), value, step))
    return out


def log_points(output_dir: str | Path) -> list[MetricPoint]:
    """Every step's metrics logged under ``output_dir/logs``; a step logged twice keeps its newest value."""
    logs = sorted((Path(output_dir) / "logs").glob("log_*.txt"), key=lambda p: (p.stat().st_mtime_ns, p.name))
    latest: dict[tuple[str, float | None], MetricPoint] = {}
    for path in logs:
        for point in points_in(path.read_text(errors="replace")):
            latest.pop((point.name, point.step), None)  # keep log order for a step run again
            latest[(point.name, point.step)] = point
    return sorted(latest.values(), key=lambda p: (p.step or 0.0))


def check_overrides(overrides: list[str], taken: list[str]) -> list[ValidationError]:
    """Problems with extra ``key=value`` overrides: shape, keys the runtime owns, keys set twice.

    ``taken`` are the overrides the typed settings already produce.

    Example:
        >>> [e.field for e in check_overrides(["optimizer.lr=1e-3", "output_dir=/x", "epochs=3"], ["epochs=2"])]
        ['overrides[1]', 'overrides[2]']
    """
    errors = []
    keys = {t.split("=", 1)[0] for t in taken}
    for i, item in enumerate(overrides):
        where = f"overrides[{i}]"
        if not isinstance(item, str) or not _OVERRIDE.match(item):
            errors.append(ValidationError(where, item, "a torchtune override key=value, e.g. optimizer.lr=1e-4"))
            continue
        key = item.split("=", 1)[0]
        if key in IMMUTABLE_CONFIGS:
            errors.append(ValidationError(where, item, f"another key: the runtime sets {key} (the Trainer refuses it)"))
        elif key in keys:
            errors.append(ValidationError(where, item, f"another key: {key} is set by a typed input already"))
        keys.add(key)
    return errors
