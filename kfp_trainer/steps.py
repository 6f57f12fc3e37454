"""What each component does at run time, on plain values and artifact-like objects.

The KFP component functions in :mod:`kfp_trainer.components` only collect their inputs and
call one function here. Artifacts are duck-typed (``.path``, ``.uri``, ``.metadata``,
``.log_metric``), so this module imports neither KFP nor torch at module level and can be
tested without a pipeline.

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
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from . import naming
from .errors import UserError, ValidationError

_UNRESOLVED = "{{$."
_UUID = re.compile(r"^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$")
KFP_RUN_ID_ENV = "KFP_RUN_ID"
KFP_TASK_NAME_ENV = "KFP_TASK_NAME"
KFP_PIPELINE_NAME_ENV = "KFP_PIPELINE_NAME"


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
    for key in ("method", "steps", "train_loss", "world_size", "trainable_params"):
        if key in info:
            meta[key] = info[key]
    meta.update({k: v for k, v in known.items() if v not in (None, "")})
    return meta


# --------------------------------------------------------------------------- train_job


def _artifact_path(artifact: Any) -> str | None:
    if artifact is None:
        return None
    path = getattr(artifact, "path", None)
    return str(path) if path else None


def _shared_copy(artifact: Any, shared_root: str | None) -> str | None:
    """The artifact's copy on the shared volume, if its producer left one there."""
    if artifact is None or not shared_root:
        return None
    where = (getattr(artifact, "metadata", None) or {}).get("workspace_path")
    if isinstance(where, str) and where.startswith(shared_root.rstrip("/") + "/") and Path(where).exists():
        return where
    return None


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def run_train_job(
    *,
    inputs: dict[str, Any],
    task_config: Any,
    backend: str,
    start_timeout: float,
    run_timeout: float,
    logs: str,
    delete_after_success: bool,
    workspace_path: str,
    dataset: Any,
    model: Any,
    output_model: Any,
    metrics: Any,
    report: Any,
    trainjob_path: str,
    backend_factory: Callable[[str], Any] | None = None,
) -> Any:
    """Run one TrainJob for the ``train_job`` component and fill its outputs.

    Args:
        inputs: The component's TrainJob inputs (``None`` = not set).
        task_config: The task's ``dsl.TaskConfig`` (empty under ``kfp.local``).
        backend: ``auto``, ``local`` or ``kubernetes``.
        start_timeout: Seconds the job may take to start; 0 = no limit.
        run_timeout: Seconds the trainer may run; 0 = no limit.
        logs: Trainer node whose log to stream (``"0"``), ``"all"`` or ``"none"``.
        delete_after_success: Delete the TrainJob once it succeeded and the model is copied.
        workspace_path: The KFP workspace path (``dsl.WORKSPACE_PATH_PLACEHOLDER``) or ``""``.
        dataset: Optional input Dataset artifact (``{dataset}``).
        model: Optional input Model artifact (``{model}``).
        output_model: Output Model artifact (``{output_model}``).
        metrics: Output Metrics artifact.
        report: Output HTML artifact.
        trainjob_path: File to write ``namespace/name`` to (written as soon as it is known).
        backend_factory: Test hook replacing :func:`~kfp_trainer.backends.select_backend`.

    Returns:
        The launcher's ``Outcome``.
    """
    from .backends import select_backend
    from .launcher import LaunchOptions, Launcher
    from .report import outcome_data, render_html
    from .spec import TrainJobInputs, validate
    from .staging import choose_shared_root, plan_paths
    from .taskconfig import merge_task_config

    given = {k: v for k, v in inputs.items() if v is not None}
    output_uri = str(getattr(output_model, "uri", "") or "")
    run_id, task_name, pipeline_name = resolve_identity(
        given.get("run_id", ""), given.get("task_name", ""), given.get("pipeline_name", ""), output_uri=output_uri
    )
    given.update({k: v for k, v in (("run_id", run_id), ("task_name", task_name), ("pipeline_name", pipeline_name)) if v})
    if unresolved(workspace_path):
        workspace_path = ""
    merged = merge_task_config(given, task_config)
    chosen = (backend_factory or select_backend)(backend or "auto")
    local = bool(getattr(chosen, "local", False))
    shared_root = None if local else choose_shared_root(workspace_path, merged.get("volume_mounts"), merged.get("volumes"))
    key_source = json.dumps(given, sort_keys=True, default=str) + "|" + "|".join(
        str(getattr(a, "uri", "") or "") for a in (dataset, model)
    )
    key = f"{naming.label_value(task_name or 'train-job')[:40].strip('-_.') or 'train'}-{naming.digest(key_source)}"
    artifacts = {"dataset": _artifact_path(dataset), "model": _artifact_path(model)}
    plan = plan_paths(
        merged,
        local=local,
        artifacts=artifacts,
        output_model=str(output_model.path),
        shared_root=shared_root,
        key=key,
        shared_artifacts={n: p for n, a in (("dataset", dataset), ("model", model)) if (p := _shared_copy(a, shared_root))},
    )
    merged.update(plan.values)
    parsed = TrainJobInputs.parse(**merged)
    validate(parsed, api_version=None, local=local)  # every input problem before any copy or API call

    for src, dst in plan.stage_in:
        log(f"staging {src} -> {dst} (shared with the TrainJob's pods)")
        copy_dir(src, dst)
    if plan.stage_out:
        Path(plan.stage_out[0]).mkdir(parents=True, exist_ok=True)
    Path(output_model.path).mkdir(parents=True, exist_ok=True)

    def submitted(ref: Any) -> None:
        Path(trainjob_path).parent.mkdir(parents=True, exist_ok=True)
        Path(trainjob_path).write_text(str(ref))

    options = LaunchOptions(
        start_timeout=float(start_timeout or 0), run_timeout=float(run_timeout or 0), logs=str(logs or "0"),
        # the model lives on the shared volume or in the artifact, not in the TrainJob: safe to delete
        delete_after_success=bool(delete_after_success),
    )
    outcome = Launcher(chosen, options, on_submitted=submitted).run(parsed)
    submitted(outcome.ref)

    if plan.stage_out:
        log(f"copying the trained model {plan.stage_out[0]} -> output artifact")
        copy_dir(plan.stage_out[0], plan.stage_out[1])
    files, _ = dir_stats(output_model.path)
    if "output_model" in plan.used and files == 0:
        raise UserError(
            f"TrainJob {outcome.ref} succeeded but wrote nothing to {{output_model}} ({plan.paths.get('output_model')}): "
            "the trainer must save the model there (rank 0)"
        )

    base_model = (getattr(model, "metadata", None) or {}).get("source_uri") if model is not None else None
    output_model.metadata.update(
        model_metadata(
            output_model.path,
            base_model=base_model or parsed.model_uri or None,
            trainjob=str(outcome.ref),
            runtime=outcome.runtime,
            trainer_api=outcome.api_version,
            workspace_path=plan.paths.get("output_model") if plan.stage_out else None,
        )
    )
    if files == 0:
        output_model.metadata["empty"] = True
    final, best = outcome.metrics.final(), outcome.metrics.best()
    for name, value in sorted(final.items()):
        if _finite(value):
            metrics.log_metric(name, float(value))
    for name, value in sorted(best.items()):
        if _finite(value) and value != final.get(name):
            metrics.log_metric(f"best_{name}", float(value))
    data = outcome_data(outcome, backend="local" if local else "kubernetes", extra={
        "output model": f"{output_model.metadata.get('weights')} weights, {output_model.metadata.get('format')}, {files} files",
        "base model": base_model or parsed.model_uri or "",
    })
    Path(report.path).parent.mkdir(parents=True, exist_ok=True)
    Path(report.path).write_text(render_html(data), encoding="utf-8")
    return outcome


