"""Run-time work of the ``train_job`` component, and the mechanism the typed trainers build on.

:func:`run_train_job` runs one TrainJob for a step: identity, task settings, paths on the shared
volume, launch, outputs. A typed trainer (:class:`TypedTrainer`: the torchtune fine-tune of
:mod:`.finetune`, the Python function of :mod:`.function`) plugs into it: once the runtime is
known it fills in the TrainJob inputs, and once the job succeeded it hands on the model.
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from .. import cancel, naming
from ..errors import InvalidSpecErrors
from ..spec.inputs import normalize_values
from .common import (
    log,
    resolve_identity,
    resolve_scope,
    shared_dir,
    stage,
    unresolved,
)


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


@dataclass
class TrainerContext:
    """Where a typed trainer's TrainJob runs, for :class:`TypedTrainer` hooks.

    ``inputs`` are the TrainJob inputs so far (the component's, merged with the task's
    settings); ``shared_root`` is the volume shared with the TrainJob's pods (cluster only);
    ``key`` names this task's folder on it (stable across retries of the step); ``local``
    tells the local backend. Hooks add report rows to ``report`` and model metadata to
    ``metadata``.
    """

    backend: Any
    runtime: Any
    inputs: dict[str, Any]
    local: bool
    shared_root: str | None
    key: str
    workspace_path: str
    output_model: Any
    dataset: Any = None
    model: Any = None
    report: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)


class TypedTrainer(Protocol):
    """A trainer described by typed settings instead of a command (see the module docstring)."""

    def identity(self) -> dict[str, Any]:
        """The settings that make two tries the same job (part of the task's folder name)."""

    def configure(self, ctx: TrainerContext) -> dict[str, Any]:
        """TrainJob inputs for the resolved runtime (``ctx.runtime``); reads only, writes nothing.

        ``{dataset}``, ``{model}`` and ``{output_model}`` in the returned command, args or env
        are planned as for ``train_job`` (staged on the shared volume, copied out after success).
        """

    def finalize(self, ctx: TrainerContext, paths: dict[str, str]) -> dict[str, Any]:
        """Last TrainJob input changes, once the placeholders' paths (``paths``) are known."""

    def before_launch(self, ctx: TrainerContext) -> None:
        """Writes (folders on the shared volume) once every input has been checked."""

    def collect(self, ctx: TrainerContext, outcome: Any) -> None:
        """After success: fill ``ctx.output_model`` and add metrics, metadata and report rows."""


# Integer inputs that mean "unset" at these values (kfp.local cannot hand None to an int input).
_UNSET = {"num_nodes": 0, "active_deadline_seconds": 0, "termination_grace_period_seconds": -1}
#: The ``train_job`` component's inputs that are the launcher's own options, not TrainJob inputs.
LAUNCH_OPTIONS = ("backend", "workspace_path", "start_timeout", "queue_timeout", "run_timeout", "logs", "delete_after_success")
#: The inputs that say where the step tracks its training (:mod:`kfp_trainer.tracking`).
TRACKING_OPTIONS = ("mlflow_tracking_uri", "mlflow_experiment")
_NOT_TRAINJOB = {"output_model", "metrics", "report", "trainjob", "dataset", "model", "task_config", *LAUNCH_OPTIONS, *TRACKING_OPTIONS}


MISSING_CONTEXT = (
    "warning: this task did not fill in its run context (run id, task name, workspace) -- was the component YAML loaded "
    "with kfp.components.load_component_from_*? That loader also drops the TaskConfig passthroughs (resources, "
    "tolerations, volumes then miss the TrainJob): load it with kfp_trainer.components.load_component_from_file/url"
)


def train_job_inputs(values: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainJob inputs among a ``train_job`` task's input values (``None`` = unset).

    The component passes its ``locals()``; the same mapping checks literal arguments when a
    pipeline is built.

    Example:
        >>> train_job_inputs({"runtime": "torch-distributed", "num_nodes": 0, "logs": "all", "termination_grace_period_seconds": 30})
        {'runtime': 'torch-distributed', 'num_nodes': None, 'termination_grace_period_seconds': 30}
    """
    return {k: (None if k in _UNSET and v == _UNSET[k] else v) for k, v in values.items() if k not in _NOT_TRAINJOB}


@dataclass
class StepArtifacts:
    """The step's input and output artifacts, and the file that gets the TrainJob's ``namespace/name``."""

    output_model: Any
    metrics: Any
    report: Any
    trainjob_path: str
    dataset: Any = None
    model: Any = None

    def write_trainjob(self, ref: Any) -> None:
        """Write ``namespace/name`` to the ``trainjob`` output (as soon as the job is known)."""
        Path(self.trainjob_path).parent.mkdir(parents=True, exist_ok=True)
        Path(self.trainjob_path).write_text(str(ref))


@cancel.entry_point  # first: from here on a KFP cancel ends with the TrainJob deleted or never created
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
    queue_timeout: float = 0.0,
    trainer: TypedTrainer | None = None,
    mlflow_tracking_uri: str | None = None,
    mlflow_experiment: str | None = None,
) -> Any:
    """Run one TrainJob for the ``train_job`` component and fill its outputs.

    The stages, in order: identity, launch options, backend and task folder, paths (and the
    typed trainer's inputs), :func:`~kfp_trainer.prepare.prepare` (every check; nothing is
    written before it), staging, launch, copy-out, model metadata, metrics, report.

    Args:
        inputs: The component's TrainJob inputs (``None`` = not set), plus ``task_id``
            (``dsl.PIPELINE_TASK_ID_PLACEHOLDER``), which tells loop iterations apart.
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
        queue_timeout: Seconds the job may wait suspended in its queue; 0 = no limit.
        trainer: A typed trainer that completes the inputs and hands on the model.
        mlflow_tracking_uri: MLflow server to track the training in (else ``MLFLOW_TRACKING_URI``; :mod:`kfp_trainer.tracking`).
        mlflow_experiment: MLflow experiment of the step's own run.

    Returns:
        The launcher's ``Outcome``.
    """
    from ..backends import select_backend
    from ..launcher import Launcher
    from ..prepare import is_local, prepare
    from ..taskconfig import merge_task_config
    from .outputs import copy_out, log_metrics, record_model, write_report

    artifacts = StepArtifacts(output_model, metrics, report, trainjob_path, dataset, model)
    check_tracking(mlflow_tracking_uri, mlflow_experiment)
    given = identify(inputs, output_uri=str(getattr(output_model, "uri", "") or ""))
    workspace_path = "" if unresolved(workspace_path) else workspace_path
    options = launch_options(
        backend=backend, workspace_path=workspace_path, start_timeout=start_timeout, run_timeout=run_timeout,
        queue_timeout=queue_timeout, logs=logs, delete_after_success=delete_after_success,
    )  # fmt: skip
    chosen = (backend_factory or select_backend)(backend or "auto")
    ctx = _context(chosen, merge_task_config(given, task_config), task_key(given, artifacts, trainer), workspace_path, artifacts)
    plan, runtime = plan_inputs(ctx, trainer)
    # Every input problem -- the runtime's Trainer version and host-access policy included -- before any copy or write.
    job = prepare(chosen, _parse(ctx.inputs), runtime=runtime)
    component = type(trainer).__name__ if trainer is not None else "train_job"
    tracking = open_tracking(mlflow_tracking_uri, mlflow_experiment, ctx, given, component)  # after every check
    job = tracking.prepared(job)  # the trainer nodes log into the step's run

    def submitted(ref: Any) -> None:
        artifacts.write_trainjob(ref)
        tracking.submitted(ref, job)

    with tracking.ending():  # a failed step's run ends FAILED, a cancelled one's KILLED
        stage_in(plan, ctx, trainer)
        outcome = Launcher(chosen, options, on_submitted=submitted).run(job)
        artifacts.write_trainjob(outcome.ref)
        files = copy_out(plan, ctx, trainer, outcome)
        record_model(artifacts.output_model, job, outcome, plan, ctx, files)
        artifacts.output_model.metadata.update(tracking.lineage())  # register_model links the version to this run
        log_metrics(artifacts.metrics, outcome)
        write_report(artifacts, job, outcome, ctx, files, local=is_local(chosen))
    tracking.finished(outcome, metrics=dict(getattr(artifacts.metrics, "metadata", None) or {}), report=artifacts.report.path)
    return outcome


def check_tracking(tracking_uri: str | None, experiment: str | None) -> None:
    """The ``mlflow_*`` inputs, with the other input checks (before anything is made)."""
    from ..tracking.settings import check_tracking_inputs

    errors = check_tracking_inputs(None if unresolved(tracking_uri) else tracking_uri, None if unresolved(experiment) else experiment)
    if errors:
        raise InvalidSpecErrors(errors)


def open_tracking(tracking_uri: str | None, experiment: str | None, ctx: TrainerContext, given: Mapping[str, Any], component: str) -> Any:
    """The step's MLflow run (:class:`~kfp_trainer.tracking.step.StepTracking`; disabled when tracking is off)."""
    from ..tracking.step import StepTracking

    identity = {k: str(given.get(k) or "") for k in ("run_id", "task_name", "pipeline_name")}
    identity.update(key=ctx.key, component=component)
    return StepTracking.open(tracking_uri=tracking_uri or None, experiment=experiment or None, env=ctx.inputs.get("env"),
                             identity=identity, say=log)  # fmt: skip


def _parse(inputs: dict[str, Any]) -> Any:
    from ..spec import TrainJobInputs

    return TrainJobInputs.parse(**inputs)


def identify(inputs: Mapping[str, Any], *, output_uri: str) -> dict[str, Any]:
    """The given TrainJob inputs with the run's identity filled in: run id, task, pipeline, loop iteration."""
    given = normalize_values({k: v for k, v in inputs.items() if v is not None})
    if unresolved(given.get("run_id")):
        log(MISSING_CONTEXT)
    run_id, task_name, pipeline_name = resolve_identity(
        given.get("run_id", ""), given.get("task_name", ""), given.get("pipeline_name", ""), output_uri=output_uri
    )
    given.update({k: v for k, v in (("run_id", run_id), ("task_name", task_name), ("pipeline_name", pipeline_name)) if v})
    scope = resolve_scope(given.pop("task_id", None), output_uri=output_uri)
    if scope:  # identical ParallelFor iterations must not share (adopt) one TrainJob
        given["task_id"] = scope
    return given


def launch_options(*, backend: str, workspace_path: str, **limits: Any) -> Any:
    """The launcher's options, checked (time limits, logs, backend, workspace path)."""
    from ..launcher import LaunchOptions
    from ..spec import check_launch_options

    check_launch_options(backend=backend or "auto", workspace_path=workspace_path, **limits)
    return LaunchOptions(
        start_timeout=float(limits["start_timeout"] or 0), run_timeout=float(limits["run_timeout"] or 0),
        queue_timeout=float(limits["queue_timeout"] or 0), logs=str(limits["logs"] or "0"),
        # the model lives on the shared volume or in the artifact, not in the TrainJob: safe to delete
        delete_after_success=bool(limits["delete_after_success"]),
    )  # fmt: skip


def task_key(given: Mapping[str, Any], artifacts: StepArtifacts, trainer: TypedTrainer | None) -> str:
    """This task's folder name on the shared volume: stable across retries, different for other settings."""
    source = json.dumps(given, sort_keys=True, default=str) + "|" + "|".join(
        str(getattr(a, "uri", "") or "") for a in (artifacts.dataset, artifacts.model)
    )
    if trainer is not None:
        source += "|" + json.dumps(trainer.identity(), sort_keys=True, default=str)
    task_name = str(given.get("task_name") or "")
    return f"{naming.label_value(task_name or 'train-job')[:40].strip('-_.') or 'train'}-{naming.digest(source)}"


def _context(backend: Any, merged: dict[str, Any], key: str, workspace_path: str, artifacts: StepArtifacts) -> TrainerContext:
    from ..prepare import is_local
    from ..staging import choose_shared_root

    local = is_local(backend)
    shared_root = None if local else choose_shared_root(workspace_path, merged.get("volume_mounts"), merged.get("volumes"))
    return TrainerContext(
        backend=backend, runtime=None, inputs=merged, local=local, shared_root=shared_root, key=key,
        workspace_path=workspace_path, output_model=artifacts.output_model, dataset=artifacts.dataset, model=artifacts.model,
    )  # fmt: skip


def plan_inputs(ctx: TrainerContext, trainer: TypedTrainer | None) -> tuple[Any, Any]:
    """Complete ``ctx.inputs``: the typed trainer's inputs, then the artifact placeholders' paths.

    Returns the path plan and the runtime when a typed trainer read it (None otherwise:
    :func:`~kfp_trainer.prepare.prepare` reads it).
    """
    from ..staging import plan_paths

    if trainer is not None:
        from .checks import trainjob_errors

        sources = getattr(trainer, "source_inputs", dict)()  # initializer URIs a typed trainer will set
        early = trainjob_errors({**ctx.inputs, **sources}, local=ctx.local)  # the inputs given, before the runtime is read
        if early:
            raise InvalidSpecErrors(early)
        probe = _parse({k: ctx.inputs[k] for k in ("runtime", "runtime_kind", "namespace") if ctx.inputs.get(k)})
        ctx.runtime = ctx.backend.resolve_runtime(probe)
        ctx.inputs.update(trainer.configure(ctx))
    dataset, model = ctx.dataset, ctx.model
    from .checks import placeholder_errors

    # As when the pipeline was built: an unknown placeholder in the user's own command, an input not connected.
    connected = {name for name, artifact in (("dataset", dataset), ("model", model)) if _artifact_path(artifact)}
    errors = placeholder_errors(ctx.inputs, connected=connected, unknown=trainer is None)
    if errors:
        raise InvalidSpecErrors(errors)
    plan = plan_paths(
        ctx.inputs,
        local=ctx.local,
        artifacts={"dataset": _artifact_path(dataset), "model": _artifact_path(model)},
        output_model=str(ctx.output_model.path),
        shared_root=ctx.shared_root,
        key=ctx.key,
        shared_artifacts={n: p for n, a in (("dataset", dataset), ("model", model)) if (p := _shared_copy(a, ctx.shared_root))},
    )
    ctx.inputs.update(plan.values)
    if trainer is not None:
        ctx.inputs.update(trainer.finalize(ctx, dict(plan.paths)))
    return plan, ctx.runtime


def stage_in(plan: Any, ctx: TrainerContext, trainer: TypedTrainer | None) -> None:
    """The writes before the launch: input artifacts onto the shared volume, output folders."""
    for src, dst in plan.stage_in:
        if stage(src, dst):
            log(f"staged {src} -> {dst} (shared with the TrainJob's pods)")
        else:
            log(f"{dst} was staged by an earlier try; using it")
    if plan.stage_out:
        shared_dir(plan.stage_out[0])
    if trainer is not None:
        trainer.before_launch(ctx)
    Path(ctx.output_model.path).mkdir(parents=True, exist_ok=True)
