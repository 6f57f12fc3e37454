"""Helpers every step shares: log lines, exit codes, the KFP run identity, files on shared volumes.

Artifacts are duck-typed (``.path``, ``.uri``, ``.metadata``), so nothing here imports KFP or torch.

Example:
    >>> identity_from_uri("minio://mlpipeline/v2/artifacts/demo/6f1c0d5e-0000-4000-8000-000000000001/train-job/output_model")
    ('6f1c0d5e-0000-4000-8000-000000000001', 'train-job')
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import sys
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any, TypeGuard, TypeVar

from ..cancel import Stop, stopping
from ..errors import KfpTrainerError, ValidationError
from ..redaction import scrub

_UNRESOLVED = "{{$."
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
KFP_RUN_ID_ENV = "KFP_RUN_ID"
KFP_TASK_NAME_ENV = "KFP_TASK_NAME"
KFP_PIPELINE_NAME_ENV = "KFP_PIPELINE_NAME"
T = TypeVar("T")


def log(message: str) -> None:
    """A component message in the step's log."""
    print(f"[kfp-trainer] {message}", flush=True)


# --------------------------------------------------------------------------- identity


def unresolved(value: str | None) -> bool:
    """True for a KFP placeholder the backend did not replace (component defaults on a cluster)."""
    return bool(value) and _UNRESOLVED in str(value)


def identity_from_uri(uri: str) -> tuple[str, str] | None:
    """(run id, task name) from a KFP output artifact URI ``.../<run-uuid>/<task>/...``."""
    parts = [p for p in uri.split("/") if p]
    for i, part in enumerate(parts[:-1]):
        if _UUID.match(part):
            return part, parts[i + 1]
    return None


def scope_from_uri(uri: str) -> str:
    """The per-execution folder of a KFP backend output URI, or ``""``.

    The backend's driver (2.15+) names outputs ``<root>/<pipeline>/<run-uuid>/<task>/<uuid>/<output>``:
    the second uuid is new for every execution of the task (each ``ParallelFor`` iteration)
    and kept when the executor pod is retried.

    Example:
        >>> scope_from_uri("minio://b/v2/artifacts/p/6f1c0d5e-0000-4000-8000-000000000001/train-job/"
        ...                "0b6a3c1e-1111-4222-8333-444455556666/output_model")
        '0b6a3c1e-1111-4222-8333-444455556666'
        >>> scope_from_uri("/tmp/pipeline-root/p-2026/train-job/output_model")
        ''
    """
    parts = [p for p in uri.split("/") if p]
    for i, part in enumerate(parts[:-1]):
        if _UUID.match(part):
            rest = parts[i + 2 :]
            return rest[0] if len(rest) >= 2 and _UUID.match(rest[0]) else ""
    return ""


def resolve_scope(task_id: str | None, *, output_uri: str = "") -> str:
    """What tells apart two executions of one task in one run (``ParallelFor`` iterations).

    ``task_id`` is ``dsl.PIPELINE_TASK_ID_PLACEHOLDER`` as the task received it: the
    backend resolves it to the enclosing DAG's execution id (one per loop iteration,
    stable across retries of the step), ``kfp.local`` to a random id per task. When it
    was not resolved (a component default), the output URI's execution folder is used.

    Example:
        >>> resolve_scope("1234")
        '1234'
        >>> resolve_scope("{{$.pipeline_task_uuid}}", output_uri="/local/p/train-job/output_model")
        ''
    """
    if task_id and not unresolved(task_id):
        return str(task_id)
    return scope_from_uri(output_uri) if output_uri else ""


def resolve_identity(
    run_id: str, task_name: str, pipeline_name: str, *, output_uri: str = "", env: Mapping[str, str] | None = None
) -> tuple[str, str, str]:
    """Run id, task name and pipeline name with unreplaced placeholders filled in.

    KFP replaces ``dsl.PIPELINE_JOB_ID_PLACEHOLDER`` and friends when a pipeline passes
    them to a task, and (on a cluster) not when they are a component's default values.
    This falls back to ``$KFP_RUN_ID`` / ``$KFP_TASK_NAME``, then to the output artifact's
    URI, which KFP builds from the run id and task name (stable across retries).

    Raises:
        ValidationError: The run id cannot be found; pass ``run_id`` (or ``name``) explicitly.
    """
    env = os.environ if env is None else env
    from_uri = identity_from_uri(output_uri) if output_uri else None
    if unresolved(run_id):
        run_id = env.get(KFP_RUN_ID_ENV) or (from_uri[0] if from_uri else "")
        if not run_id:
            raise ValidationError(
                "run_id", dsl_literal(run_id), "the KFP run id: pass run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER from the pipeline"
            )
    if unresolved(task_name):
        task_name = env.get(KFP_TASK_NAME_ENV) or (from_uri[1] if from_uri else "train-job")
    if unresolved(pipeline_name):
        pipeline_name = env.get(KFP_PIPELINE_NAME_ENV, "")
    return run_id, task_name, pipeline_name


