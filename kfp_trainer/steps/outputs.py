"""The stages of a ``train_job`` step after its TrainJob succeeded: the model out, its metadata, metrics, the report.

Each takes what the stages before it produced (:mod:`.train_job`): the path plan, the trainer's
context, the prepared job and the launcher's outcome.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

from ..errors import UserError
from .common import copy_dir, dir_stats, finite, log, model_metadata
from .step_types import StepArtifacts, TrainerContext, TypedTrainer


def copy_out(plan: Any, ctx: TrainerContext, trainer: TypedTrainer | None, outcome: Any) -> int:
    """After success: the trained model into the output artifact. Returns its file count."""
    if plan.stage_out:
        log(f"copying the trained model {plan.stage_out[0]} -> output artifact")
        copy_dir(plan.stage_out[0], plan.stage_out[1])
    if trainer is not None:
        trainer.collect(ctx, outcome)
    files, _ = dir_stats(ctx.output_model.path)
    if "output_model" in plan.used and files == 0:
        raise UserError(
            f"TrainJob {outcome.ref} succeeded but wrote nothing to {{output_model}} ({plan.paths.get('output_model')}): "
            "the trainer must save the model there (rank 0)"
        )
    return files


def _base_model(ctx: TrainerContext, job: Any) -> str:
    source = (getattr(ctx.model, "metadata", None) or {}).get("source_uri") if ctx.model is not None else None
    return source or job.inputs.model_uri or ""


def _dataset(ctx: TrainerContext, job: Any) -> str:
    source = (getattr(ctx.dataset, "metadata", None) or {}).get("source_uri") if ctx.dataset is not None else None
    return source or job.inputs.dataset_uri or ""


def record_model(output_model: Any, job: Any, outcome: Any, plan: Any, ctx: TrainerContext, files: int) -> None:
    """The output model's metadata: what it is, where it came from (base model, dataset), which TrainJob made it."""
    known = {
        "base_model": _base_model(ctx, job) or None,
        "dataset": _dataset(ctx, job) or None,
        "trainjob": str(outcome.ref),
        "runtime": outcome.runtime,
        "trainer_api": outcome.api_version,
        "workspace_path": plan.paths.get("output_model") if plan.stage_out else None,
        **ctx.metadata,
    }
    output_model.metadata.update(model_metadata(output_model.path, **known))
    if files == 0:
        output_model.metadata["empty"] = True


def log_metrics(metrics: Any, outcome: Any) -> None:
    """The trainer's final and best metrics, and the seconds queued, starting and running."""
    final, best = outcome.metrics.final(), outcome.metrics.best()
    for name, value in sorted(final.items()):
        if finite(value):
            metrics.log_metric(name, float(value))
    for name, value in sorted(best.items()):
        if finite(value) and value != final.get(name):  # best() holds scores only
            metrics.log_metric(f"best_{name}", float(value))
    for state, seconds in outcome.times.items():  # where the step's time went: queued, starting, running
        metrics.log_metric(f"{state}_seconds", round(float(seconds), 1))


def write_report(artifacts: StepArtifacts, job: Any, outcome: Any, ctx: TrainerContext, files: int, *, local: bool) -> None:
    """The step's HTML report."""
    from ..report import outcome_data, render_html

    meta = artifacts.output_model.metadata
    rows = {
        "output model": f"{meta.get('weights')} weights, {meta.get('format')}, {files} files",
        "base model": _base_model(ctx, job),
        **ctx.report,
    }
    resumed = meta.get("resumed_from_step")
    if resumed and "resumed" not in rows:  # our trainers record the checkpoint a retried job continued from
        rows["resumed"] = f"from the checkpoint at step {resumed} of an earlier try"
    report_uri = getattr(artifacts.report, "uri", "") or ""  # the report links to itself in KFP's UI (report._full_size)
    data = outcome_data(outcome, backend="local" if local else "kubernetes", extra=rows, report_uri=report_uri, tables=ctx.tables)
    Path(artifacts.report.path).parent.mkdir(parents=True, exist_ok=True)
    Path(artifacts.report.path).write_text(render_html(data), encoding="utf-8")
