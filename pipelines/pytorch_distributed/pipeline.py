# ruff: noqa: D417 - KFP takes output descriptions from Returns.
"""Distributed PyTorch end to end: data preparation -> multi-node TrainJob -> evaluation.

A one-hidden-layer classifier learns the handwritten digits data set (UCI, 1,797 8x8
images, shipped inside scikit-learn, so no download) with DistributedDataParallel across
``num_nodes`` nodes of the Trainer's ``torch-distributed`` runtime. The evaluation step
logs accuracy, macro F1 and per-class recall as ``dsl.Metrics`` and the confusion matrix
as ``dsl.ClassificationMetrics``, which the KFP UI draws.

* On a cluster (Kubeflow Trainer, KFP 2.15+): upload ``pipeline.yaml``. The data reaches the
  trainer nodes and the model comes back on the pipeline workspace (ReadWriteMany).
* On a laptop: ``kfp-trainer run pipelines/pytorch_distributed --local`` (two local nodes,
  gloo on CPU; well under a minute of training).
"""

from typing import Any

from kfp import dsl
from kfp.dsl import ClassificationMetrics, Dataset, Input, Metrics, Model, Output

from kfp_trainer.components import TRAINER_IMAGE, train_job, workspace_config

PIPELINE_NAME = "pytorch-distributed"
PARAMS: dict[str, Any] = {
    "runtime": "torch-distributed",
    "trainer_image": TRAINER_IMAGE,
    "num_nodes": 2,
    "epochs": 30,
    "learning_rate": 0.1,
    "hidden": 64,
    "batch_size": 32,
    "seed": 0,
    "backend": "auto",
    # Cluster only (kfp.local ignores them): resources of each trainer node.
    "cpu_per_node": "2",
    "memory_per_node": "4Gi",
    "accelerator_type": "",
    "accelerators_per_node": 1,
}
TASK_LABELS = {"prepare-digits": "data", "train-job": "TrainJob", "evaluate-classifier": "evaluation"}


@dsl.component(base_image=TRAINER_IMAGE, install_kfp_package=False)
def prepare_digits(dataset: Output[Dataset], test_fraction: float = 0.25, validation_fraction: float = 0.15, seed: int = 0):
    """Splits the handwritten digits data set into train, validation and test (stratified).

    Args:
        test_fraction: Share of each class held out for the final evaluation.
        validation_fraction: Share of each class held out for model selection.
        seed: Seed of the split.

    Returns:
        dataset: train.npz, validation.npz, test.npz (x in [0, 1], y in 0-9) and meta.json.
    """
    from kfp_trainer.trainers import digits

    meta = digits.prepare(dataset.path, test_fraction=test_fraction, validation_fraction=validation_fraction, seed=seed)
    dataset.metadata.update({k: v for k, v in meta.items() if k != "classes"})


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
    description="Train a digit classifier with DistributedDataParallel in a multi-node Kubeflow Trainer TrainJob and evaluate it.",
    pipeline_config=workspace_config("2Gi"),
)
def pipeline(
    runtime: str = PARAMS["runtime"],
    trainer_image: str = PARAMS["trainer_image"],
    num_nodes: int = PARAMS["num_nodes"],
    epochs: int = PARAMS["epochs"],
    learning_rate: float = PARAMS["learning_rate"],
    hidden: int = PARAMS["hidden"],
    batch_size: int = PARAMS["batch_size"],
    seed: int = PARAMS["seed"],
    backend: str = PARAMS["backend"],
    cpu_per_node: str = PARAMS["cpu_per_node"],
    memory_per_node: str = PARAMS["memory_per_node"],
    accelerator_type: str = PARAMS["accelerator_type"],
    accelerators_per_node: int = PARAMS["accelerators_per_node"],
):
    """Digits: prepare -> DDP TrainJob on num_nodes nodes -> evaluate (metrics, confusion matrix)."""
    data = prepare_digits(seed=seed).set_display_name("prepare data")
    train = train_job(
        runtime=runtime,
        image=trainer_image,
        command=["torchrun", "-m", "kfp_trainer.trainers.digits", "train"],
        args=[
            "--dataset-dir", "{dataset}", "--output-dir", "{output_model}", "--epochs", epochs,
            "--learning-rate", learning_rate, "--hidden", hidden, "--batch-size", batch_size, "--seed", seed,
        ],
        num_nodes=num_nodes,
        num_proc_per_node="1",
        dataset=data.outputs["dataset"],
        backend=backend,
    ).set_display_name("train (TrainJob)")
    train.set_cpu_limit(cpu_per_node).set_memory_limit(memory_per_node)  # each trainer node's (RESOURCES passthrough)
    train.set_accelerator_type(accelerator_type).set_accelerator_limit(accelerators_per_node)  # no GPU while the type is ""
    evaluate_classifier(model=train.outputs["output_model"], dataset=data.outputs["dataset"]).set_display_name("evaluate")