def exit_on_error(func: Callable[[], Any]) -> Any:
    """Run ``func``; on a :class:`~kfp_trainer.errors.KfpTrainerError` print it and exit with its code."""
    from .errors import KfpTrainerError

    try:
        return func()
    except KfpTrainerError as e:
        print(f"[kfp-trainer] error: {e}", file=sys.stderr, flush=True)
        raise SystemExit(e.exit_code) from None


# --------------------------------------------------------------------------- initializers


def run_initializer(*, uri: str, kind: str, output: Any, ignore_patterns: list[str] | None = None) -> dict[str, Any]:
    """Fetch ``uri`` into the output artifact and describe it in the artifact's metadata."""
    from .storage import fetch, redact

    started = time.monotonic()
    log(f"fetching {kind} {redact(uri)}")
    info = fetch(uri, output.path, kind=kind, ignore_patterns=ignore_patterns)
    info["fetch_seconds"] = round(time.monotonic() - started, 2)
    if kind == "model":
        info.update(model_metadata(output.path, base_model=info["source_uri"]))
    else:
        splits = sorted(p.stem for p in Path(output.path).glob("*.jsonl"))
        if splits:
            info["splits"] = ",".join(splits)
    output.metadata.update(info)
    log(f"fetched {info['files']} files, {info['bytes']} bytes in {info['fetch_seconds']} s")
    return info


# --------------------------------------------------------------------------- evaluate


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
    from .metrics import lower_is_better

    value = candidate.get(metric)
    if not _finite(value):
        return False, f"{metric} missing or not a number in the candidate's metrics"
    if not baseline or not _finite(baseline.get(metric)):
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
    values = {k: v for k, v in (getattr(artifact, "metadata", None) or {}).items() if _finite(v)}
    if values:
        return values
    path = Path(str(getattr(artifact, "path", "") or ""))
    if path.is_file():
        try:
            data = json.loads(path.read_text())
        except ValueError:
            return {}
        if isinstance(data, dict):
            return {k: v for k, v in data.items() if _finite(v)}
    return {}
