"""Run-time work of the ``train_job`` component, and the mechanism the typed trainers build on.

:func:`run_train_job` runs one TrainJob for a step, in named stages: identity, launch options,
backend and task folder, :func:`~kfp_trainer.prepare.prepare` (the inputs parsed once, every
check, the runtime read once; nothing is written before it), staging, launch, copy-out, model
metadata, metrics, report. A typed trainer (:class:`~.step_types.TypedTrainer`: the torchtune
fine-tune of :mod:`.finetune`, TRL's of :mod:`.trl`, the Python function of :mod:`.function`)
plugs into it through :class:`StepSetup`: once the runtime is read it completes the inputs, and
once the job succeeded it hands on the model.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any

from .. import naming
from ..errors import InvalidSpecErrors
from ..spec.inputs import normalize_values
from .checks import placeholder_errors
from .common import (
    log,
    resolve_identity,
    resolve_scope,
    shared_dir,
    stage,
    unresolved,
)
from .outputs import copy_out, log_metrics, record_model, write_report
from .step_types import StepArtifacts, StepOptions, TrainerContext, TypedTrainer

if TYPE_CHECKING:
    from ..backends.base import RuntimeInfo
    from ..cancel import Stop
    from ..launcher import LaunchOptions, Outcome
    from ..spec import TrainJobInputs
    from ..staging import PathPlan

_TEXTS = ("command", "args", "env")  # where the artifact placeholders may be
MISSING_CONTEXT = (
    "warning: this task did not fill in its run context (run id, task name, workspace) -- was the component YAML loaded "
    "with kfp.components.load_component_from_*? That loader also drops the TaskConfig passthroughs (resources, "
    "tolerations, volumes then miss the TrainJob): load it with kfp_trainer.components.load_component_from_file/url"
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


def run_train_job(
    inputs: Mapping[str, Any],
    artifacts: StepArtifacts,
    options: StepOptions,
    trainer: TypedTrainer | None = None,
    *,
    stop: Stop | None = None,
) -> Outcome:
    """Run one TrainJob for a launcher step and fill its outputs.

    Args:
        inputs: The component's TrainJob inputs (``None`` = not set), plus ``task_id``
            (``dsl.PIPELINE_TASK_ID_PLACEHOLDER``), which tells loop iterations apart.
        artifacts: The step's artifacts; ``trainjob_path`` gets ``namespace/name`` as soon as it is known.
        options: The launcher's own inputs: backend, time limits, logs, workspace, the task's settings.
        trainer: A typed trainer that completes the inputs and hands on the model.
        stop: The step's stop token (:func:`kfp_trainer.cancel.stopping`): a stop signal ends the
            step with the TrainJob deleted or never created.

    Returns:
        The launcher's ``Outcome``.
    """
    from ..backends import select_backend
    from ..launcher import Launcher
    from ..prepare import prepare
    from ..spec import TrainJobInputs
    from ..taskconfig import merge_task_config

    check_tracking(options.mlflow_tracking_uri, options.mlflow_experiment)
    given = identify(inputs, output_uri=str(getattr(artifacts.output_model, "uri", "") or ""))
    workspace_path = "" if unresolved(options.workspace_path) else options.workspace_path
    launch = launch_options(options, workspace_path)
    backend = select_backend(options.backend or "auto")
    merged = merge_task_config(given, options.task_config)
    ctx = trainer_context(merged, local=backend.local, key=task_key(given, artifacts, trainer), workspace_path=workspace_path,
                          artifacts=artifacts)  # fmt: skip
    setup = StepSetup(ctx, trainer)
    # As when the pipeline was built, first: an unknown placeholder in the given command, an input not connected.
    errors = placeholder_errors(merged, connected=setup.connected)
    if errors:
        raise InvalidSpecErrors(errors)
    parsed = TrainJobInputs.parse(**{**merged, **(trainer.source_inputs() if trainer is not None else {})})
    # Every input problem -- the runtime's Trainer version and host-access policy included -- before any copy or write.
    job = prepare(backend, parsed, trainer=setup, stop=stop)
    component = type(trainer).__name__ if trainer is not None else "train_job"
    tracking = open_tracking(options, job.inputs.env, ctx, given, component)  # after every check
    job = tracking.prepared(job)  # the trainer nodes log into the step's run

    def submitted(ref: Any) -> None:
        artifacts.write_trainjob(ref)
        tracking.submitted(ref, job)

    with tracking.ending():  # a failed step's run ends FAILED, a cancelled one's KILLED
        stage_in(setup.plan, ctx, trainer)
        outcome = Launcher(backend, launch, on_submitted=submitted, stop=stop).run(job)
        artifacts.write_trainjob(outcome.ref)
        files = copy_out(setup.plan, ctx, trainer, outcome)
        record_model(artifacts.output_model, job, outcome, setup.plan, ctx, files)
        artifacts.output_model.metadata.update(tracking.lineage())  # register_model links the version to this run
        log_metrics(artifacts.metrics, outcome)
        write_report(artifacts, job, outcome, ctx, files, local=backend.local)
    tracking.finished(outcome, metrics=dict(getattr(artifacts.metrics, "metadata", None) or {}), report=artifacts.report.path,
                      files=ctx.tracked_files)  # fmt: skip
    return outcome


def check_tracking(tracking_uri: str | None, experiment: str | None) -> None:
    """The ``mlflow_*`` inputs, with the other input checks (before anything is made)."""
    from ..tracking.settings import check_tracking_inputs

    errors = check_tracking_inputs(None if unresolved(tracking_uri) else tracking_uri, None if unresolved(experiment) else experiment)
    if errors:
        raise InvalidSpecErrors(errors)


def open_tracking(options: StepOptions, env: Any, ctx: TrainerContext, given: Mapping[str, Any], component: str) -> Any:
    """The step's MLflow run (:class:`~kfp_trainer.tracking.step.StepTracking`; disabled when tracking is off).

    ``env`` is the prepared TrainJob's env input (the task's and the typed trainer's merged in).
    """
    from ..tracking.step import StepTracking

    identity = {k: str(given.get(k) or "") for k in ("run_id", "task_name", "pipeline_name")}
    identity.update(key=ctx.key, component=component)
    return StepTracking.open(tracking_uri=options.mlflow_tracking_uri or None, experiment=options.mlflow_experiment or None,
                             env=env, identity=identity, say=log)  # fmt: skip


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


def launch_options(options: StepOptions, workspace_path: str) -> LaunchOptions:
    """The launcher's options, checked (time limits, logs, backend, workspace path, metric names)."""
    from ..launcher import LaunchOptions
    from ..spec import check_launch_options

    check_launch_options(
        backend=options.backend or "auto", workspace_path=workspace_path, start_timeout=options.start_timeout,
        run_timeout=options.run_timeout, queue_timeout=options.queue_timeout, logs=options.logs,
        delete_after_success=options.delete_after_success, metric_names=options.metric_names,
    )  # fmt: skip
    return LaunchOptions(
        start_timeout=float(options.start_timeout or 0), run_timeout=float(options.run_timeout or 0),
        queue_timeout=float(options.queue_timeout or 0), logs=str(options.logs or "0"),
        # the model lives on the shared volume or in the artifact, not in the TrainJob: safe to delete
        delete_after_success=bool(options.delete_after_success), metric_names=options.metric_names or "",
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


def trainer_context(merged: Mapping[str, Any], *, local: bool, key: str, workspace_path: str, artifacts: StepArtifacts) -> TrainerContext:
    """Where the step's TrainJob runs: local or not, the volume shared with its pods (from the task's mounts), its folder there."""
    from ..staging import choose_shared_root

    shared_root = None if local else choose_shared_root(workspace_path, merged.get("volume_mounts"), merged.get("volumes"))
    return TrainerContext(
        local=local, shared_root=shared_root, key=key, workspace_path=workspace_path, output_model=artifacts.output_model,
        dataset=artifacts.dataset, model=artifacts.model,
    )  # fmt: skip


class StepSetup:
    """What :func:`~kfp_trainer.prepare.prepare` calls once the runtime is read: the step's part of the inputs.

    The typed trainer's inputs first, then the artifact placeholders' paths (:mod:`kfp_trainer.staging`),
    then the trainer's last changes -- set on the inputs at once, in :meth:`configure` alone.
    The path plan stays here for the staging and the copy-out.
    """

    def __init__(self, ctx: TrainerContext, trainer: TypedTrainer | None) -> None:
        self.ctx = ctx
        self.trainer = trainer
        self.plan: PathPlan | None = None
        #: The input artifacts the step has (``{dataset}`` and ``{model}`` point at them).
        self.connected = {name for name, artifact in (("dataset", ctx.dataset), ("model", ctx.model)) if _artifact_path(artifact)}

    def configure(self, runtime: RuntimeInfo, inputs: TrainJobInputs) -> TrainJobInputs:
        """``inputs`` completed for ``runtime`` (see the class docstring).

        Raises:
            InvalidSpecErrors: A placeholder names an input artifact that is not connected, or
                the typed trainer refuses its settings for this runtime.
            ValidationError: A placeholder needs a volume shared with the TrainJob and there is none.
        """
        from ..spec.placeholders import unconnected_placeholder_errors
        from ..staging import plan_paths

        ctx, trainer = self.ctx, self.trainer
        values = trainer.configure(ctx, runtime, inputs) if trainer is not None else {}
        # The texts given or configured (an args never set stays unset: the job then sends none, as the SDK's does).
        texts = {k: getattr(inputs, k) for k in _TEXTS if k in inputs.model_fields_set}
        texts.update({k: values[k] for k in _TEXTS if k in values})
        # What the trainer added may name an input not connected (the given inputs were checked before the runtime was read).
        errors = unconnected_placeholder_errors(texts, connected=self.connected)
        if errors:
            raise InvalidSpecErrors(errors)
        self.plan = plan_paths(
            texts,
            local=ctx.local,
            artifacts={"dataset": _artifact_path(ctx.dataset), "model": _artifact_path(ctx.model)},
            output_model=str(ctx.output_model.path),
            shared_root=ctx.shared_root,
            key=ctx.key,
            shared_artifacts={n: p for n, a in (("dataset", ctx.dataset), ("model", ctx.model)) if (p := _shared_copy(a, ctx.shared_root))},
        )
        values.update(self.plan.values)
        if trainer is not None:
            values.update(trainer.finalize(ctx, runtime, dict(self.plan.paths)))
        return inputs.updated(**values)


def stage_in(plan: PathPlan | None, ctx: TrainerContext, trainer: TypedTrainer | None) -> None:
    """The writes before the launch: input artifacts onto the shared volume, output folders."""
    for src, dst in plan.stage_in if plan is not None else []:
        if stage(src, dst):
            log(f"staged {src} -> {dst} (shared with the TrainJob's pods)")
        else:
            log(f"{dst} was staged by an earlier try; using it")
    if plan is not None and plan.stage_out:
        shared_dir(plan.stage_out[0])
    if trainer is not None:
        trainer.before_launch(ctx)
    Path(ctx.output_model.path).mkdir(parents=True, exist_ok=True)
