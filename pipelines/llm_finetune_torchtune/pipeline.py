# ruff: noqa: D417 - KFP takes output descriptions from Returns.
"""LLM fine-tuning with the Kubeflow Trainer's torchtune runtimes (its "LLM trainer").

One TrainJob does the fine-tune the way the kubeflow SDK's ``BuiltinTrainer`` does it: the
runtime's own dataset and model initializers fetch ``dataset_uri`` and ``model_uri`` into the
job's volume, and its ``tune run`` command trains with the pipeline's settings as overrides.
Around it, the pipeline evaluates the base model and the fine-tuned one on held-out examples
and gates on the improvement. A retried fine-tune (``set_retry``) resumes from the last epoch
checkpoint the failed TrainJob left on the workspace.

The defaults fine-tune ``builtin://models/tiny-qwen2.5`` (a 2-layer model of the Qwen 2.5
architecture, built offline) on ``builtin://datasets/instruct-sums`` with the
``torchtune-qwen2.5-1.5b`` runtime's own ``full_finetune_distributed`` recipe, so the same
pipeline runs

* on a cluster with Kubeflow Trainer v2.2+ and KFP 2.15+: upload ``pipeline.yaml`` and set
  ``dataset_uri``/``model_uri`` to ``hf://`` or ``s3://`` sources (credentials from Kubernetes
  Secrets by name) and ``learning_rate`` to one for a real model;
* on a laptop: ``kfp-trainer run pipelines/llm_finetune_torchtune --local`` (the local backend
  runs the runtime's tune command on two CPU ranks), in about two minutes on two cores.
"""

from typing import Any

from kfp import dsl, kubernetes

from kfp_trainer.components import dataset_initializer, evaluate_model, model_initializer, torchtune_finetune, workspace_config

PIPELINE_NAME = "llm-finetune-torchtune"
# Defaults of the pipeline's parameters (what `kfp-trainer run` passes unless told otherwise).
PARAMS: dict[str, Any] = {
    "runtime": "torchtune-qwen2.5-1.5b",
    "dataset_uri": "builtin://datasets/instruct-sums",
    "model_uri": "builtin://models/tiny-qwen2.5",
    "dataset_path": "data",
    "dataset_source": "parquet",
    "method": "full",
    "epochs": 1,
    "batch_size": 4,
    "learning_rate": 3e-3,  # for the tiny model; real models fine-tune at about 2e-5
    "seed": 7,  # a fixed seed: a rerun (or a resumed retry) trains the same
    "dtype": "",  # the runtime config's (bf16); local mode trains in fp32 on CPUs whatever this says
    "eval_examples": 64,
    "min_improvement": 0.2,
    "backend": "auto",
    # Cluster only. Credentials by Secret name: the TrainJob's initializers get initializer_secret as env
    # (keys ACCESS_TOKEN for hf://; ACCESS_KEY_ID, SECRET_ACCESS_KEY for s3://; "" for none); the
    # pipeline's own data and base-model steps get HF_TOKEN and AWS_* from hf_secret/s3_secret if they exist.
    "initializer_secret": "",
    "hf_secret": "hf-credentials",
    "s3_secret": "s3-credentials",
    "gpus_per_node": 2,
}
# Retries of the fine-tune (a KFP retry count is fixed when the pipeline is compiled).
RETRIES = 2
# What each task is, for the summary `kfp-trainer run` prints.
TASK_LABELS = {"evaluate-model": "base model", "evaluate-model-2": "fine-tuned model", "torchtune-finetune": "TrainJob"}
# The figure `kfp-trainer run` ends with: held-out loss before and after the fine-tune.
COMPARE = {"metric": "loss", "before": "evaluate-model", "after": "evaluate-model-2"}


def use_credentials(task: Any, hf_secret: Any, s3_secret: Any) -> Any:
    """Hugging Face and S3 credentials from Kubernetes Secrets (by reference, optional) as the task's env."""
    kubernetes.use_secret_as_env(task, secret_name=hf_secret, secret_key_to_env={"HF_TOKEN": "HF_TOKEN"}, optional=True)
    s3_keys = {k: k for k in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL", "AWS_DEFAULT_REGION")}
    kubernetes.use_secret_as_env(task, secret_name=s3_secret, secret_key_to_env=s3_keys, optional=True)
    return task


@dsl.pipeline(
    name=PIPELINE_NAME,
    description="Fine-tune an LLM with a Kubeflow Trainer torchtune runtime and its own initializers; evaluate and gate.",
    pipeline_config=workspace_config("20Gi"),
)
def pipeline(
    runtime: str = PARAMS["runtime"],
    dataset_uri: str = PARAMS["dataset_uri"],
    model_uri: str = PARAMS["model_uri"],
    dataset_path: str = PARAMS["dataset_path"],
    dataset_source: str = PARAMS["dataset_source"],
    method: str = PARAMS["method"],
    epochs: int = PARAMS["epochs"],
    batch_size: int = PARAMS["batch_size"],
    learning_rate: float = PARAMS["learning_rate"],
    seed: int = PARAMS["seed"],
    dtype: str = PARAMS["dtype"],
    eval_examples: int = PARAMS["eval_examples"],
    min_improvement: float = PARAMS["min_improvement"],
    backend: str = PARAMS["backend"],
    initializer_secret: str = PARAMS["initializer_secret"],
    hf_secret: str = PARAMS["hf_secret"],
    s3_secret: str = PARAMS["s3_secret"],
    gpus_per_node: int = PARAMS["gpus_per_node"],
):
    """Held-out data and base model -> baseline eval -> torchtune fine-tune (TrainJob) -> eval -> gate."""
    data = use_credentials(dataset_initializer(uri=dataset_uri).set_display_name("held-out data"), hf_secret, s3_secret)
    base = use_credentials(model_initializer(uri=model_uri).set_display_name("base model"), hf_secret, s3_secret)
    base_eval = evaluate_model(
        model=base.outputs["model"], dataset=data.outputs["dataset"], max_examples=eval_examples
    ).set_display_name("evaluate base model")
    tune = torchtune_finetune(
        runtime=runtime,
        dataset_uri=dataset_uri,
        dataset_secret=initializer_secret,
        dataset_path=dataset_path,
        dataset_source=dataset_source,
        model_uri=model_uri,
        model_secret=initializer_secret,
        method=method,
        epochs=epochs,
        batch_size=batch_size,
        learning_rate=learning_rate,
        seed=seed,
        dtype=dtype,
        resources_per_node={"gpu": gpus_per_node},
        backend=backend,
    ).set_display_name("fine-tune (torchtune TrainJob)")
    tune.set_retry(num_retries=RETRIES)  # a retry resumes from the last epoch checkpoint on the workspace
    tune.after(base_eval)  # the baseline first, so the two do not share the CPU locally
    evaluate_model(
        model=tune.outputs["output_model"],
        dataset=data.outputs["dataset"],
        max_examples=eval_examples,
        baseline=base_eval.outputs["metrics"],
        gate_metric="loss",
        min_improvement=min_improvement,
    ).set_display_name("evaluate fine-tuned model")
