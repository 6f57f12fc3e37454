"""Training checkpoints in the output folder, so a replaced or restarted trainer goes on where the last one stopped.

The sample trainers write their model to ``--output-dir``, which on a cluster lies on the
pipeline workspace (it outlives the TrainJob) and is the same folder for every try of a step.
Rank 0 saves its state there every few steps, in ``<output-dir>/.checkpoints/step-<N>/``:
``state.pt`` (model, optimizer, counters) and ``meta.json`` (what must match to resume). Each
checkpoint is written into a temporary folder and renamed when complete, so a trainer killed
mid-save leaves the previous checkpoint usable; older checkpoints are removed. When the final
model is saved the folder goes. A trainer that starts and finds a checkpoint whose ``meta``
matches its settings loads it and continues (:func:`resume`), and says so on stdout with a
JSON line the launcher and its report read (``{"resumed_from_step": N}``).

Example:
    >>> import tempfile
    >>> out = tempfile.mkdtemp()
    >>> save(out, 20, {"w": [1.0]}, {"lr": 0.1})  # doctest: +SKIP
    >>> latest(out).step  # doctest: +SKIP
    20
    >>> latest(tempfile.mkdtemp()) is None
    True
"""

from __future__ import annotations

import json
import os
import re
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import Any

FOLDER = ".checkpoints"
_STEP = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class Checkpoint:
    """A complete checkpoint: its step, folder and the settings it was saved with."""

    step: int
    path: Path
    meta: dict[str, Any]


def latest(output_dir: str | Path) -> Checkpoint | None:
    """The newest complete checkpoint under ``output_dir`` (``None`` when there is none)."""
    root = Path(output_dir) / FOLDER
    found = []
    for child in root.iterdir() if root.is_dir() else []:
        m = _STEP.match(child.name)
        if m and (child / "state.pt").is_file() and (child / "meta.json").is_file():
            found.append((int(m.group(1)), child))
    for step, path in sorted(found, reverse=True):
        try:
            return Checkpoint(step, path, json.loads((path / "meta.json").read_text()))
        except (OSError, ValueError):
            continue
    return None


def save(output_dir: str | Path, step: int, state: dict[str, Any], meta: dict[str, Any], *, keep: int = 1) -> Path:
    """Write checkpoint ``step`` (rank 0 only), then remove all but the newest ``keep``."""
    import torch

    root = Path(output_dir) / FOLDER
    root.mkdir(parents=True, exist_ok=True)
    final = root / f"step-{step}"
    partial = root / f".partial-step-{step}-{os.getpid()}"
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir()
    torch.save(state, partial / "state.pt")
    (partial / "meta.json").write_text(json.dumps(meta, sort_keys=True))
    shutil.rmtree(final, ignore_errors=True)
    partial.rename(final)
    steps = sorted((int(m.group(1)), c) for c in root.iterdir() if (m := _STEP.match(c.name)))
    for _, old in steps[:-keep]:
        shutil.rmtree(old, ignore_errors=True)
    return final


def resume(output_dir: str | Path, meta: dict[str, Any]) -> tuple[Checkpoint, dict[str, Any]] | tuple[None, str]:
    """The newest checkpoint and its state when its ``meta`` equals ``meta``; else ``(None, why not)``."""
    import torch

    found = latest(output_dir)
    if found is None:
        return None, ""
    if found.meta != json.loads(json.dumps(meta, sort_keys=True)):
        changed = sorted(k for k in set(found.meta) | set(meta) if found.meta.get(k) != meta.get(k))
        return None, f"checkpoint at step {found.step} was saved with other settings ({', '.join(changed)}); starting over"
    return found, torch.load(found.path / "state.pt", map_location="cpu", weights_only=False)


def clear(output_dir: str | Path) -> None:
    """Remove every checkpoint (once the final model is saved)."""
    shutil.rmtree(Path(output_dir) / FOLDER, ignore_errors=True)
