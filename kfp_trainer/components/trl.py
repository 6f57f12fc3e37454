# ruff: noqa: UP045, D417 - KFP reads Optional[...] (not X | None) and takes output descriptions from Returns.
"""The ``trl_finetune`` component: supervised fine-tuning, DPO or GRPO with Hugging Face TRL in a TrainJob.

Only the standard library and ``kfp`` are imported here; the work is done by
:func:`kfp_trainer.steps.trl.run_trl_finetune` inside the component's container.
"""

from collections.abc import Callable, Iterable
from typing import Any, Optional

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Metrics, Model, Output, OutputPath

from ._image import BASE_IMAGE
from .calls import with_run_context
from .train_job import TASK_CONFIG_PASSTHROUGHS


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False, task_config_passthroughs=TASK_CONFIG_PASSTHROUGHS)
def trl_finetune(
    output_model: Output[Model],
    metrics: Output[Metrics],
    report: Output[HTML],
    trainjob: OutputPath(str),
    method: str = "sft",
    model: Input[Model] = None,
    dataset: Input[Dataset] = None,
    model_uri: str = "",
    dataset_uri: str = "",
    runtime: str = "kfp-trainer-trl",
    runtime_kind: str = "ClusterTrainingRuntime",
    learning_rate: float = 0.0,
    per_device_train_batch_size: int = 0,
    num_train_epochs: float = 0.0,
    max_steps: int = 0,
    bf16: Optional[bool] = None,
    use_peft: bool = False,
    lora_r: int = 0,
    lora_alpha: int = 0,
    lora_dropout: Optional[float] = None,
    lora_target_modules: Optional[list] = None,
    load_in_4bit: bool = False,
    merge_adapter: bool = True,
    beta: float = 0.0,
    max_length: int = 0,
    save_steps: int = 0,
    logging_steps: int = 0,
    seed: int = -1,
    rewards: Optional[list] = None,
    num_generations: int = -1,
    max_completion_length: int = -1,
    temperature: float = -1.0,
    loss_type: str = "",
    gradient_accumulation_steps: int = 0,
    use_vllm: bool = False,
    vllm_mode: str = "",
    extra_args: Optional[list] = None,
    num_nodes: int = 0,
    num_proc_per_node: Optional[str] = None,
    resources_per_node: Optional[dict] = None,
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
    """Fine-tunes an LLM with Hugging Face TRL (SFTTrainer, DPOTrainer or GRPOTrainer) in a TrainJob and hands on the model.

    The TrainJob runs on a runtime labelled trainer.kubeflow.org/framework: trl, by default
    kfp-trainer-trl (deploy/trl-runtime.yaml: the project's trainer image running
    torchrun -m kfp_trainer.trainers.trl_train); it carries only the trainer's arguments, the
    settings below under the names of the kubeflow SDK's proposed TRLConfig (KEP-626), TRL's
    own for the rest. The model and dataset come as artifacts (model_initializer and
    dataset_initializer outputs, or an earlier step's model: DPO after SFT) or as URIs this
    step fetches (credentials from the task's env: kfp.kubernetes.use_secret_as_env). SFT reads
    prompt/completion, chat, instruction, question/answer or input/output records (or
    preference pairs, learning the chosen answer); DPO reads prompt/chosen/rejected pairs; GRPO
    reads a prompt column (text or chat turns) and the columns its rewards read; as
    .jsonl, .json, .csv, .parquet or save_to_disk files. GRPO samples num_generations
    completions per prompt and learns from their rewards: built-in ones by name
    (exact_answer, format, length_penalty) and your own Python functions
    (kfp_trainer.components.reward(fn)), checked when the pipeline is built. The trainer checkpoints into its
    output folder on the pipeline workspace, so a retried step (task.set_retry) resumes from
    the last checkpoint. Unset settings (0, empty) keep TRL's defaults. Caching is off on
    this task unless set_caching_options(True). Needs KFP 2.15+ and a pipeline workspace on a cluster.

    Args:
        method: sft (supervised fine-tuning), dpo (direct preference optimization) or grpo (online RL from rewards).
        model: Model to start from (a Hugging Face model folder).
        dataset: Dataset folder (the shapes above).
        model_uri: Model to fetch when no model artifact is given: hf://, s3://, file:// (locally also builtin://).
        dataset_uri: Dataset to fetch when no dataset artifact is given.
        runtime: Name of the TRL ClusterTrainingRuntime or TrainingRuntime.
        runtime_kind: ClusterTrainingRuntime or TrainingRuntime (in the job's namespace).
        learning_rate: Peak learning rate; 0 means TRL's default.
        per_device_train_batch_size: Batch size per process; 0 means TRL's default.
        num_train_epochs: Epochs; 0 means TRL's default.
        max_steps: Optimizer steps (overrides num_train_epochs); 0 means by epochs.
        bf16: Train in bfloat16 (needs a GPU); unset means off on CPU.
        use_peft: Train a LoRA adapter instead of all weights.
        lora_r: LoRA rank; 0 means TRL's default.
        lora_alpha: LoRA alpha; 0 means TRL's default.
        lora_dropout: LoRA dropout.
        lora_target_modules: Modules with LoRA, e.g. ["q_proj", "v_proj"] or ["all-linear"].
        load_in_4bit: QLoRA: LoRA on a 4-bit quantized base (needs CUDA and bitsandbytes on the nodes).
        merge_adapter: LoRA: save the merged model at the top and the adapter in adapter/ (else the adapter alone).
        beta: DPO beta (how far from the reference model), or GRPO's KL weight; 0 means TRL's default (GRPO: no KL term).
        max_length: Maximum tokens per example (prompt and answer); 0 means TRL's default.
        save_steps: Steps between checkpoints (a retry resumes from the last); 0 means 50.
        logging_steps: Steps between log lines; 0 means 10.
        seed: Seed; -1 means TRL's default.
        rewards: GRPO's reward functions: names (exact_answer, format, length_penalty), dicts with settings and weight
            ({"name": "format", "pattern": "[0-9]+", "weight": 0.2}), or reward(my_function) items.
        num_generations: GRPO: completions sampled per prompt (at least 2; they must fill whole generation batches); -1 means TRL's.
        max_completion_length: GRPO: tokens per sampled completion (at least 1); -1 means TRL's.
        temperature: GRPO: sampling temperature (above 0); -1 means TRL's.
        loss_type: GRPO: TRL's loss formulation (grpo, dr_grpo, dapo, bnpo, cispo, sapo, luspo); TRL's when empty.
        gradient_accumulation_steps: Steps per optimizer update; 0 means TRL's default.
        use_vllm: GRPO: generate with vLLM (GPU nodes with vllm installed).
        vllm_mode: GRPO with vLLM: colocate (in the training processes) or server; TRL's when empty.
        extra_args: More TRL flags, e.g. ["--warmup_steps", "10"] (not the model, dataset or output folders).
        num_nodes: Number of trainer nodes; 0 means the runtime's default.
        num_proc_per_node: Processes per node (an integer, or auto); the runtime's when unset.
        resources_per_node: Resources per node, e.g. {"gpu": 1, "cpu": 8, "memory": "32Gi"}.
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
        start_timeout: Seconds the job may take to start; 0 means no limit.
        run_timeout: Seconds the trainer may run once started; 0 means no limit.
        logs: Trainer node whose log is streamed (0, 1, ...), all, or none.
        mlflow_tracking_uri: MLflow server to track the training in (the trainer logs into the step's run); MLFLOW_TRACKING_URI of the
            task (KFP's MLflow plugin) when unset. Tracking never fails the step.
        mlflow_experiment: MLflow experiment of the step's own run (else the task's MLflow run, or experiment kfp-trainer).
        task_config: Filled by KFP from the task's settings; do not set.

    Returns:
        output_model: The trained model, with metadata: base model, method, weights (full or adapter), format, TrainJob, runtime, settings.
        metrics: Final and best values of what the trainer logged (loss; DPO's rewards/margins; GRPO's rewards, KL, completion length),
            seconds queued, starting, running.
        report: HTML report: curves, the TRL settings, a resume if there was one, GRPO's sampled completions, timeline, nodes.
        trainjob: The TrainJob as namespace/name.
    """
    values = dict(locals())  # the inputs, sorted by the step into TRL settings and TrainJob inputs
    from kfp_trainer import steps

    steps.run_step(
        lambda stop: steps.run_trl_finetune(
            **steps.trl_arguments(values), artifacts=steps.StepArtifacts.of(values), options=steps.StepOptions.of(values), stop=stop
        )
    )


trl_finetune = with_run_context(trl_finetune)


def reward(func: Callable[..., Any], *, weight: float = 1.0, name: Optional[str] = None, modules: Iterable[str] = ()) -> dict:
    """Your own reward function as an item of ``trl_finetune(method="grpo", rewards=[...])``, checked now.

    A plain ``def`` at module level, with its imports inside its body, taking ``completions``
    (and any of ``prompts``, ``completion_ids``, ``trainer_state`` and the dataset's columns, by
    keyword), returning one finite number per completion. Its source is shipped into the
    TrainJob. See :func:`kfp_trainer.llm.rewards.reward`.
    """
    from kfp_trainer.llm.rewards import reward as shipped

    return shipped(func, weight=weight, name=name, modules=modules)
