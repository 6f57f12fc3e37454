# ruff: noqa: D417 - KFP takes output descriptions from Returns.
"""Reinforcement learning from a verifiable reward: dataset -> short SFT -> GRPO -> held-out exact match -> gate -> registry.

The defaults start from ``builtin://models/tiny-char-lm`` (a ~0.45M-parameter character-level
causal LM) and ``builtin://datasets/addition`` (two-digit sums, ``"12+7="`` -> ``"19"``, with 500
held-out test sums). A short SFT (``trl_finetune(method="sft")``) teaches the model the answer's
form and some sums; GRPO (``trl_finetune(method="grpo")``) then samples ``num_generations``
answers per prompt and learns from a reward a program checks exactly: :func:`exact_sum`, a plain
Python function of this file, which reads the two numbers from the prompt itself. It is shipped
into the TrainJob as source, checked when the pipeline is built. ``evaluate_model`` measures
held-out exact match after SFT and after GRPO; the GRPO model is promoted only if it beat the SFT
model by ``min_improvement``, and registered in MLflow (alias ``champion``) when
``registered_model`` is set. Everything is generated offline, so the same pipeline runs

* on a cluster with Kubeflow Trainer, ``deploy/trl-runtime.yaml`` installed, and KFP 2.15+:
  upload ``pipeline.yaml`` (the TrainJobs' pods and the launchers share the pipeline workspace;
  Hugging Face and S3 credentials come from Kubernetes Secrets by reference);
* on a laptop: :func:`run_local` (``kfp.local`` subprocesses plus the local TrainJob backend).

For a real model, swap in ``hf://`` / ``s3://`` sources, a dataset with a ``prompt`` column and
the reference your reward reads, and GPU settings (``use_vllm`` for fast generation).
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
    evaluate_model,
    model_initializer,
    register_model,
    reward,
    trl_finetune,
    workspace_config,
)

PIPELINE_NAME = "llm-grpo"
# Defaults of the pipeline's parameters (what `kfp-trainer run` passes unless told otherwise).
PARAMS: dict[str, Any] = {
    "dataset_uri": "builtin://datasets/addition",
    "model_uri": "builtin://models/tiny-char-lm",
    "runtime": "kfp-trainer-trl",
    # A short SFT: 400 steps of 64 sums leave the model right on about a quarter of the held-out sums (seed 0), room to improve.
    "sft_max_steps": 400,
    "sft_learning_rate": 0.002,
    "sft_batch_size": 64,
    "sft_seed": 0,
    # GRPO: 32 prompts x 16 sampled answers per step; small batches or learning rates of 5e-4 and up wreck a model this small.
    "grpo_max_steps": 200,
    "grpo_learning_rate": 0.0002,
    "num_generations": 16,
    "grpo_batch_size": 512,
    "max_completion_length": 5,
    "temperature": 1.0,
    "seed": 0,
    "eval_examples": 500,
    "gate_metric": "exact_match",
    "min_improvement": 0.05,  # five points of held-out exact match over the SFT model
    "backend": "auto",
    # The MLflow registered model the approved model becomes a version of (alias "champion"); "" registers nothing.
    "registered_model": "",
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
    "trl-finetune-2": "GRPO TrainJob",
    "evaluate-model": "SFT model",
    "evaluate-model-2": "GRPO model",
    "promote-model": "approved model",
    "register-model": "registered version",
}
# The figure `kfp-trainer run` ends with: held-out exact match after SFT and after GRPO.
COMPARE = {"metric": "exact_match", "before": "evaluate-model", "after": "evaluate-model-2"}


def exact_sum(completions, prompts, **kwargs):
    """1.0 when the completion is the sum the prompt asks for (``"12+7="`` -> ``"19"``), else 0.0.

    A verifiable reward: the answer is computed from the prompt, no reference column needed. It
    runs in the TrainJob, from this source alone, so it imports what it uses inside.
    """
    import re

    rewards = []
    for prompt, completion in zip(prompts, completions, strict=True):
        numbers = [int(n) for n in re.findall(r"\d+", prompt)]
        rewards.append(1.0 if len(numbers) == 2 and completion.strip() == str(sum(numbers)) else 0.0)
    return rewards


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def promote_model(
    model: Input[Model],
    evaluation: Input[Metrics],
    baseline: Input[Metrics],
    approved_model: Output[Model],
    card: Output[Markdown],
):
    """Hands on a GRPO model that passed the gate as the approved model, with its card.

    Args:
        model: The GRPO model.
        evaluation: Its evaluation.
        baseline: The SFT model's evaluation.

    Returns:
        approved_model: A copy of the model, with metadata approved=True and its evaluation.
        card: Markdown model card: the evaluation next to the SFT model's, and the model's metadata.
    """
    import shutil

    shutil.copytree(model.path, approved_model.path, dirs_exist_ok=True)
    approved_model.metadata.update(model.metadata)
    approved_model.metadata.update({"approved": True, "source_model": model.uri})
    approved_model.metadata.update({f"eval_{k}": v for k, v in evaluation.metadata.items() if isinstance(v, (int, float))})
    lines = [f"# Model {model.metadata.get('trainjob', '')}", "", "| metric | SFT model | GRPO model |", "|---|---:|---:|"]
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
    task.set_cpu_limit(cpu).set_memory_limit(memory)
    task.set_accelerator_type(accelerator_type).set_accelerator_limit(accelerators)  # no GPU while the type is ""
    return task


@dsl.pipeline(
    name=PIPELINE_NAME,
    description="Short SFT then GRPO with a verifiable reward (TRL in Kubeflow Trainer TrainJobs); promote the GRPO model "
    "if its held-out exact match beats the SFT model's.",
    pipeline_config=workspace_config("10Gi"),
)
def pipeline(
    dataset_uri: str = PARAMS["dataset_uri"],
    model_uri: str = PARAMS["model_uri"],
    runtime: str = PARAMS["runtime"],
    sft_max_steps: int = PARAMS["sft_max_steps"],
    sft_learning_rate: float = PARAMS["sft_learning_rate"],
    sft_batch_size: int = PARAMS["sft_batch_size"],
    sft_seed: int = PARAMS["sft_seed"],
    grpo_max_steps: int = PARAMS["grpo_max_steps"],
    grpo_learning_rate: float = PARAMS["grpo_learning_rate"],
    num_generations: int = PARAMS["num_generations"],
    grpo_batch_size: int = PARAMS["grpo_batch_size"],
    max_completion_length: int = PARAMS["max_completion_length"],
    temperature: float = PARAMS["temperature"],
    seed: int = PARAMS["seed"],
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
    """GRPO: dataset -> base model -> SFT (TrainJob) -> eval -> GRPO (TrainJob) -> eval -> gate -> approved model (-> registry)."""
    data = use_credentials(dataset_initializer(uri=dataset_uri).set_display_name("dataset"), hf_secret, s3_secret)
    base = use_credentials(model_initializer(uri=model_uri).set_display_name("base model"), hf_secret, s3_secret)
    sft = trl_finetune(
        method="sft", model=base.outputs["model"], dataset=data.outputs["dataset"], runtime=runtime, max_steps=sft_max_steps,
        learning_rate=sft_learning_rate, per_device_train_batch_size=sft_batch_size, seed=sft_seed, extra_args=["--warmup_steps", "30"],
        num_proc_per_node="1", backend=backend,
    ).set_display_name("short SFT (TRL TrainJob)")  # fmt: skip
    on_nodes(use_credentials(sft, hf_secret, s3_secret), cpu_per_node, memory_per_node, accelerator_type, accelerators_per_node)
    sft_eval = evaluate_model(
        model=sft.outputs["output_model"], dataset=data.outputs["dataset"], max_examples=eval_examples
    ).set_display_name("evaluate SFT model")
    grpo = trl_finetune(
        method="grpo", model=sft.outputs["output_model"], dataset=data.outputs["dataset"], runtime=runtime,
        rewards=[reward(exact_sum)], num_generations=num_generations, per_device_train_batch_size=grpo_batch_size,
        max_completion_length=max_completion_length, temperature=temperature, max_steps=grpo_max_steps,
        learning_rate=grpo_learning_rate, logging_steps=5, save_steps=50, seed=seed, extra_args=["--lr_scheduler_type", "constant"],
        num_proc_per_node="1", backend=backend,
    ).set_display_name("GRPO (TRL TrainJob)")  # fmt: skip
    on_nodes(use_credentials(grpo, hf_secret, s3_secret), cpu_per_node, memory_per_node, accelerator_type, accelerators_per_node)
    grpo.after(sft_eval)  # one at a time, so they do not share the CPU locally
    grpo_eval = evaluate_model(
        model=grpo.outputs["output_model"], dataset=data.outputs["dataset"], max_examples=eval_examples,
        baseline=sft_eval.outputs["metrics"], gate_metric=gate_metric, min_improvement=min_improvement,
    ).set_display_name("evaluate GRPO model")  # fmt: skip
    with dsl.If(grpo_eval.outputs["Output"] == True, name="improved"):  # noqa: E712 - a KFP condition, not a Python test
        promoted = promote_model(
            model=grpo.outputs["output_model"], evaluation=grpo_eval.outputs["metrics"], baseline=sft_eval.outputs["metrics"]
        ).set_display_name("promote")
        with dsl.If(registered_model != "", name="registry"):
            register_model(
                model=promoted.outputs["approved_model"], model_name=registered_model, metrics=grpo_eval.outputs["metrics"],
                gate_passed=grpo_eval.outputs["Output"], alias="champion",
            ).set_display_name("register (MLflow)")


def run_local(params: dict | None = None, *, workdir: str | None = None) -> dict:
    """Run the pipeline on this machine with ``kfp.local`` and the local TrainJob backend.

    Args:
        params: Pipeline parameters overriding :data:`PARAMS`.
        workdir: Where to keep the run's files (default: a new temporary directory).

    Returns:
        ``{"outputs": <task outputs>, "pipeline_root": <path>, "workdir": <path>}``.
    """
    from kfp import local

    root = Path(workdir or tempfile.mkdtemp(prefix="kfp-trainer-grpo-")).resolve()
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
