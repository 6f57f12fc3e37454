"""Run-time work of the ``register_model`` component: an approved model as a version in MLflow's registry.

The server is the component's ``mlflow_tracking_uri``, else ``MLFLOW_TRACKING_URI`` (KFP's
MLflow plugin sets it on every task); credentials come from the step's environment (a
Secret). Unlike tracking, registering was asked for: a missing server, a refusal or an
unreachable server fails the step with what happened and what to do.

The version gets the model's lineage as tags -- the KFP run (id and URL), the TrainJob, the
base model, the dataset, the method, the evaluation's metrics -- and is linked to the MLflow run
that trained it when the training step tracked one on the same server. A retried step hands
back the version its earlier try made (:func:`kfp_trainer.tracking.registry.register`).
"""

from __future__ import annotations

import os
import re
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING, Any

from ..errors import InfraError, InvalidSpecErrors, UserError, ValidationError
from ..redaction import redact_uri, scrub
from .common import finite, log, resolve_identity, resolve_scope, unresolved

if TYPE_CHECKING:
    from ..tracking.settings import Target

_ALIAS = re.compile(r"^[\w-]{1,255}$")
# Model metadata (kfp_trainer.steps.outputs.record_model, the trainers' training_info.json) -> version tags.
LINEAGE = {
    "trainjob": "kfp_trainer.trainjob", "base_model": "kfp_trainer.base_model", "dataset": "kfp_trainer.dataset",
    "method": "kfp_trainer.method", "weights": "kfp_trainer.weights", "format": "kfp_trainer.format",
    "runtime": "kfp_trainer.runtime", "train_loss": "metric.train_loss", "steps": "kfp_trainer.steps",
}  # fmt: skip


def check_inputs(*, model_name: Any, alias: Any, tags: Any, tracking_uri: Any, experiment: Any) -> list[ValidationError]:
    """The ``register_model`` inputs that can be checked without a server.

    Example:
        >>> [e.field for e in check_inputs(model_name="a/b", alias="latest", tags={"k": 1}, tracking_uri="", experiment="")]
        ['model_name', 'alias', 'tags.k']
    """
    from ..tracking.settings import check_tracking_inputs

    errors = []
    if not isinstance(model_name, str) or not model_name.strip() or any(c in model_name for c in "/:") or not model_name.isprintable():
        errors.append(ValidationError("model_name", model_name, "a registered model name: printable, without '/' or ':'"))
    if alias and (not isinstance(alias, str) or not _ALIAS.match(alias) or alias.lower() == "latest" or re.match(r"^[vV]\d+$", alias)):
        allowed = "letters, digits, '_' and '-' (not 'latest' or v<number>, which MLflow reserves), or ''"
        errors.append(ValidationError("alias", alias, allowed))
    if tags is not None:
        if not isinstance(tags, Mapping):
            errors.append(ValidationError("tags", tags, "a map of tag name to text"))
        else:
            errors += [ValidationError(f"tags.{k}", v, "text") for k, v in tags.items() if not isinstance(v, str)]
    errors += check_tracking_inputs(tracking_uri or None, experiment or None)
    return errors


def lineage_tags(model: Any, metrics: Any, *, run_id: str, run_url: str, task_name: str, gate_passed: bool) -> dict[str, str]:
    """The version's tags: where the model came from and how it did (secrets in any value masked).

    Example:
        >>> class A:
        ...     uri, metadata = "s3://b/model", {"trainjob": "ns/job", "base_model": "hf://x", "approved": True}
        >>> class M:
        ...     metadata = {"exact_match": 0.9, "display_name": "m"}
        >>> tags = lineage_tags(A(), M(), run_id="r1", run_url="", task_name="register-model", gate_passed=True)
        >>> tags["kfp_trainer.trainjob"], tags["metric.exact_match"], tags["kfp_trainer.gate"]
        ('ns/job', '0.9', 'passed')
    """
    meta = dict(getattr(model, "metadata", None) or {})
    tags = {
        "kfp.pipeline_run_id": run_id, "kfp.pipeline_run_url": run_url, "kfp.task_name": task_name,
        "kfp_trainer.model_uri": str(getattr(model, "uri", "") or ""), "kfp_trainer.gate": "passed" if gate_passed else "failed",
    }  # fmt: skip
    for key, tag in LINEAGE.items():
        if meta.get(key) not in (None, ""):
            tags[tag] = str(meta[key])
    for key, value in sorted((getattr(metrics, "metadata", None) or {}).items()):
        if finite(value):
            tags[f"metric.{key}"] = str(value)
    return {k: v for k, v in scrub(tags).items() if v}


def _kfp_run_url(client: Any, task_run: str, kfp_ui_url: str, run_id: str) -> str:
    """The KFP run's page: from ``kfp_ui_url``, else the tag KFP's plugin put on the pipeline's MLflow run."""
    if kfp_ui_url:
        return f"{kfp_ui_url.rstrip('/')}/#/runs/details/{run_id}"
    if not task_run:
        return ""
    from ..tracking.client import MlflowError

    try:
        tags = {t["key"]: t["value"] for t in client.get_run(task_run)["data"].get("tags") or []}
        parent = tags.get("mlflow.parentRunId")
        if parent:
            tags = {t["key"]: t["value"] for t in client.get_run(parent)["data"].get("tags") or []}
        url: str = tags.get("kfp.pipeline_run_url", "")
        return url
    except (MlflowError, KeyError):
        return ""


