"""Where a step tracks its training in MLflow, and what its trainer nodes are told. Pure: no I/O.

A step tracks when it has a tracking server: its ``mlflow_tracking_uri`` input, else
``MLFLOW_TRACKING_URI`` in its environment. KFP 2.17's MLflow plugin (with
``injectUserEnvVars``) gives every task, through its pod and -- for a component that declares
the ENV TaskConfig passthrough -- its ``task_config.env``:

* ``MLFLOW_TRACKING_URI``, ``MLFLOW_EXPERIMENT_ID`` and ``MLFLOW_RUN_ID`` (the task's nested
  run, under the pipeline run's parent run), ``MLFLOW_WORKSPACE`` when workspaces are on;
* for ``authType: kubernetes``: ``MLFLOW_TRACKING_AUTH=kubernetes`` (or ``kubernetes-namespaced``):
  the pod's service-account token is the credential;
* for ``bearer`` / ``basic-auth``: ``MLFLOW_TRACKING_TOKEN`` or ``MLFLOW_TRACKING_USERNAME`` and
  ``MLFLOW_TRACKING_PASSWORD`` as ``valueFrom.secretKeyRef`` of the Secret
  ``kfp-mlflow-credentials``.

:func:`resolve_target` picks the server, the experiment and the run; the credentials are read
where they are needed (the launcher's environment, the trainer's), never copied: the trainer
nodes get the same Secret references the task has (:func:`credential_notes`).

Example:
    >>> t = resolve_target(env={"MLFLOW_TRACKING_URI": "http://mlflow:5000", "MLFLOW_RUN_ID": "r1", "MLFLOW_EXPERIMENT_ID": "3"})
    >>> (t.uri, t.run_id, t.experiment_id, t.owns_run)
    ('http://mlflow:5000', 'r1', '3', False)
    >>> resolve_target(env={}) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from ..errors import ValidationError
from ..redaction import find_secret

TRACKING_URI = "MLFLOW_TRACKING_URI"
RUN_ID = "MLFLOW_RUN_ID"
EXPERIMENT_ID = "MLFLOW_EXPERIMENT_ID"
EXPERIMENT_NAME = "MLFLOW_EXPERIMENT_NAME"
WORKSPACE = "MLFLOW_WORKSPACE"
AUTH = "MLFLOW_TRACKING_AUTH"
TOKEN = "MLFLOW_TRACKING_TOKEN"
USERNAME = "MLFLOW_TRACKING_USERNAME"
PASSWORD = "MLFLOW_TRACKING_PASSWORD"
INSECURE_TLS = "MLFLOW_TRACKING_INSECURE_TLS"
SERVER_CERT = "MLFLOW_TRACKING_SERVER_CERT_PATH"
CLIENT_CERT = "MLFLOW_TRACKING_CLIENT_CERT_PATH"
#: The variables that carry a credential: from a Secret only.
CREDENTIALS = (TOKEN, USERNAME, PASSWORD)
#: ``MLFLOW_TRACKING_AUTH`` values whose credential is the pod's service-account token.
KUBERNETES_AUTH = ("kubernetes", "kubernetes-namespaced")
#: Where a step logs without an experiment of its own (``mlflow_experiment``, ``MLFLOW_EXPERIMENT_*``).
DEFAULT_EXPERIMENT = "kfp-trainer"
# How long the end of a trainer (default 30 s) or of a step (default 120 s) waits for MLflow to take what is queued.
FLUSH_SECONDS = "KFP_TRAINER_MLFLOW_FLUSH_SECONDS"
#: Every variable of the tracking client: none of them changes what a TrainJob runs.
PREFIX = "MLFLOW_"


@dataclass(frozen=True)
class Target:
    """The tracking server, experiment and run of one step.

    ``run_id`` is the run KFP's plugin made for the task (the step logs into it); when empty the
    step owns its run: it finds the one an earlier try of the task made, or makes one, in the
    experiment ``experiment_id`` (or ``experiment_name``).
    """

    uri: str
    experiment_id: str = ""
    experiment_name: str = ""
    run_id: str = ""
    workspace: str = ""
    auth: str = ""
    insecure_tls: bool = False
    source: str = "env"  # "inputs": the component's mlflow_* inputs; "env": the step's environment (KFP's plugin)

    @property
    def owns_run(self) -> bool:
        """Whether the step makes (or finds again) its own run instead of logging into a given one."""
        return not self.run_id


def _truthy(value: str | None) -> bool:
    return str(value or "").strip().lower() in ("1", "true", "yes", "on")


def check_tracking_uri(field: str, uri: str) -> list[ValidationError]:
    """An MLflow tracking server's URL: ``http(s)://host[:port][/path]``, no credentials in it.

    Example:
        >>> check_tracking_uri("mlflow_tracking_uri", "http://mlflow.mlflow.svc:5000")
        []
        >>> [e.allowed[:30] for e in check_tracking_uri("mlflow_tracking_uri", "file:./mlruns")]
        ['the URL of an MLflow tracking ']
    """
    if not isinstance(uri, str) or not uri.strip():
        return [ValidationError(field, uri, "the URL of an MLflow tracking server, e.g. http://mlflow.mlflow.svc:5000")]
    if find_secret(uri):
        return [
            ValidationError(
                field, uri, f"a URL without credentials: give them as {TOKEN} or {USERNAME}/{PASSWORD} from a Secret "
                "(kfp.kubernetes.use_secret_as_env on the task)",
            )
        ]  # fmt: skip
    parts = urlsplit(uri.strip())
    if parts.scheme not in ("http", "https") or not parts.hostname:
        return [
            ValidationError(
                field, uri, "the URL of an MLflow tracking server (http:// or https://, e.g. http://mlflow.mlflow.svc:5000); "
                "a local store (file:, sqlite:, databricks) is not written by the launcher -- start `mlflow server` on it",
            )
        ]  # fmt: skip
    return []


def check_tracking_inputs(tracking_uri: str | None, experiment: str | None) -> list[ValidationError]:
    """The ``mlflow_tracking_uri`` and ``mlflow_experiment`` inputs (``None``/empty: not given).

    Example:
        >>> [e.field for e in check_tracking_inputs("ftp://x", "e" * 600)]
        ['mlflow_tracking_uri', 'mlflow_experiment']
    """
    errors = check_tracking_uri("mlflow_tracking_uri", tracking_uri) if tracking_uri else []
    if experiment is not None and not isinstance(experiment, str):
        errors.append(ValidationError("mlflow_experiment", experiment, "an MLflow experiment name"))
    elif experiment and (len(experiment) > 500 or not experiment.isprintable() or experiment != experiment.strip()):
        errors.append(ValidationError("mlflow_experiment", experiment, "an MLflow experiment name: printable, at most 500 characters"))
    return errors


def literal_env(items: Any) -> dict[str, str]:
    """The literal values of env given as a name->value map or a list of EnvVar dicts (references left out).

    Example:
        >>> literal_env([{"name": "A", "value": "1"}, {"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "t"}}}])
        {'A': '1'}
    """
    if isinstance(items, Mapping):
        return {str(k): str(v) for k, v in items.items() if isinstance(v, (str, int, float)) and not isinstance(v, bool)}
    if isinstance(items, list):
        return {i["name"]: str(i["value"]) for i in items if isinstance(i, Mapping) and isinstance(i.get("name"), str) and "value" in i}
    return {}


def referenced_env(items: Any) -> set[str]:
    """Names of the variables in an EnvVar list whose value comes from a reference (``valueFrom``)."""
    if not isinstance(items, list):
        return set()
    return {i["name"] for i in items if isinstance(i, Mapping) and isinstance(i.get("name"), str) and "valueFrom" in i}


def resolve_target(
    *, tracking_uri: str | None = None, experiment: str | None = None, env: Mapping[str, str]
) -> Target | None:
    """The step's tracking target, or ``None`` when it has no tracking server (tracking off).

    Explicit inputs win: with ``tracking_uri`` or ``experiment`` given, the step owns its run
    (in ``experiment``, else the environment's experiment, else :data:`DEFAULT_EXPERIMENT`). Else
    a ``MLFLOW_RUN_ID`` in ``env`` (KFP's plugin) is the run to log into.

    Args:
        tracking_uri: The component's ``mlflow_tracking_uri`` (checked by :func:`check_tracking_inputs`).
        experiment: The component's ``mlflow_experiment``.
        env: The step's environment: the task's literal env over the process's.

    Example:
        >>> t = resolve_target(experiment="sweeps", env={"MLFLOW_TRACKING_URI": "http://m", "MLFLOW_RUN_ID": "r1"})
        >>> (t.experiment_name, t.run_id, t.source)
        ('sweeps', '', 'inputs')
    """
    uri = (tracking_uri or env.get(TRACKING_URI) or "").strip()
    if not uri:
        return None
    explicit = bool(tracking_uri or experiment)
    run_id = "" if explicit else (env.get(RUN_ID) or "").strip()
    if experiment:
        experiment_id, experiment_name = "", experiment
    else:
        experiment_id = (env.get(EXPERIMENT_ID) or "").strip()
        experiment_name = "" if experiment_id else (env.get(EXPERIMENT_NAME) or DEFAULT_EXPERIMENT).strip()
    return Target(
        uri=uri.rstrip("/"),
        experiment_id=experiment_id,
        experiment_name=experiment_name,
        run_id=run_id,
        workspace=(env.get(WORKSPACE) or "").strip(),
        auth=(env.get(AUTH) or "").strip(),
        insecure_tls=_truthy(env.get(INSECURE_TLS)),
        source="inputs" if explicit else "env",
    )


def trainer_env(target: Target, *, run_id: str, experiment_id: str) -> list[dict[str, str]]:
    """What the trainer nodes need to log into the step's run (literal, non-secret values only).

    Example:
        >>> [e["name"] for e in trainer_env(Target(uri="http://m", workspace="team-a", auth="kubernetes"), run_id="r", experiment_id="1")]
        ['MLFLOW_TRACKING_URI', 'MLFLOW_RUN_ID', 'MLFLOW_EXPERIMENT_ID', 'MLFLOW_WORKSPACE', 'MLFLOW_TRACKING_AUTH']
    """
    values = {
        TRACKING_URI: target.uri,
        RUN_ID: run_id,
        EXPERIMENT_ID: experiment_id,
        WORKSPACE: target.workspace,
        AUTH: target.auth,
        INSECURE_TLS: "true" if target.insecure_tls else "",
    }
    return [{"name": k, "value": v} for k, v in values.items() if v]


def credential_notes(target: Target, *, process_env: Mapping[str, str], task_env: Any) -> list[str]:
    """What keeps the trainer nodes from authenticating as the step does; empty when nothing.

    The trainer nodes get the task's env, so a credential reaches them only as the task's
    Secret reference (KFP's plugin, or ``kfp.kubernetes.use_secret_as_env``). One the step has
    only in its process environment is never copied into the TrainJob.

    Example:
        >>> notes = credential_notes(Target(uri="http://m"), process_env={"MLFLOW_TRACKING_TOKEN": "t"}, task_env=[])
        >>> notes[0][:75]
        'MLFLOW_TRACKING_TOKEN is set for this step but not as a Secret reference in'
        >>> ref = {"name": "MLFLOW_TRACKING_TOKEN", "valueFrom": {"secretKeyRef": {"name": "kfp-mlflow-credentials", "key": "t"}}}
        >>> credential_notes(Target(uri="http://m"), process_env={"MLFLOW_TRACKING_TOKEN": "t"}, task_env=[ref])
        []
    """
    if target.auth in KUBERNETES_AUTH:
        return []
    referenced = referenced_env(task_env)
    return [
        f"{name} is set for this step but not as a Secret reference in the task's env: the trainer nodes log without it "
        f'(kfp.kubernetes.use_secret_as_env(task, secret_name=..., secret_key_to_env={{...: "{name}"}}) passes it by reference)'
        for name in CREDENTIALS
        if process_env.get(name) and name not in referenced
    ]


def merge_env(env: Any, items: list[dict[str, str]]) -> Any:
    """``env`` (a name->value map, an EnvVar list or ``None``) with ``items`` set, replacing the same names.

    Example:
        >>> merge_env({"A": "1", "MLFLOW_RUN_ID": "old"}, [{"name": "MLFLOW_RUN_ID", "value": "new"}])
        [{'name': 'A', 'value': '1'}, {'name': 'MLFLOW_RUN_ID', 'value': 'new'}]
    """
    if not items:
        return env
    if env is None or env == {} or env == []:
        current: list[Any] = []
    elif isinstance(env, Mapping):
        current = [{"name": k, "value": v} for k, v in env.items()]
    elif isinstance(env, list):
        current = list(env)
    else:
        return env  # not an env: left for validation to name
    names = {i["name"] for i in items}
    return [i for i in current if not (isinstance(i, Mapping) and i.get("name") in names)] + items


def flush_seconds(env: Mapping[str, str], default: float) -> float:
    """The wait for MLflow at the end (``KFP_TRAINER_MLFLOW_FLUSH_SECONDS``, seconds, 0 or more), else ``default``.

    Example:
        >>> flush_seconds({"KFP_TRAINER_MLFLOW_FLUSH_SECONDS": "5"}, 30.0), flush_seconds({"KFP_TRAINER_MLFLOW_FLUSH_SECONDS": "x"}, 30.0)
        (5.0, 30.0)
    """
    try:
        value = float(env.get(FLUSH_SECONDS, "") or default)
    except ValueError:
        return default
    return value if value >= 0 and value == value and value != float("inf") else default
