# ruff: noqa: D417 - KFP takes output descriptions from Returns.
"""LLM fine-tuning end to end: data -> base model -> baseline eval -> fine-tune -> eval -> gate.

The defaults train ``builtin://models/tiny-char-lm`` (a ~0.45M-parameter character-level
causal LM) on ``builtin://datasets/addition`` (two-digit sums) with ``torchrun`` in a TrainJob
(one node by default; ``num_nodes=2`` trains across two), then promote the model only if exact match on held-out sums improved by
``min_improvement`` (``gate_metric``). Everything is generated offline, so the same pipeline runs

* on a cluster with Kubeflow Trainer and KFP 2.15+: upload ``pipeline.yaml`` (the TrainJob's
  pods and the launcher share the pipeline workspace PVC, ReadWriteMany, to hand the model
  over; Hugging Face and S3 credentials come from Kubernetes Secrets by reference);
* on a laptop: :func:`run_local` (``kfp.local`` subprocesses plus the local TrainJob
  backend), in about two minutes on two CPU cores.

Swap in ``hf://`` / ``s3://`` sources and a real trainer image for a real model.
"""

import os
import shutil
import tempfile
from pathlib import Path
from typing import Any

from kfp import dsl, kubernetes
from kfp.dsl import Input, Markdown, Metrics, Model, Output

from kfp_trainer.components import (
    BASE_IMAGE,
    TRAINER_IMAGE,
    dataset_initializer,
    evaluate_model,
    model_initializer,
    register_model,
    train_job,
    workspace_config,
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
    # The MLflow registered model the approved model becomes a version of (alias "champion"); "" registers nothing.
    # Needs an MLflow server: MLFLOW_TRACKING_URI (KFP's MLflow plugin sets it on every task) -- docs/mlflow.md.
    "registered_model": "",
    # Cluster only (kfp.local ignores them): credentials by Secret name, resources of each trainer node.
    "hf_secret": "hf-credentials",
    "s3_secret": "s3-credentials",
    "cpu_per_node": "4",
    "memory_per_node": "16Gi",
    "accelerator_type": "",
    "accelerators_per_node": 1,
}
# Secret keys -> environment variables (kubectl create secret generic hf-credentials --from-literal=HF_TOKEN=...).
HF_SECRET_KEYS = {"HF_TOKEN": "HF_TOKEN"}
S3_SECRET_KEYS = {k: k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")}
# What each task is, for the summary `kfp-trainer run` prints (kfp.local names tasks by component).
TASK_LABELS = {
    "evaluate-model": "base model",
    "evaluate-model-2": "fine-tuned model",
    "train-job": "TrainJob",
    "promote-model": "approved model",
    "register-model": "registered version",
}
# The figure `kfp-trainer run` ends with: held-out exact match before and after fine-tuning.
COMPARE = {"metric": "exact_match", "before": "evaluate-model", "after": "evaluate-model-2"}


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def promote_model(
    model: Input[Model],
    evaluation: Input[Metrics],
    baseline: Input[Metrics],
    approved_model: Output[Model],
    card: Output[Markdown],
):
    """Hands on a model that passed the evaluation gate as the approved model, with its card.

    Args:
        model: The fine-tuned model.
        evaluation: Its evaluation.
        baseline: The base model's evaluation.

    Returns:
        approved_model: A copy of the model, with metadata approved=True and its evaluation.
        card: Markdown model card: the evaluation next to the base model's, and the model's metadata.
    """
    import shutil

    shutil.copytree(model.path, approved_model.path, dirs_exist_ok=True)
    approved_model.metadata.update(model.metadata)
    approved_model.metadata.update({"approved": True, "source_model": model.uri})
    approved_model.metadata.update({f"eval_{k}": v for k, v in evaluation.metadata.items() if isinstance(v, (int, float))})
    lines = [f"# Model {model.metadata.get('trainjob', '')}", "", "| metric | base model | fine-tuned |", "|---|---:|---:|"]
    for name in sorted(evaluation.metadata):
        lines.append(f"| {name} | {baseline.metadata.get(name, '')} | {evaluation.metadata[name]} |")
    lines += ["", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(model.metadata.items())]
    lines += ["", f"Approved model: `{approved_model.uri}`"]
    with open(card.path, "w") as f:
        f.write("\n".join(lines) + "\n")


def use_credentials(task: Any, hf_secret: Any, s3_secret: Any) -> Any:
    """Hugging Face and S3 credentials from Kubernetes Secrets, by reference, as the task's env.

    Optional: a missing Secret (or key) leaves the variable unset instead of blocking the pod.
    On a ``train_job`` task the env also reaches the TrainJob's pods (ENV TaskConfig passthrough).
    """
    kubernetes.use_secret_as_env(task, secret_name=hf_secret, secret_key_to_env=HF_SECRET_KEYS, optional=True)
    kubernetes.use_secret_as_env(task, secret_name=s3_secret, secret_key_to_env=S3_SECRET_KEYS, optional=True)
    return task


@dsl.pipeline(
    name=PIPELINE_NAME,
    description="Fine-tune a causal LM in a Kubeflow Trainer TrainJob and promote it if it beats the base model.",
    pipeline_config=workspace_config("10Gi"),
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
    registered_model: str = PARAMS["registered_model"],
    hf_secret: str = PARAMS["hf_secret"],
    s3_secret: str = PARAMS["s3_secret"],
    cpu_per_node: str = PARAMS["cpu_per_node"],
    memory_per_node: str = PARAMS["memory_per_node"],
    accelerator_type: str = PARAMS["accelerator_type"],
    accelerators_per_node: int = PARAMS["accelerators_per_node"],
):
    """LLM fine-tune: dataset -> base model -> baseline eval -> TrainJob -> eval -> gate -> approved model (-> registry)."""
    data = use_credentials(dataset_initializer(uri=dataset_uri).set_display_name("dataset"), hf_secret, s3_secret)
    base = use_credentials(model_initializer(uri=model_uri).set_display_name("base model"), hf_secret, s3_secret)
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
        backend=backend,
    ).set_display_name("fine-tune (TrainJob)")
    train.after(base_eval)  # the baseline first, so the two runs do not share the CPU locally
    # Each trainer node's resources: they go to the TrainJob (RESOURCES passthrough), not to this launcher's pod.
    train.set_cpu_limit(cpu_per_node).set_memory_limit(memory_per_node)
    train.set_accelerator_type(accelerator_type).set_accelerator_limit(accelerators_per_node)  # no GPU while the type is ""
    use_credentials(train, hf_secret, s3_secret)
    tuned_eval = evaluate_model(
        model=train.outputs["output_model"],
        dataset=data.outputs["dataset"],
        max_examples=eval_examples,
        baseline=base_eval.outputs["metrics"],
        gate_metric=gate_metric,
        min_improvement=min_improvement,
    ).set_display_name("evaluate fine-tuned model")
    with dsl.If(tuned_eval.outputs["Output"] == True, name="improved"):  # noqa: E712 - a KFP condition, not a Python test
        promoted = promote_model(
            model=train.outputs["output_model"], evaluation=tuned_eval.outputs["metrics"], baseline=base_eval.outputs["metrics"]
        ).set_display_name("promote")
        with dsl.If(registered_model != "", name="registry"):
            register_model(
                model=promoted.outputs["approved_model"], model_name=registered_model, metrics=tuned_eval.outputs["metrics"],
                gate_passed=tuned_eval.outputs["Output"], alias="champion",
            ).set_display_name("register (MLflow)")


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
