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

import base64
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
from .redaction import scrub

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
    for key in ("method", "steps", "train_loss", "world_size", "trainable_params"):
        if key in info:
            meta[key] = info[key]
    meta.update({k: v for k, v in known.items() if v not in (None, "")})
    return scrub(meta)  # e.g. a base model URI with credentials, from an upstream artifact


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
    if isinstance(where, str) and where.startswith(shared_root.rstrip("/") + "/") and ".." not in where.split("/") and Path(where).exists():
        return where
    return None


_INTEGRAL = re.compile(r"^[+-]?\d+\.0+$")


def normalize_values(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Command, args and env values as strings, integral numbers without ``.0``.

    KFP hands pipeline parameters placed inside a list or dict input over as JSON numbers
    (``5.0`` for an ``int`` 5, sometimes already as the string ``"5.0"``), which an
    ``int`` command-line option rejects.

    Example:
        >>> normalize_values({"args": ["--steps", 5.0, "--lr", "0.5", "--n", "3.0"], "env": {"N": 2}})
        {'args': ['--steps', '5', '--lr', '0.5', '--n', '3'], 'env': {'N': '2'}}
    """

    def norm(value: Any) -> Any:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        if isinstance(value, (int, float)):
            return str(value)
        if isinstance(value, str) and _INTEGRAL.match(value):
            return value.split(".")[0]
        return value

    out = dict(inputs)
    for key in ("command", "args"):
        if isinstance(out.get(key), list):
            out[key] = [norm(v) for v in out[key]]
    if isinstance(out.get("env"), dict):
        out["env"] = {k: norm(v) for k, v in out["env"].items()}
    return out


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
    from . import cancel

    cancel.install()  # first: from here on a KFP cancel ends with the TrainJob deleted or never created
    from .backends import select_backend
    from .launcher import Launcher, LaunchOptions
    from .report import outcome_data, render_html
    from .spec import TrainJobInputs, check_launch_options
    from .staging import choose_shared_root, plan_paths
    from .taskconfig import merge_task_config

    given = normalize_values({k: v for k, v in inputs.items() if v is not None})
    output_uri = str(getattr(output_model, "uri", "") or "")
    run_id, task_name, pipeline_name = resolve_identity(
        given.get("run_id", ""), given.get("task_name", ""), given.get("pipeline_name", ""), output_uri=output_uri
    )
    given.update({k: v for k, v in (("run_id", run_id), ("task_name", task_name), ("pipeline_name", pipeline_name)) if v})
    if unresolved(workspace_path):
        workspace_path = ""
    check_launch_options(
        start_timeout=start_timeout, run_timeout=run_timeout, logs=logs, backend=backend or "auto",
        workspace_path=workspace_path, delete_after_success=delete_after_success,
    )
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

    def submitted(ref: Any) -> None:
        Path(trainjob_path).parent.mkdir(parents=True, exist_ok=True)
        Path(trainjob_path).write_text(str(ref))

    options = LaunchOptions(
        start_timeout=float(start_timeout or 0), run_timeout=float(run_timeout or 0), logs=str(logs or "0"),
        # the model lives on the shared volume or in the artifact, not in the TrainJob: safe to delete
        delete_after_success=bool(delete_after_success),
    )
    launcher = Launcher(chosen, options, on_submitted=submitted)
    # Every input problem -- the runtime's Trainer version and host-access policy included -- before any copy or write.
    launcher.prepare(parsed)

    for src, dst in plan.stage_in:
        if stage(src, dst):
            log(f"staged {src} -> {dst} (shared with the TrainJob's pods)")
        else:
            log(f"{dst} was staged by an earlier try; using it")
    if plan.stage_out:
        shared_dir(plan.stage_out[0])
    Path(output_model.path).mkdir(parents=True, exist_ok=True)
    outcome = launcher.run(parsed)
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
        if _finite(value) and value != final.get(name):  # best() holds scores only
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
            if _finite(value):
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
        from .trainers.evaluate import evaluate as evaluate_fn
    started = time.monotonic()
    result = evaluate_fn(str(model.path), str(dataset.path), split=split, max_examples=max_examples or None)
    values = {k: float(v) for k, v in result.items() if _finite(v)}
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


# --------------------------------------------------------------------------- trainjob_component

# Runs in the TrainJob: writes the function to a file and runs it (under torchrun on torch runtimes).
BOOTSTRAP = """\
import base64, json, os, sys, tempfile
source, function, arguments, launch = base64.b64decode(sys.argv[1]).decode(), sys.argv[2], sys.argv[3], sys.argv[4]
path = os.path.join(tempfile.mkdtemp(prefix="kfp-trainer-"), "trainjob_function.py")
with open(path, "w") as f:
    f.write(source + "\\n\\nif __name__ == '__main__':\\n    import json, sys\\n    " + function + "(**json.loads(sys.argv[1]))\\n")
if launch == "torchrun" and os.environ.get("PET_NNODES"):
    os.execv(sys.executable, [sys.executable, "-m", "torch.distributed.run", path, arguments])
os.execv(sys.executable, [sys.executable, path, arguments])
"""


def function_command(source: str, function: str, arguments: dict[str, Any], *, torchrun: bool) -> list[str]:
    """The TrainJob command that runs ``function`` from ``source`` with ``arguments``.

    Example:
        >>> function_command("def f(): pass", "f", {}, torchrun=False)[:2]
        ['python', '-c']
    """
    encoded = base64.b64encode(source.encode()).decode()
    return ["python", "-c", BOOTSTRAP, encoded, function, json.dumps(arguments, sort_keys=True), "torchrun" if torchrun else "plain"]
