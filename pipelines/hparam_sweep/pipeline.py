# ruff: noqa: D417 - KFP takes output descriptions from Returns.
"""A small hyper-parameter sweep: one TrainJob per grid point, then the best model by a metric.

The digit classifier of ``pytorch_distributed`` is trained once per point of ``grid``
(learning rate and hidden width) in a ``dsl.ParallelFor`` that runs at most
``PARALLELISM`` TrainJobs at a time. A selection step compares the points' validation
metrics, outputs the best model and a comparison table, and the winner is evaluated on
the held-out test split (metrics and confusion matrix).

Each point's TrainJob gets its own name, even when two points are identical: the name
derives from the run, the task, the inputs and the loop iteration's execution id.

* On a cluster (Kubeflow Trainer, KFP 2.15+): upload ``pipeline.yaml``.
* On a laptop: ``kfp-trainer run pipelines/hparam_sweep --local`` (the local backend runs
  the loop's TrainJobs one after the other).
"""

from typing import Any

from kfp import dsl
from kfp.dsl import ClassificationMetrics, Dataset, Input, Markdown, Metrics, Model, Output

from kfp_trainer.components import BASE_IMAGE, TRAINER_IMAGE, train_job, workspace_config

PIPELINE_NAME = "hparam-sweep"
PARALLELISM = 2  # TrainJobs of the sweep running at once (a compile-time setting of dsl.ParallelFor)
PARAMS: dict[str, Any] = {
    # One point per item, as the trainer's --hyperparameters option takes it: name=value,...
    "grid": [
        "learning_rate=0.02,hidden=16",
        "learning_rate=0.1,hidden=16",
        "learning_rate=0.02,hidden=64",
        "learning_rate=0.1,hidden=64",
    ],
    "metric": "val_accuracy",
    "epochs": 15,
    "num_nodes": 1,
    "runtime": "torch-distributed",
    "trainer_image": TRAINER_IMAGE,
    "seed": 0,
    "backend": "auto",
    # Cluster only (the local backend ignores them): resources of each trainer node, as in the other samples.
    "cpu_per_node": "2",
    "memory_per_node": "4Gi",
}
TASK_LABELS = {"prepare-digits": "data", "train-job": "TrainJob (one per point)", "select-best": "best point"}


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def node_resources(cpu_per_node: str, memory_per_node: str) -> dict:
    """The resources of each trainer node, as the train steps' ``resources_per_node`` input.

    KFP 2.17's compiler does not hand pipeline parameters set on a task's resources
    (``set_cpu_limit(cpu_per_node)``) into a ``ParallelFor``: the loop's iterations cannot resolve
    them, under ``kfp.local`` and on a backend alike. Parameters a step in the loop takes as
    inputs are handed in (and ``kfp.local`` 2.17 mixes up outputs of a step before the loop
    with the loop's items): so this runs in the loop, a moment per point.

    Args:
        cpu_per_node: CPU limit of each trainer node (``2``, ``500m``).
        memory_per_node: Memory limit of each trainer node (``4Gi``).

    Returns:
        ``{"limits": {"cpu": ..., "memory": ...}}``.
    """
    return {"limits": {"cpu": cpu_per_node, "memory": memory_per_node}}


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def prepare_digits(dataset: Output[Dataset], seed: int = 0):
    """Splits the handwritten digits data set into train, validation and test (stratified).

    Args:
        seed: Seed of the split.

    Returns:
        dataset: train.npz, validation.npz, test.npz (x in [0, 1], y in 0-9) and meta.json.
    """
    from kfp_trainer.trainers import digits

    meta = digits.prepare(dataset.path, seed=seed)
    dataset.metadata.update({k: v for k, v in meta.items() if k != "classes"})


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def select_best(
    models: Input[list[Model]],
    metrics: Input[list[Metrics]],
    metric: str,
    best_model: Output[Model],
    best_metrics: Output[Metrics],
    comparison: Output[Markdown],
):
    """Picks the model with the best value of a metric among the sweep's points.

    Args:
        models: The models of every point (dsl.Collected over the loop).
        metrics: Their metrics (dsl.Collected over the loop).
        metric: Metric to choose by (lower is better for losses, errors and perplexity).

    Returns:
        best_model: A copy of the winning model, with its hyper-parameters and score in the metadata.
        best_metrics: The winner's metrics and its index in the sweep.
        comparison: Markdown table of every point's hyper-parameters, metrics and TrainJob.
    """
    from kfp_trainer import steps

    steps.exit_on_error(
        lambda: steps.run_select_best(
            models=models, metrics=metrics, metric=metric, best_model=best_model, best_metrics=best_metrics, comparison=comparison
        )
    )


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def evaluate_classifier(
    model: Input[Model], dataset: Input[Dataset], metrics: Output[Metrics], confusion_matrix: Output[ClassificationMetrics]
):
    """Evaluates the digit classifier on the test split.

    Args:
        model: The trained classifier.
        dataset: The prepared data set.

    Returns:
        metrics: accuracy, macro precision/recall/F1, per-class recall, examples.
        confusion_matrix: Counts of each (true, predicted) digit pair.
    """
    from kfp_trainer import steps

    steps.exit_on_error(
        lambda: steps.run_classifier_evaluation(model=model, dataset=dataset, metrics=metrics, confusion=confusion_matrix)
    )


@dsl.pipeline(
    name=PIPELINE_NAME,
    description="Train one Kubeflow Trainer TrainJob per grid point, pick the best model by a metric, evaluate it.",
    pipeline_config=workspace_config("2Gi"),
)
def pipeline(
    grid: list = PARAMS["grid"],
    metric: str = PARAMS["metric"],
    epochs: int = PARAMS["epochs"],
    num_nodes: int = PARAMS["num_nodes"],
    runtime: str = PARAMS["runtime"],
    trainer_image: str = PARAMS["trainer_image"],
    seed: int = PARAMS["seed"],
    backend: str = PARAMS["backend"],
    cpu_per_node: str = PARAMS["cpu_per_node"],
    memory_per_node: str = PARAMS["memory_per_node"],
):
    """Sweep: prepare data -> ParallelFor(grid): TrainJob -> select the best -> evaluate it."""
    data = prepare_digits(seed=seed).set_display_name("prepare data")
    with dsl.ParallelFor(items=grid, parallelism=PARALLELISM, name="grid") as point:
        resources = node_resources(cpu_per_node=cpu_per_node, memory_per_node=memory_per_node).set_display_name("node resources")
        train = train_job(
            runtime=runtime,
            image=trainer_image,
            command=["torchrun", "-m", "kfp_trainer.trainers.digits", "train"],
            args=[
                "--dataset-dir", "{dataset}", "--output-dir", "{output_model}", "--epochs", epochs, "--seed", seed,
                "--hyperparameters", point,  # the grid point: its values override the options before it
            ],
            num_nodes=num_nodes,
            num_proc_per_node="1",
            resources_per_node=resources.output,
            dataset=data.outputs["dataset"],
            backend=backend,
        ).set_display_name("train point (TrainJob)")
    best = select_best(
        models=dsl.Collected(train.outputs["output_model"]), metrics=dsl.Collected(train.outputs["metrics"]), metric=metric
    ).set_display_name("select best")
    evaluate_classifier(model=best.outputs["best_model"], dataset=data.outputs["dataset"]).set_display_name("evaluate best")
