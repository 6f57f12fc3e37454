"""What a user can ask of one TrainJob (:class:`TrainJobInputs`), the API's names and the limits. Pure.

:meth:`TrainJobInputs.parse` checks types only (a string where a string belongs, a whole
number where a count belongs; ``True`` is not a number and bytes are not text) and turns
pydantic's errors into :class:`~kfp_trainer.errors.InvalidSpecErrors` that name the field
and never show a secret-like value. The rules about values live in
:mod:`kfp_trainer.spec.validate`.

Example:
    >>> TrainJobInputs.parse(runtime="torch-distributed", num_nodes=2.0).num_nodes
    2
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Annotated, Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field, Strict, field_validator

from .. import naming
from ..errors import InvalidSpecErrors, ValidationError
from ..redaction import env_item_shape
from .resources import requirements

GROUP = "trainer.kubeflow.org"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
PLURAL = "trainjobs"
MANAGER = "kfp-trainer.kubeflow.org/launcher"
LABEL_PREFIX = "kfp-trainer.kubeflow.org/"
LABEL_RUN = LABEL_PREFIX + "run-id"
LABEL_TASK = LABEL_PREFIX + "task"
LABEL_PIPELINE = LABEL_PREFIX + "pipeline"
LABEL_DIGEST = LABEL_PREFIX + "inputs-digest"
LABEL_SCOPE = LABEL_PREFIX + "scope"  # the KFP execution scope: one per ParallelFor iteration
LABEL_MANAGED_BY = "app.kubernetes.io/managed-by"
ANNOTATION_RUN = LABEL_PREFIX + "run-id"
ANNOTATION_TASK = LABEL_PREFIX + "task"
# Set to "true" on a ClusterTrainingRuntime, it lets jobs of that runtime use host access.
ALLOW_HOST_ACCESS_ANNOTATION = LABEL_PREFIX + "allow-host-access"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"  # names a Kueue WorkloadPriorityClass
TRAINER_CONTROLLER = "trainer.kubeflow.org/trainjob-controller"  # spec.managedBy: the Trainer runs the job here
MULTIKUEUE = "kueue.x-k8s.io/multikueue"  # spec.managedBy: Kueue's MultiKueue runs it on a worker cluster
MANAGERS = (TRAINER_CONTROLLER, MULTIKUEUE)  # what the TrainJob CRD allows in spec.managedBy
TRAINER_JOBS = ("node", "launcher")
INITIALIZER_JOBS = ("dataset-initializer", "model-initializer")

ApiVersion = Literal["v2.1", "v2.2"]
API_VERSIONS: tuple[str, ...] = ("v2.1", "v2.2")

RESERVED_ENV_PREFIXES = ("PET_", "DMLC_", "OMPI_MCA_")
DATASET_SCHEMES = ("hf", "s3", "cache")
MODEL_SCHEMES = ("hf", "s3")
LOCAL_SCHEMES = ("builtin", "file")  # served by the local backend only

# Limits. A TrainJob is copied by the controllers into a JobSet, its Jobs and pods, each
# an object in etcd (1.5 MiB per request by default); one argument or env entry longer than
# 128 KiB cannot even be passed to a Linux process (MAX_ARG_STRLEN).
MAX_NODES = 1024
MAX_PROC_PER_NODE = 1024
MAX_VALUE_BYTES = 128 * 1024 - 1
MAX_MANIFEST_BYTES = 512 * 1024
MAX_ANNOTATIONS_BYTES = 256 * 1024  # the API server's limit for all annotations of one object
MAX_LIST_ITEMS = 128  # command, args
MAX_DEPTH = 48  # nesting of any value (the deepest PodSpec field the patch reaches is ~25)
MAX_NODES_IN_VALUE = 50_000  # strings, numbers, lists and maps in one input
INT64_MAX = 2**63 - 1

Text = Annotated[str, Strict()]
_DIGITS = re.compile(r"[+-]?[0-9]{1,19}")


def _whole_number(value: Any) -> Any:
    """Accept a whole number (``2``, ``2.0``, ``"2"``); refuse booleans, fractions, NaN and text."""
    if value is None:
        return None
    if isinstance(value, bool):
        raise ValueError("a whole number, not a boolean")
    if isinstance(value, int):
        return value
    if isinstance(value, float):
        if not math.isfinite(value) or not value.is_integer():
            raise ValueError("a whole number")
        return int(value)
    if isinstance(value, str) and _DIGITS.fullmatch(value):
        return int(value)
    raise ValueError("a whole number")


class TrainJobInputs(BaseModel):
    """Everything a user can ask of one TrainJob. Field names match the component inputs.

    Pod-level settings (volumes, mounts, node selector, tolerations, affinity, service
    account, image pull secrets, pod labels/annotations) apply to the trainer's replicated
    jobs (``node``, and ``launcher`` for MPI runtimes); list more in ``pod_targets``.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # identity
    name: Text = ""
    name_prefix: Text = ""
    namespace: Text = ""
    run_id: Text = ""
    task_name: Text = ""
    pipeline_name: Text = ""
    task_id: Text = ""  # the task's KFP execution scope (a loop iteration's DAG execution id)
    # runtime
    runtime: Text = "torch-distributed"
    runtime_kind: Text = "ClusterTrainingRuntime"
    # trainer
    image: Text = ""
    command: list[Text] = Field(default_factory=list)
    args: list[Text] = Field(default_factory=list)
    # Appended to args to continue an earlier try of the same job (e.g. from its checkpoint); not part
    # of the job's identity (name, inputs digest), so the retry replaces or adopts that try's TrainJob.
    resume_args: list[Text] = Field(default_factory=list)
    env: dict[Text, Text] | list[dict[Text, Any]] = Field(default_factory=dict)
    num_nodes: int | None = None
    num_proc_per_node: int | Text | None = None
    resources_per_node: dict[Text, Any] = Field(default_factory=dict)
    # initializers
    dataset_uri: Text = ""
    dataset_secret: Text = ""
    dataset_env: dict[Text, Text] | list[dict[Text, Any]] = Field(default_factory=dict)
    model_uri: Text = ""
    model_secret: Text = ""
    model_env: dict[Text, Text] | list[dict[Text, Any]] = Field(default_factory=dict)
    # metadata
    labels: dict[Text, Text] = Field(default_factory=dict)
    annotations: dict[Text, Text] = Field(default_factory=dict)
    pod_labels: dict[Text, Text] = Field(default_factory=dict)
    pod_annotations: dict[Text, Text] = Field(default_factory=dict)
    # pod settings
    volumes: list[dict[Text, Any]] = Field(default_factory=list)
    volume_mounts: list[dict[Text, Any]] = Field(default_factory=list)
    node_selector: dict[Text, Text] = Field(default_factory=dict)
    tolerations: list[dict[Text, Any]] = Field(default_factory=list)
    affinity: dict[Text, Any] = Field(default_factory=dict)
    service_account: Text = ""
    image_pull_secrets: list[Text] = Field(default_factory=list)
    pod_targets: list[Text] = Field(default_factory=list)
    scheduling_gates: list[Text] = Field(default_factory=list)
    security_context: dict[Text, Any] = Field(default_factory=dict)  # the pods' PodSecurityContext
    container_security_context: dict[Text, Any] = Field(default_factory=dict)  # the trainer container's SecurityContext
    termination_grace_period_seconds: int | None = None
    init_containers: list[dict[Text, Any]] = Field(default_factory=list)  # patches of the runtime's init containers
    # lifecycle
    active_deadline_seconds: int | None = None
    suspend: Annotated[bool, Strict()] = False
    queue_name: Text = ""
    priority_class: Text = ""
    managed_by: Text = ""
    patch: dict[Text, Any] = Field(default_factory=dict)

    @field_validator("num_nodes", "active_deadline_seconds", "termination_grace_period_seconds", mode="before")
    @classmethod
    def _counts_are_whole_numbers(cls, value: Any) -> Any:
        return _whole_number(value)

    @field_validator("resources_per_node", mode="before")
    @classmethod
    def _resources_in_either_shape(cls, value: Any) -> Any:
        return requirements(value)  # the SDK's flat {"gpu": 2, "cpu": 4} as limits and requests

    @field_validator("num_proc_per_node", mode="before")
    @classmethod
    def _procs_are_whole_numbers_or_words(cls, value: Any) -> Any:
        if isinstance(value, str) and not _DIGITS.fullmatch(value):
            return value  # auto/cpu/gpu (v2.1) or a mistake that validate() names
        try:
            return _whole_number(value)
        except ValueError:
            raise ValueError("a whole number >= 1 (Trainer v2.1 also takes auto, cpu, gpu)") from None

    @classmethod
    def parse(cls, **inputs: Any) -> TrainJobInputs:
        """Build from keyword inputs, turning type errors into :class:`InvalidSpecErrors`.

        ``None`` means "not set" for every input, so optional component inputs can be
        passed straight through. Numbers and booleans in ``command``, ``args`` and ``env``
        values become text (:func:`normalize_values`): the rule of every entry point (the
        components, :func:`~kfp_trainer.spec.build_trainjob`, the command line, the launcher),
        which all come through here. Errors never show a secret-like value.

        Example:
            >>> TrainJobInputs.parse(num_nodes=True)
            Traceback (most recent call last):
            ...
            kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
              - num_nodes: got True; expected a whole number, not a boolean
        """
        given = normalize_values({k: v for k, v in inputs.items() if v is not None})  # the one rule of every entry point
        unknown = sorted(set(given) - set(cls.model_fields))
        errors = [ValidationError(k, given[k], f"one of the known inputs ({', '.join(sorted(cls.model_fields))})") for k in unknown]
        if errors:
            raise InvalidSpecErrors(errors)
        try:
            return cls(**given)
        except pydantic.ValidationError as e:
            raise InvalidSpecErrors(_type_errors(e, given)) from None
        except RecursionError:
            raise InvalidSpecErrors([ValidationError("inputs", "...", f"values nested at most {MAX_DEPTH} levels deep")]) from None

    def updated(self, **values: Any) -> TrainJobInputs:
        """A copy with ``values`` set, each checked as :meth:`parse` checks it (``None``: back to unset); the rest as it is.

        Example:
            >>> TrainJobInputs.parse(runtime="r").updated(num_nodes=2.0, resources_per_node={"gpu": 1}).num_nodes
            2
            >>> TrainJobInputs.parse(runtime="r").updated(num_nodes=True)
            Traceback (most recent call last):
            ...
            kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
              - num_nodes: got True; expected a whole number, not a boolean
        """
        fields = type(self).model_fields
        unknown = sorted(set(values) - set(fields))
        if unknown:
            known = ", ".join(sorted(fields))
            raise InvalidSpecErrors([ValidationError(k, values[k], f"one of the known inputs ({known})") for k in unknown])
        given = {k: v if v is not None else fields[k].get_default(call_default_factory=True) for k, v in normalize_values(values).items()}
        out = self.model_copy(deep=True)
        validator = type(self).__pydantic_validator__
        errors: list[ValidationError] = []
        for name, value in given.items():
            try:
                validator.validate_assignment(out, name, value)
            except pydantic.ValidationError as e:
                errors += _type_errors(e, given)
        if errors:
            raise InvalidSpecErrors(errors)
        return out

    def digest(self) -> str:
        """Digest of what the job runs (identity fields left out): tells iterations apart."""
        content = self.model_dump(exclude={"name", "name_prefix", "run_id", "task_name", "pipeline_name", "resume_args"})
        for key in _LEFT_OUT_WHEN_UNSET:  # inputs added later: unset, they keep the names of jobs made before them
            if content.get(key) in (None, "", [], {}):
                content.pop(key, None)
        # Where the trainer logs (KFP's MLflow plugin gives each try of a task a new MLFLOW_RUN_ID) is not
        # what it runs: a retried step must find its job under the same name.
        content["env"] = _without_tracking(content.get("env"))
        return naming.digest(json.dumps(content, sort_keys=True, default=str))


