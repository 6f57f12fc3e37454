# ruff: noqa: UP045, D417 - KFP reads Optional[...] (not X | None) and takes output descriptions from Returns.
"""The ``torchtune_finetune`` component: fine-tune an LLM with a Kubeflow Trainer torchtune runtime.

Only the standard library and ``kfp`` are imported here; the work is done by
:func:`kfp_trainer.steps.finetune.run_torchtune_finetune` inside the component's container.
"""

from typing import Optional

from kfp import dsl
from kfp.dsl import HTML, Metrics, Model, Output, OutputPath

from ._image import BASE_IMAGE
from .calls import with_run_context
from .train_job import TASK_CONFIG_PASSTHROUGHS


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False, task_config_passthroughs=TASK_CONFIG_PASSTHROUGHS)
def torchtune_finetune(
    output_model: Output[Model],
    metrics: Output[Metrics],
    report: Output[HTML],
    trainjob: OutputPath(str),
    runtime: str = "torchtune-qwen2.5-1.5b",
    runtime_kind: str = "ClusterTrainingRuntime",
    dataset_uri: Optional[str] = None,
    dataset_secret: Optional[str] = None,
    dataset_options: Optional[dict] = None,
    dataset_path: Optional[str] = None,
    model_uri: Optional[str] = None,
    model_secret: Optional[str] = None,
    model_options: Optional[dict] = None,
    method: str = "full",
    dtype: Optional[str] = None,
    batch_size: int = 0,
    epochs: int = 0,
    loss: Optional[str] = None,
    learning_rate: Optional[float] = None,
    seed: int = -1,
    lora_rank: int = 0,
    lora_alpha: Optional[float] = None,
    lora_dropout: Optional[float] = None,
    lora_target_modules: Optional[list] = None,
    lora_apply_to_mlp: Optional[bool] = None,
    lora_apply_to_output: Optional[bool] = None,
    use_dora: Optional[bool] = None,
    quantize_base: Optional[bool] = None,
    dataset_source: Optional[str] = None,
    dataset_split: Optional[str] = None,
    train_on_input: Optional[bool] = None,
    system_prompt: Optional[str] = None,
    column_map: Optional[dict] = None,
    num_nodes: int = 0,
    resources_per_node: Optional[dict] = None,
    overrides: Optional[list] = None,
    name: Optional[str] = None,
    name_prefix: Optional[str] = None,
    namespace: Optional[str] = None,
    run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    task_name: str = dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    task_id: str = dsl.PIPELINE_TASK_ID_PLACEHOLDER,
    pipeline_name: str = dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
    labels: Optional[dict] = None,
    pod_labels: Optional[dict] = None,
    pod_annotations: Optional[dict] = None,
    node_selector: Optional[dict] = None,
    tolerations: Optional[list] = None,
    service_account: Optional[str] = None,
    active_deadline_seconds: int = 0,
    queue_name: Optional[str] = None,
    priority_class: Optional[str] = None,
    backend: str = "auto",
    workspace_path: str = "",
    start_timeout: float = 3600.0,
    run_timeout: float = 0.0,
    logs: str = "0",
    mlflow_tracking_uri: Optional[str] = None,
    mlflow_experiment: Optional[str] = None,
    task_config: dsl.TaskConfig = None,
):
    """Fine-tunes an LLM with a Kubeflow Trainer torchtune runtime and hands on the model.

    Creates the TrainJob the kubeflow SDK creates for TrainerClient().train(runtime,
    Initializer(dataset, model), BuiltinTrainer(TorchTuneConfig(...))) with the same
    settings: the runtime's own dataset and model initializers fetch dataset_uri and
    model_uri, and its tune run command trains with the settings as overrides. The runtime
    must be a torchtune runtime (label trainer.kubeflow.org/framework: torchtune). The
    fine-tuned model is written to a folder of the pipeline workspace mounted at the
    runtime's /workspace/output (the runtime's own volume is deleted with the TrainJob), so
    the pipeline needs a workspace (dsl.PipelineConfig(workspace=...)) or a PVC mounted on
    this task. A retried step (task.set_retry) resumes from the last epoch checkpoint its
    failed TrainJob saved there. Unset settings keep the runtime's config values. Caching
    is off on this task by default; literal arguments are checked when the pipeline is built.
    Needs KFP 2.15+.

    Args:
        runtime: Name of the torchtune ClusterTrainingRuntime or TrainingRuntime.
        runtime_kind: ClusterTrainingRuntime or TrainingRuntime (in the job's namespace).
        dataset_uri: Dataset for the runtime's dataset initializer: hf://org/name[/path] or s3://bucket/path (locally also builtin://, file://).
        dataset_secret: Secret with the dataset initializer's credentials (HF token, S3 keys), by name.
        dataset_options: ignore_patterns, endpoint, region, role_arn of the dataset initializer.
        dataset_path: Folder or file of the dataset under /workspace/dataset (e.g. data); default: the path in an hf:// URI.
        model_uri: Model for the runtime's model initializer: hf://org/name or s3://bucket/path (locally also builtin://, file://).
        model_secret: Secret with the model initializer's credentials, by name.
        model_options: ignore_patterns, endpoint, region, role_arn of the model initializer.
        method: full (all weights), lora (a LoRA adapter) or qlora (LoRA on a 4-bit quantized base).
        dtype: bf16 or fp32.
        batch_size: Batch size per device; 0 means the runtime config's.
        epochs: Training epochs; 0 means the runtime config's.
        loss: Loss: CEWithChunkedOutputLoss.
        learning_rate: Learning rate (optimizer.lr).
        seed: Seed of the run (torchtune's seed); -1 means the runtime config's (random).
        lora_rank: LoRA rank; 0 means the runtime config's.
        lora_alpha: LoRA alpha.
        lora_dropout: LoRA dropout.
        lora_target_modules: Attention projections with LoRA: q_proj, k_proj, v_proj, output_proj.
        lora_apply_to_mlp: LoRA on the MLP layers too.
        lora_apply_to_output: LoRA on the output projection too.
        use_dora: DoRA instead of LoRA.
        quantize_base: False sends model.quantize_base=False with method lora (qlora sets it to True).
        dataset_source: Format of the dataset's files: json, csv, parquet, arrow, text or xml.
        dataset_split: Split to train on, e.g. train or train[:90%].
        train_on_input: Train on the prompts too, not only the responses.
        system_prompt: System prompt put before every example.
        column_map: Dataset columns of input and output, e.g. {"input": "question", "output": "answer"}.
        num_nodes: Number of trainer nodes; 0 means the runtime's default.
        resources_per_node: Resources per node, e.g. {"gpu": 2, "cpu": 8, "memory": "64Gi"}.
        overrides: More torchtune overrides, key=value (not output_dir, tokenizer or checkpoint_dir: the runtime sets them).
        name: Explicit TrainJob name; derived from the run, task and inputs when unset.
        name_prefix: Prefix of the derived name.
        namespace: Namespace of the TrainJob; the pipeline's namespace when unset.
        run_id: KFP run id (filled in on each task).
        task_name: KFP task name (filled in on each task).
        task_id: KFP task execution scope (filled in on each task).
        pipeline_name: KFP pipeline run name, for lineage labels.
        labels: Labels of the TrainJob and its JobSet.
        pod_labels: Labels of the trainer pods.
        pod_annotations: Annotations of the trainer pods.
        node_selector: Node selector of the trainer pods.
        tolerations: Tolerations of the trainer pods.
        service_account: Service account of the trainer pods.
        active_deadline_seconds: Server-side limit on the job's run time in seconds; 0 means none.
        queue_name: Kueue LocalQueue to submit to: the TrainJob gets the kueue.x-k8s.io/queue-name label, Kueue suspends it and
            tracks it as the Workload trainjob-<name>-<hash> until its ClusterQueue admits it; the step waits (queue_timeout), logs
            Kueue's reasons and waits again if Kueue preempts the job.
        priority_class: Kueue WorkloadPriorityClass of the job (the kueue.x-k8s.io/priority-class label): its Workload's priority
            in the queue, and which jobs it may preempt; the queue's default when unset.
        backend: Where to run: auto (the cluster; local under kfp-trainer run --local), kubernetes or local.
        workspace_path: The pipeline workspace (filled in when the pipeline has one).
        start_timeout: Seconds the job may take to start (queueing, initializers' downloads, image pulls); 0 means no limit.
        run_timeout: Seconds the trainer may run once started; 0 means no limit.
        logs: Trainer node whose log is streamed (0, 1, ...), all, or none.
        mlflow_tracking_uri: MLflow server to track the training in (the trainer logs into the step's run); MLFLOW_TRACKING_URI of the
            task (KFP's MLflow plugin) when unset. Tracking never fails the step.
        mlflow_experiment: MLflow experiment of the step's own run (else the task's MLflow run, or experiment kfp-trainer).
        task_config: Filled by KFP from the task's settings; do not set.

    Returns:
        output_model: The fine-tuned model (last epoch), with metadata: base model, weights (full or adapter), format, recipe, TrainJob.
        metrics: Final and best values of the loss the trainer logged.
        report: HTML report: loss curve, the recipe, a resume if there was one, timeline, replicated jobs.
        trainjob: The TrainJob as namespace/name.
    """
    values = dict(locals())  # every input by name; steps.torchtune_finetune_arguments sorts them
    from kfp_trainer import steps

    steps.run_step(
        lambda stop: steps.run_torchtune_finetune(
            **steps.torchtune_finetune_arguments(values), artifacts=steps.StepArtifacts.of(values),
            options=steps.StepOptions.of(values), stop=stop,
        )
    )


torchtune_finetune = with_run_context(torchtune_finetune)