def _files_run(client: Any, target: Target, training_run: str, step_key: str, name: str) -> str:
    """The run the model's files are uploaded to: the one that trained it, the task's, or one made for this step."""
    if training_run:
        return training_run
    if target.run_id:
        return target.run_id
    experiment = target.experiment_id or client.experiment_id(target.experiment_name)
    from ..tracking.registry import STEP_TAG

    tags = {STEP_TAG: step_key, "mlflow.source.type": "JOB", "mlflow.source.name": "kfp-trainer register_model"}
    info, _ = client.find_or_create_run(experiment, name=f"register {name}", tags=tags, key=STEP_TAG)  # one run per step, over retries
    return str(info["run_id"])


def run_register_model(
    *,
    model: Any,
    model_name: str,
    metrics: Any = None,
    gate_passed: bool = True,
    alias: str = "champion",
    upload: bool = False,
    tags: Mapping[str, str] | None = None,
    description: str = "",
    mlflow_tracking_uri: str | None = None,
    mlflow_experiment: str | None = None,
    kfp_ui_url: str = "",
    run_id: str = "",
    task_name: str = "",
    task_id: str = "",
    env: Mapping[str, str] | None = None,
    client_factory: Callable[..., Any] | None = None,
) -> Any:
    """Register ``model`` as a version of ``model_name``; see the module docstring.

    Returns:
        The :class:`~kfp_trainer.tracking.registry.Registration`.

    Raises:
        InvalidSpecErrors: A bad input.
        UserError: No MLflow server, or MLflow refused (the message says why).
        InfraError: The MLflow server did not answer.
    """
    from ..tracking import registry, settings
    from ..tracking.client import MlflowClient, MlflowError, MlflowUnreachable

    env = os.environ if env is None else env
    tracking_uri = None if unresolved(mlflow_tracking_uri) else mlflow_tracking_uri
    errors = check_inputs(model_name=model_name, alias=alias, tags=tags, tracking_uri=tracking_uri, experiment=mlflow_experiment)
    if errors:
        raise InvalidSpecErrors(errors)
    target = settings.resolve_target(tracking_uri=tracking_uri, experiment=mlflow_experiment or None, env=env)
    if target is None:
        raise UserError(
            "register_model: no MLflow server -- pass mlflow_tracking_uri, set MLFLOW_TRACKING_URI on the task, or enable KFP's "
            "MLflow plugin (docs/mlflow.md)"
        )
    run_id, task_name, _ = resolve_identity(run_id, task_name, "", output_uri=str(getattr(model, "uri", "") or ""), env=env)
    step_key = "/".join(p for p in (run_id, task_name, resolve_scope(task_id)) if p)
    client = (client_factory or MlflowClient)(target.uri, env=env, workspace=target.workspace)
    meta = dict(getattr(model, "metadata", None) or {})
    training_run = str(meta.get("mlflow_run_id") or "") if meta.get("mlflow_tracking_uri") == redact_uri(target.uri) else ""
    where = f"MLflow at {redact_uri(target.uri)}"
    try:
        registry.ensure_model(client, model_name)
        existing = registry.version_of_step(client, model_name, step_key)
        source, version_run = str(getattr(model, "uri", "") or ""), training_run
        local = registry.is_local_path(source)
        if existing is None and (upload or local):
            if local and not upload:
                log(f"the model is a path on this machine ({source}): its files are uploaded to {where}")
            version_run = _files_run(client, target, training_run, step_key, model_name)
            artifact_uri = client.get_run(version_run)["info"]["artifact_uri"]
            count = client.upload(artifact_uri, str(model.path), "model")
            source = f"{artifact_uri}/model"
            log(f"uploaded {count} files to run {version_run}: {source}")
        url = _kfp_run_url(client, target.run_id, kfp_ui_url, run_id)
        version_tags = {**lineage_tags(model, metrics, run_id=run_id, run_url=url, task_name=task_name, gate_passed=gate_passed),
                        **dict(tags or {})}  # fmt: skip
        done = registry.register(
            client, name=model_name, source=source, step_key=step_key, run_id=version_run, tags=version_tags,
            description=description or f"Registered by kfp-trainer from KFP run {run_id} (task {task_name}).",
            run_link=url, alias=alias if gate_passed else "",
        )  # fmt: skip
    except MlflowUnreachable as e:
        raise InfraError(f"register_model: {e}; the model was not registered -- retry the step once the server answers") from None
    except MlflowError as e:
        raise UserError(f"register_model: {e}") from None
    _say(done, alias, gate_passed, client, model_name)
    return done


def _say(done: Any, alias: str, gate_passed: bool, client: Any, name: str) -> None:
    from ..tracking import registry

    made = "found the version an earlier try of this step made:" if done.reused else "registered"
    log(f"{made} {done.uri} (source {redact_uri(done.source)}{', run ' + done.run_id if done.run_id else ''})")
    if alias and gate_passed:
        log(f"alias {alias!r} -> version {done.version}")
    elif alias:
        current = registry.alias_version(client, name, alias)
        log(f"the gate did not pass: alias {alias!r} stays {'on version ' + current if current else 'unset'}")