_LEFT_OUT_WHEN_UNSET = (
    "scheduling_gates", "security_context", "container_security_context", "termination_grace_period_seconds", "init_containers",
    "managed_by", "priority_class",
)
_ENV_FIELDS = ("env", "dataset_env", "model_env")
_ENV_EXPECTED = "a map of NAME to string value, or a list of EnvVar objects ({name, value} or {name, valueFrom})"
TRACKING_PREFIX = "MLFLOW_"  # the MLflow client's variables (kfp_trainer.tracking.settings)


def _without_tracking(env: Any) -> Any:
    """``env`` without the MLflow client's variables: unchanged when it has none, ``{}`` when nothing else is left.

    Example:
        >>> _without_tracking([{"name": "MLFLOW_RUN_ID", "value": "r"}]), _without_tracking({"A": "1", "MLFLOW_RUN_ID": "r"})
        ({}, {'A': '1'})
    """

    def tracking(name: Any) -> bool:
        return str(name).startswith(TRACKING_PREFIX)

    if isinstance(env, dict) and any(tracking(k) for k in env):
        return {k: v for k, v in env.items() if not tracking(k)}
    if isinstance(env, list) and any(isinstance(e, dict) and tracking(e.get("name")) for e in env):
        return [e for e in env if not (isinstance(e, dict) and tracking(e.get("name")))] or {}
    return env


