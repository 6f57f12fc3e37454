# ruff: noqa: D417 - KFP takes output descriptions from Returns.
"""LLM fine-tuning end to end: data -> base model -> baseline eval -> fine-tune -> eval -> gate.

The defaults train ``builtin://models/tiny-char-lm`` (a ~0.45M-parameter character-level
causal LM) on ``builtin://datasets/addition`` (two-digit sums) with ``torchrun`` in a TrainJob
(one node by default; ``num_nodes=2`` trains across two), then promote the model only if exact match on held-out sums improved by
``min_improvement`` (``gate_metric``). Everything is generated offline, so the same pipeline runs

* on a cluster with Kubeflow Trainer: upload ``pipeline.yaml`` (the TrainJob's pods and the
  launcher share the pipeline workspace PVC to hand the model over);
* on a laptop: :func:`run_local` (``kfp.local`` subprocesses plus the local TrainJob
  backend), in about two minutes on two CPU cores.

Swap in ``hf://`` / ``s3://`` sources and a real trainer image for a real model.
"""

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kfp import dsl
from kfp.dsl import Input, Markdown, Metrics, Model, Output

from kfp_trainer.components import (
    BASE_IMAGE,
    TRAINER_IMAGE,
    dataset_initializer,
    evaluate_model,
    model_initializer,
    train_job,
)
from kfp_trainer.trainers import sft

PIPELINE_NAME = "llm-finetune"
# Defaults of the pipeline's parameters (what `kfp-trainer run` passes unless told otherwise).
PARAMS: dict[str, Any] = {
    "dataset_uri": "builtin://datasets/addition",
    "model_uri": "builtin://models/tiny-char-lm",
    "runtime": "torch-distributed",
    "trainer_image": TRAINER_IMAGE,
    "num_nodes": 1,  # fastest on a 2-core laptop; 2+ nodes train the same way across processes
    "max_steps": sft.DEFAULT_MAX_STEPS,
    "time_budget_seconds": 120,  # a cap for slow machines: ~55 s on 2 quiet cores
    "learning_rate": sft.DEFAULT_LEARNING_RATE,
    "eval_examples": 500,
    "gate_metric": "exact_match",
    "min_improvement": 0.2,
    "backend": "auto",
}
# What each task is, for the summary `kfp-trainer run` prints (kfp.local names tasks by component).
TASK_LABELS = {
    "evaluate-model": "base model",
    "evaluate-model-2": "fine-tuned model",
    "train-job": "TrainJob",
}
# The figure `kfp-trainer run` ends with: held-out exact match before and after fine-tuning.
COMPARE = {"metric": "exact_match", "before": "evaluate-model", "after": "evaluate-model-2"}


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def promote_model(model: Input[Model], evaluation: Input[Metrics], baseline: Input[Metrics], card: Output[Markdown]):
    """Writes the model card of a model that passed the evaluation gate.

    Args:
        model: The fine-tuned model.
        evaluation: Its evaluation.
        baseline: The base model's evaluation.

    Returns:
        card: Markdown model card.
    """
    lines = [f"# Model {model.metadata.get('trainjob', '')}", "", "| metric | base model | fine-tuned |", "|---|---:|---:|"]
    for name in sorted(evaluation.metadata):
        lines.append(f"| {name} | {baseline.metadata.get(name, '')} | {evaluation.metadata[name]} |")
    lines += ["", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(model.metadata.items())]
    lines += ["", f"Artifact: `{model.uri}`"]
    with open(card.path, "w") as f:
        f.write("\n".join(lines) + "\n")


