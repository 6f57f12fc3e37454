# ruff: noqa: UP045, D417 - KFP reads Optional[...] (not X | None) and takes output descriptions from Returns.
"""The ``train_job`` component: run one Kubeflow Trainer TrainJob as a pipeline step.

Only the standard library and ``kfp`` are imported here; the work is done by
:func:`kfp_trainer.steps.train_job.run_train_job` inside the component's container.
"""

from typing import Optional

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Metrics, Model, Output, OutputPath

from ._image import BASE_IMAGE
from .calls import with_run_context

TASK_CONFIG_PASSTHROUGHS = [
    dsl.TaskConfigField.RESOURCES,
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.ENV, apply_to_task=True),
    dsl.TaskConfigField.KUBERNETES_TOLERATIONS,
    dsl.TaskConfigField.KUBERNETES_NODE_SELECTOR,
    dsl.TaskConfigField.KUBERNETES_AFFINITY,
    dsl.TaskConfigPassthrough(field=dsl.TaskConfigField.KUBERNETES_VOLUMES, apply_to_task=True),
]


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False, task_config_passthroughs=TASK_CONFIG_PASSTHROUGHS)
def train_job(
    output_model: Output[Model],
    metrics: Output[Metrics],
    report: Output[HTML],
    trainjob: OutputPath(str),
    runtime: str = "torch-distributed",
    runtime_kind: str = "ClusterTrainingRuntime",
    image: Optional[str] = None,
    command: Optional[list] = None,
    args: Optional[list] = None,
    env: Optional[dict] = None,
    num_nodes: int = 0,
    num_proc_per_node: Optional[str] = None,
    resources_per_node: Optional[dict] = None,
    dataset: Input[Dataset] = None,
    model: Input[Model] = None,
    dataset_uri: Optional[str] = None,
    dataset_secret: Optional[str] = None,
    dataset_env: Optional[dict] = None,
    model_uri: Optional[str] = None,
    model_secret: Optional[str] = None,
    model_env: Optional[dict] = None,
    name: Optional[str] = None,
    name_prefix: Optional[str] = None,
    namespace: Optional[str] = None,
    run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    task_name: str = dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    task_id: str = dsl.PIPELINE_TASK_ID_PLACEHOLDER,
    pipeline_name: str = dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
    labels: Optional[dict] = None,
    annotations: Optional[dict] = None,
    pod_labels: Optional[dict] = None,
    pod_annotations: Optional[dict] = None,
    volumes: Optional[list] = None,
    volume_mounts: Optional[list] = None,
    node_selector: Optional[dict] = None,
    tolerations: Optional[list] = None,
    affinity: Optional[dict] = None,
    service_account: Optional[str] = None,
    image_pull_secrets: Optional[list] = None,
    pod_targets: Optional[list] = None,
    scheduling_gates: Optional[list] = None,
    security_context: Optional[dict] = None,
    container_security_context: Optional[dict] = None,
    termination_grace_period_seconds: int = -1,
    init_containers: Optional[list] = None,
    active_deadline_seconds: int = 0,
    suspend: Optional[bool] = None,
    queue_name: Optional[str] = None,
    priority_class: Optional[str] = None,
    managed_by: Optional[str] = None,
    patch: Optional[dict] = None,
    backend: str = "auto",
    workspace_path: str = "",
    start_timeout: float = 3600.0,
    queue_timeout: float = 0.0,
    run_timeout: float = 0.0,
    logs: str = "0",
    delete_after_success: bool = False,
    metric_names: str = "",
    mlflow_tracking_uri: Optional[str] = None,
    mlflow_experiment: Optional[str] = None,
    task_config: dsl.TaskConfig = None,
):
    """Runs a Kubeflow Trainer TrainJob to its end and hands on the trained model.

    Submits the TrainJob (or adopts the one an earlier try of this task created), streams
    the trainer's log into this step's log, and fails the step with the reason, failed
    pods, events and log tail when the job fails. Cancelling the run or passing a time
    limit deletes the TrainJob. Resources, env, node selector, tolerations, affinity and
    volumes set on this task go to the TrainJob's trainer nodes. Command, args and env
    values may use ``{dataset}``, ``{model}`` (the input artifacts) and ``{output_model}``
    (where the trainer must save the model). On a cluster these live on a volume shared
    with the TrainJob: the pipeline's workspace (dsl.PipelineConfig(workspace=...); each
    task then gets workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER by itself), or a PVC
    mounted on the task. The run id, task name and task id are filled in the same way.
    Caching is off on this task by default (its inputs rarely change between runs, so a
    cache hit would skip training); set_caching_options(True) turns it on. Literal
    arguments are checked when the pipeline is built. Needs KFP 2.15+; load the YAML with
    kfp_trainer.components.load_component_from_file/url, which keeps the TaskConfig
    passthroughs and the run context that kfp.components' own loader loses.

    Args:
        runtime: Name of the ClusterTrainingRuntime or TrainingRuntime to use.
        runtime_kind: ClusterTrainingRuntime or TrainingRuntime (in the job's namespace).
        image: Trainer image; the runtime's image when unset.
        command: Trainer command; may use {dataset}, {model} and {output_model}.
        args: Trainer arguments; may use the same placeholders.
        env: Trainer environment variables, name to value (secrets: use kfp.kubernetes.use_secret_as_env on the task).
        num_nodes: Number of trainer nodes; 0 means the runtime's default.
        num_proc_per_node: Processes per node (an integer; Trainer v2.1 also accepts auto, cpu, gpu).
        resources_per_node: Resources of each node (limits/requests); the task's resources when unset.
        dataset: Dataset artifact the trainer reads at {dataset}.
        model: Model artifact the trainer starts from, at {model}.
        dataset_uri: Dataset for the runtime's dataset initializer (hf://, s3://; locally also builtin://, file://).
        dataset_secret: Secret with credentials for the dataset initializer (by name; never values).
        dataset_env: Extra environment of the dataset initializer.
        model_uri: Model for the runtime's model initializer (hf://, s3://; locally also builtin://, file://).
        model_secret: Secret with credentials for the model initializer.
        model_env: Extra environment of the model initializer.
        name: Explicit TrainJob name; derived from the run, task and inputs when unset.
        name_prefix: Prefix of the derived name.
        namespace: Namespace of the TrainJob; the pipeline's namespace when unset.
        run_id: KFP run id, for a stable name and lineage labels (filled in on each task).
        task_name: KFP task name, for a stable name and lineage labels (filled in on each task).
        task_id: KFP task execution scope (filled in on each task): tells identical ParallelFor iterations apart.
        pipeline_name: KFP pipeline run name, for lineage labels.
        labels: Labels of the TrainJob and its JobSet.
        annotations: Annotations of the TrainJob's JobSet.
        pod_labels: Labels of the trainer pods.
        pod_annotations: Annotations of the trainer pods.
        volumes: Extra volumes of the trainer pods.
        volume_mounts: Extra volume mounts of the trainer container.
        node_selector: Node selector of the trainer pods.
        tolerations: Tolerations of the trainer pods.
        affinity: Affinity of the trainer pods.
        service_account: Service account of the trainer pods.
        image_pull_secrets: Names of image pull secrets of the trainer pods.
        pod_targets: More replicated jobs that get the pod settings (e.g. dataset-initializer).
        scheduling_gates: Scheduling gate names of the trainer pods (they wait until something removes them).
        security_context: Pod security context of the trainer pods (runAsUser, fsGroup, seccompProfile, ...; Trainer v2.2+).
        container_security_context: Security context of the trainer container (readOnlyRootFilesystem, capabilities, ...; Trainer v2.2+).
        termination_grace_period_seconds: Seconds the trainer pods get to stop after SIGTERM (Trainer v2.3+); -1: the runtime's.
        init_containers: Env, volumeMounts and securityContext for init containers the runtime defines, by name ({name, env, ...}).
        active_deadline_seconds: Server-side limit on the job's run time in seconds (Trainer v2.2+); 0 means none.
        suspend: Create the TrainJob suspended (e.g. for a queue to admit).
        queue_name: Kueue LocalQueue to submit to: the TrainJob gets the kueue.x-k8s.io/queue-name label, Kueue suspends it and
            tracks it as the Workload trainjob-<name>-<hash> until its ClusterQueue admits it; the step waits (queue_timeout), logs
            Kueue's reasons and waits again if Kueue preempts the job.
        priority_class: Kueue WorkloadPriorityClass of the job (the kueue.x-k8s.io/priority-class label): its Workload's priority
            in the queue, and which jobs it may preempt; the queue's default when unset.
        managed_by: Who runs the job: the Trainer (default) or kueue.x-k8s.io/multikueue (a worker cluster; needs queue_name).
        patch: Raw merge patch applied to the rendered TrainJob (expert use).
        backend: Where to run: auto (the cluster; local under kfp-trainer run --local), kubernetes or local.
        workspace_path: The pipeline workspace that carries artifacts to and from the TrainJob (filled in when the pipeline has one).
        start_timeout: Seconds the job may take to start (scheduling, image pulls), not counting time queued; 0 means no limit.
        queue_timeout: Seconds the job may wait suspended in its queue (Kueue) in all; 0 means no limit.
        run_timeout: Seconds the trainer may run once started; 0 means no limit.
        logs: Trainer node whose log is streamed (0, 1, ...), all, or none.
        delete_after_success: Delete the TrainJob after it succeeded and its model was copied.
        metric_names: Metrics to keep: names and re:REGEX patterns, comma-separated (loss,re:eval_.*); empty: all the trainer printed.
        mlflow_tracking_uri: MLflow server to track the training in (the trainer logs into the step's run); MLFLOW_TRACKING_URI of the
            task (KFP's MLflow plugin) when unset. Tracking never fails the step.
        mlflow_experiment: MLflow experiment of the step's own run (else the task's MLflow run, or experiment kfp-trainer).
        task_config: Filled by KFP from the task's settings; do not set.

    Returns:
        output_model: The trained model ({output_model}), with metadata: base model, weights (full or adapter), format, TrainJob, runtime.
        metrics: Final metric values the trainer printed, best_<name> where the best differs, seconds queued, starting and running.
        report: HTML report: metric curves, progress, queued/starting/running times, final/best table, timeline, replicated jobs.
        trainjob: The TrainJob as namespace/name.
    """
    values = dict(locals())  # every input by name: the TrainJob's, the artifacts, the launcher's options
    from kfp_trainer import steps

    steps.run_step(
        lambda stop: steps.run_train_job(
            steps.train_job_inputs(values), steps.StepArtifacts.of(values), steps.StepOptions.of(values), stop=stop
        )
    )


train_job = with_run_context(train_job)