def _type_errors(error: pydantic.ValidationError, given: dict[str, Any]) -> list[ValidationError]:
    """Pydantic's errors as ours: ``field[key][0]`` paths, plain expectations, one error per union field."""
    out: list[ValidationError] = []
    seen: set[str] = set()
    for err in error.errors(include_url=False):
        loc = [str(p) for p in err["loc"]]
        field, rest = loc[0], loc[1:]
        value = given.get(field)
        if field in _ENV_FIELDS:
            # Report the branch that fits the value's shape, or one summary for neither shape.
            branch = "dict" if isinstance(value, dict) else "list" if isinstance(value, list) else ""
            if not branch:
                if field not in seen:
                    seen.add(field)
                    out.append(ValidationError(field, env_item_shape(value), _ENV_EXPECTED))
                continue
            if not rest or not rest[0].startswith(branch):
                continue  # the other shape's complaint: not what the user meant
            rest = rest[1:]
            path = field + "".join(f"[{p}]" if p.isdigit() else f"[{p!r}]" for p in rest)
            out.append(ValidationError(path, env_item_shape(err.get("input")), _expected(err)))  # never an env value
            continue
        elif rest and not rest[0].isdigit() and rest[0].startswith(("int", "str", "constrained-str", "function-")):
            rest = rest[1:]  # a union member's tag
            if field in seen:
                continue
            seen.add(field)
        path = field + "".join(f"[{p}]" if p.isdigit() else f"[{p!r}]" for p in rest)
        out.append(ValidationError(path, err.get("input"), _expected(err)))
    return out