@dsl.pipeline(
    name=PIPELINE_NAME,
    description="Fine-tune a causal LM in a Kubeflow Trainer TrainJob and promote it if it beats the base model.",
    pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="10Gi")),
)
def pipeline(
    dataset_uri: str = PARAMS["dataset_uri"],
    model_uri: str = PARAMS["model_uri"],
    runtime: str = PARAMS["runtime"],
    trainer_image: str = PARAMS["trainer_image"],
    num_nodes: int = PARAMS["num_nodes"],
    max_steps: int = PARAMS["max_steps"],
    time_budget_seconds: int = PARAMS["time_budget_seconds"],
    learning_rate: float = PARAMS["learning_rate"],
    eval_examples: int = PARAMS["eval_examples"],
    gate_metric: str = PARAMS["gate_metric"],
    min_improvement: float = PARAMS["min_improvement"],
    backend: str = PARAMS["backend"],
):
    """LLM fine-tune: dataset -> base model -> baseline eval -> TrainJob -> eval -> gate."""
    data = dataset_initializer(uri=dataset_uri).set_display_name("dataset")
    base = model_initializer(uri=model_uri).set_display_name("base model")
    base_eval = evaluate_model(
        model=base.outputs["model"], dataset=data.outputs["dataset"], max_examples=eval_examples
    ).set_display_name("evaluate base model")
    train = train_job(
        runtime=runtime,
        image=trainer_image,
        command=["torchrun", "-m", "kfp_trainer.trainers.sft"],
        args=[
            "--model-dir", "{model}", "--dataset-dir", "{dataset}", "--output-dir", "{output_model}",
            "--max-steps", max_steps, "--time-budget-seconds", time_budget_seconds, "--learning-rate", learning_rate,
        ],
        num_nodes=num_nodes,
        num_proc_per_node="1",
        dataset=data.outputs["dataset"],
        model=base.outputs["model"],
        run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER,
        task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
        pipeline_name=dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
        workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        backend=backend,
    ).set_display_name("fine-tune (TrainJob)")
    train.set_caching_options(False)  # a launcher's inputs rarely change: a cache hit would skip training
    train.after(base_eval)  # the baseline first, so the two runs do not share the CPU locally
    tuned_eval = evaluate_model(
        model=train.outputs["output_model"],
        dataset=data.outputs["dataset"],
        max_examples=eval_examples,
        baseline=base_eval.outputs["metrics"],
        gate_metric=gate_metric,
        min_improvement=min_improvement,
    ).set_display_name("evaluate fine-tuned model")
    with dsl.If(tuned_eval.outputs["Output"] == True, name="improved"):  # noqa: E712 - a KFP condition, not a Python test
        promote_model(
            model=train.outputs["output_model"], evaluation=tuned_eval.outputs["metrics"], baseline=base_eval.outputs["metrics"]
        ).set_display_name("promote")


def run_local(params: dict | None = None, *, workdir: str | None = None) -> dict:
    """Run the pipeline on this machine with ``kfp.local`` and the local TrainJob backend.

    ``kfp.local`` deletes its workspace directory when the run ends, so a fresh one is made
    under ``workdir`` for each run; artifacts stay under ``<workdir>/pipeline-root``.

    Args:
        params: Pipeline parameters overriding :data:`PARAMS`.
        workdir: Where to keep the run's files (default: a new temporary directory).

    Returns:
        ``{"outputs": <task outputs>, "pipeline_root": <path>, "workdir": <path>}``.
    """
    from kfp import local

    root = Path(workdir or tempfile.mkdtemp(prefix="kfp-trainer-demo-")).resolve()
    root.mkdir(parents=True, exist_ok=True)
    workspace = Path(tempfile.mkdtemp(prefix="workspace-", dir=root))
    os.environ.setdefault("KFP_TRAINER_BACKEND", "local")
    os.environ.setdefault("KFP_TRAINER_LOCAL_ROOT", str(root / "trainjobs"))
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(root / "pipeline-root"),
        workspace_root=str(workspace),
    )
    arguments = {**PARAMS, **(params or {})}
    try:
        task = pipeline(**arguments)
    finally:
        shutil.rmtree(workspace, ignore_errors=True)
    return {"outputs": getattr(task, "outputs", {}), "pipeline_root": str(root / "pipeline-root"), "workdir": str(root)}
