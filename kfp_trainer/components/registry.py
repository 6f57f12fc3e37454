# ruff: noqa: UP045, D417 - KFP reads Optional[...] (not X | None) and takes output descriptions from Returns.
"""The ``register_model`` component: hand an approved model to MLflow's model registry.

Only the standard library and ``kfp`` are imported here; the work is done by
:func:`kfp_trainer.steps.registry.run_register_model` inside the component's container.
"""

from typing import Optional

from kfp import dsl
from kfp.dsl import Input, Metrics, Model

from ._image import BASE_IMAGE
from .calls import with_run_context


@dsl.component(base_image=BASE_IMAGE, install_kfp_package=False)
def register_model(
    model: Input[Model],
    model_name: str,
    metrics: Input[Metrics] = None,
    gate_passed: bool = True,
    alias: str = "champion",
    upload: bool = False,
    tags: Optional[dict] = None,
    description: str = "",
    mlflow_tracking_uri: Optional[str] = None,
    mlflow_experiment: Optional[str] = None,
    kfp_ui_url: str = "",
    run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    task_name: str = dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    task_id: str = dsl.PIPELINE_TASK_ID_PLACEHOLDER,
) -> str:
    """Registers a model as a new version of a registered model in MLflow, with its lineage.

    The version's tags say where the model came from: the KFP run (id and URL), the TrainJob,
    base model, dataset and method from the model's metadata, and the metrics given. It is
    linked to the MLflow run that trained it when the training step tracked one on the same
    server. Its source is the model's artifact URI, or (upload=True, and always for a path
    on this machine under kfp.local) the files uploaded as a run's artifacts. The alias moves
    to the new version only when gate_passed is True. A retry of the step hands back the
    version its earlier try made instead of making another. The server is mlflow_tracking_uri,
    else MLFLOW_TRACKING_URI (KFP's MLflow plugin sets it); credentials come from a Secret as
    MLFLOW_TRACKING_TOKEN or MLFLOW_TRACKING_USERNAME/PASSWORD in the task's env. Fails the
    step when the model cannot be registered.

    Args:
        model: The approved model.
        model_name: The registered model (created when missing).
        metrics: Its evaluation: each number becomes a metric.<name> tag of the version.
        gate_passed: Whether the model passed the pipeline's gate: the alias moves only then.
        alias: The alias to point at the new version (e.g. champion); empty for none.
        upload: Upload the model's files to MLflow instead of pointing at its artifact URI.
        tags: More tags of the version (name to text).
        description: The version's description.
        mlflow_tracking_uri: MLflow server; MLFLOW_TRACKING_URI of the task when unset.
        mlflow_experiment: Experiment of the run the files are uploaded to, when no training run is known.
        kfp_ui_url: Base URL of the KFP UI, for the run's link (else the link KFP's MLflow plugin recorded).
        run_id: KFP run id (filled in on each task).
        task_name: KFP task name (filled in on each task).
        task_id: KFP task execution scope (filled in on each task).

    Returns:
        Output: The version as models:/<model_name>/<version>.
    """
    from kfp_trainer import steps
    from kfp_trainer.steps.registry import run_register_model

    done = steps.exit_on_error(
        lambda: run_register_model(
            model=model, model_name=model_name, metrics=metrics, gate_passed=gate_passed, alias=alias, upload=upload, tags=tags,
            description=description, mlflow_tracking_uri=mlflow_tracking_uri, mlflow_experiment=mlflow_experiment,
            kfp_ui_url=kfp_ui_url, run_id=run_id, task_name=task_name, task_id=task_id,
        )
    )
    return done.uri


register_model = with_run_context(register_model)