def _expected(err: Any) -> str:
    msg = str(err.get("msg", "a valid value"))
    if msg.startswith("Value error, "):
        return msg[len("Value error, ") :]
    if msg.startswith("Input should be "):
        msg = msg[len("Input should be ") :]
        return {"a valid string": "a string", "a valid dictionary": "a map", "a valid list": "a list"}.get(msg, msg)
    return msg


def env_list(env: dict[str, str] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalise ``{"A": "1"}`` or a list of EnvVar dicts to a list of EnvVar dicts.

    Example:
        >>> env_list({"A": "1"})
        [{'name': 'A', 'value': '1'}]
    """
    if isinstance(env, dict):
        return [{"name": k, "value": str(v)} for k, v in env.items()]
    return [dict(e) for e in env]


_INTEGRAL = re.compile(r"^[+-]?[0-9]+\.0+$")


def normalize_values(inputs: Mapping[str, Any]) -> dict[str, Any]:
    """Command, args and env values as strings, integral numbers without ``.0``: as the components take them.

    KFP hands pipeline parameters placed inside a list or dict input over as JSON numbers
    (``5.0`` for an ``int`` 5, sometimes already as the string ``"5.0"``), which an
    ``int`` command-line option rejects; a literal number or boolean (``env={"EPOCHS": 3}``)
    is taken as its text. The ``train_job`` component and :func:`~kfp_trainer.spec.build_trainjob`
    convert their inputs with this, so both accept the same values.

    Example:
        >>> normalize_values({"args": ["--steps", 5.0, "--lr", "0.5", "--n", "3.0"], "env": {"N": 2, "DEBUG": True}})
        {'args': ['--steps', '5', '--lr', '0.5', '--n', '3'], 'env': {'N': '2', 'DEBUG': 'true'}}
    """

    def norm(value: Any) -> Any:
        if isinstance(value, bool):
            return str(value).lower()
        if isinstance(value, float) and value.is_integer():
            return str(int(value))
        if isinstance(value, (int, float)):
            return str(value)
        if isinstance(value, str) and _INTEGRAL.match(value):
            return value.split(".")[0]
        return value

    out = dict(inputs)
    for key in ("command", "args"):
        if isinstance(out.get(key), list):
            out[key] = [norm(v) for v in out[key]]
    if isinstance(out.get("env"), dict):
        out["env"] = {k: norm(v) for k, v in out["env"].items()}
    return out