def dsl_literal(value: str) -> str:
    """How an unresolved value is shown in errors."""
    return value or "{{$.pipeline_job_uuid}}"


# --------------------------------------------------------------------------- files


def copy_dir(src: str | Path, dst: str | Path) -> None:
    """Copy a directory's contents (or one file) into ``dst``, replacing what is there."""
    source, target = Path(src), Path(dst)
    if source.resolve() == target.resolve():
        return
    if target.exists():
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    if source.is_dir():
        shutil.copytree(source, target, symlinks=False)
    else:
        target.mkdir(parents=True, exist_ok=True)
        shutil.copy2(source, target / source.name)


def stage(src: str | Path, dst: str | Path) -> bool:
    """Copy an input artifact to the shared volume once; ``False`` when an earlier try already did.

    A retried launcher may adopt a TrainJob that is still reading the staged files, so a
    completed copy (marked by ``<dst>.staged``) is never replaced; an interrupted one is.
    """
    target = Path(dst)
    marker = target.with_name(target.name + ".staged")
    if marker.exists() and target.exists():
        return False
    partial = target.with_name(f"{target.name}.partial-{os.getpid()}")
    copy_dir(src, partial)
    if target.exists():
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    partial.rename(target)
    marker.write_text(str(src))
    return True


def shared_dir(path: str | Path) -> Path:
    """Create ``path`` (and its parent) writable by every user.

    The trainer's pods may run as another user than this step, and must be able to write
    the model into a directory this step created on the shared volume.
    """
    target = Path(path)
    target.mkdir(parents=True, exist_ok=True)
    for p in (target.parent, target):
        try:
            p.chmod(0o777)
        except OSError:  # not ours to change (e.g. a pre-existing directory): the trainer may still write
            pass
    return target


def dir_stats(path: str | Path) -> tuple[int, int]:
    """(number of files, total bytes) under ``path``."""
    root = Path(path)
    if root.is_file():
        return 1, root.stat().st_size
    files = [p for p in root.rglob("*") if p.is_file()] if root.exists() else []
    return len(files), sum(p.stat().st_size for p in files)


def model_metadata(model_dir: str | Path, **known: Any) -> dict[str, Any]:
    """Metadata of a model directory: weights (full/adapter), format, sizes, training info.

    Example:
        >>> import tempfile, pathlib
        >>> d = pathlib.Path(tempfile.mkdtemp()); _ = (d / "model.safetensors").write_bytes(b"x")
        >>> m = model_metadata(d, base_model="builtin://models/tiny-char-lm")
        >>> (m["weights"], m["format"], m["base_model"])
        ('full', 'safetensors', 'builtin://models/tiny-char-lm')
    """
    root = Path(model_dir)
    files, size = dir_stats(root)
    names = [p.name for p in root.rglob("*") if p.is_file()] if root.is_dir() else []
    info: dict[str, Any] = {}
    info_file = root / "training_info.json"
    if info_file.is_file():
        try:
            info = json.loads(info_file.read_text())
        except ValueError:
            info = {}
    if any(n.startswith("adapter_config") for n in names):
        weights = "adapter"
    else:
        weights = str(info.get("weights") or "full")
    if any(n.endswith(".safetensors") for n in names):
        fmt = "safetensors"
    elif any(n.endswith((".bin", ".pt", ".pth")) for n in names):
        fmt = "pytorch"
    elif any(n.endswith(".gguf") for n in names):
        fmt = "gguf"
    else:
        fmt = "unknown"
    meta: dict[str, Any] = {"weights": weights, "format": fmt, "files": files, "bytes": size}
    if (root / "config.json").is_file():
        meta["framework"] = "transformers"
    for key in ("method", "steps", "train_loss", "world_size", "trainable_params", "resumed_from_step"):
        if key in info:
            meta[key] = info[key]
    meta.update({k: v for k, v in known.items() if v not in (None, "")})
    scrubbed: dict[str, Any] = scrub(meta)  # e.g. a base model URI with credentials, from an upstream artifact
    return scrubbed



def finite(value: Any) -> TypeGuard[float]:
    """True for an int or float (not a bool) that is neither NaN nor infinite."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def exit_on_error(func: Callable[[], T]) -> T:
    """Run ``func``; on a :class:`~kfp_trainer.errors.KfpTrainerError` print it and exit with its code."""
    try:
        return func()
    except KfpTrainerError as e:
        try:
            print(f"[kfp-trainer] error: {e}", file=sys.stderr, flush=True)
        except OSError:  # a stderr with no reader any more (a KFP cancel): the exit code still says it
            pass
        raise SystemExit(e.exit_code) from None


def run_step(work: Callable[[Stop], T]) -> T:
    """A launcher component's body: ``work`` given the step's stop token, a user error its exit code.

    The token is made first (:func:`kfp_trainer.cancel.stopping`): from here on a KFP cancel
    (SIGTERM) ends the step with the TrainJob deleted or never created, and one that came while
    the work finished still ends it cancelled (exit code 130).
    """

    def step() -> T:
        with stopping() as stop:
            return work(stop)

    return exit_on_error(step)
