"""What a user can ask of a TrainJob, validated, and the manifest it renders to. Pure: no I/O.

:class:`TrainJobInputs` holds the same inputs the ``train_job`` component takes.
:func:`validate` checks every one of them at once and raises
:class:`~kfp_trainer.errors.InvalidSpecErrors` naming each bad field, its value and what
is allowed. :func:`render` turns valid inputs into a ``trainer.kubeflow.org/v1alpha1``
TrainJob for the Trainer API the cluster serves:

* ``v2.2`` (Trainer v2.2 and later): pod settings go into ``spec.runtimePatches``;
* ``v2.1``: pod settings go into ``spec.podTemplateOverrides`` and JobSet labels into
  ``spec.labels`` / ``spec.annotations``.

Example:
    >>> inputs = TrainJobInputs(runtime="torch-distributed", num_nodes=2,
    ...                         run_id="run-1", task_name="train")
    >>> manifest = render(inputs, api_version="v2.2")
    >>> manifest["spec"]["trainer"]["numNodes"]
    2
"""

from __future__ import annotations

import copy
import json
import re
from typing import Any, Literal

import pydantic
from pydantic import BaseModel, ConfigDict, Field

from . import naming
from .errors import InvalidSpecErrors, ValidationError
from .quantity import is_quantity, parse_quantity

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
ANNOTATION_RUN = LABEL_PREFIX + "run-id"
ANNOTATION_TASK = LABEL_PREFIX + "task"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
TRAINER_JOBS = ("node", "launcher")
INITIALIZER_JOBS = ("dataset-initializer", "model-initializer")

ApiVersion = Literal["v2.1", "v2.2"]
API_VERSIONS: tuple[str, ...] = ("v2.1", "v2.2")

RESERVED_ENV_PREFIXES = ("PET_", "DMLC_", "OMPI_MCA_")
DATASET_SCHEMES = ("hf", "s3", "cache")
MODEL_SCHEMES = ("hf", "s3")
LOCAL_SCHEMES = ("builtin", "file")  # served by the local backend only
_ENV_NAME = re.compile(r"^[-._a-zA-Z][-._a-zA-Z0-9]*$")
_CREDENTIAL_ENV = re.compile(
    r"(^|_)(TOKEN|SECRET|PASSWORD|PASSWD|API_KEY|APIKEY|SECRET_ACCESS_KEY|PRIVATE_KEY)$",
    re.IGNORECASE,
)
_URI = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.+)$")
_DNS_SUBDOMAIN = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*$")
_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_QUALIFIED_NAME = re.compile(r"^([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]$")
_IMAGE = re.compile(r"^[^\s]+$")
_TOLERATION_OPERATORS = ("Exists", "Equal")
_TOLERATION_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
_AFFINITY_KEYS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
_RESOURCE_KEYS = ("limits", "requests", "claims")
_MAX_NODES = 1024


class TrainJobInputs(BaseModel):
    """Everything a user can ask of one TrainJob. Field names match the component inputs.

    Pod-level settings (volumes, mounts, node selector, tolerations, affinity, service
    account, image pull secrets, pod labels/annotations) apply to the trainer's replicated
    jobs (``node``, and ``launcher`` for MPI runtimes); list more in ``pod_targets``.
    """

    model_config = ConfigDict(extra="forbid", populate_by_name=True)

    # identity
    name: str = ""
    name_prefix: str = ""
    namespace: str = ""
    run_id: str = ""
    task_name: str = ""
    pipeline_name: str = ""
    # runtime
    runtime: str = "torch-distributed"
    runtime_kind: str = "ClusterTrainingRuntime"
    # trainer
    image: str = ""
    command: list[str] = Field(default_factory=list)
    args: list[str] = Field(default_factory=list)
    env: dict[str, str] | list[dict[str, Any]] = Field(default_factory=dict)
    num_nodes: int | None = None
    num_proc_per_node: int | str | None = None
    resources_per_node: dict[str, Any] = Field(default_factory=dict)
    # initializers
    dataset_uri: str = ""
    dataset_secret: str = ""
    dataset_env: dict[str, str] | list[dict[str, Any]] = Field(default_factory=dict)
    model_uri: str = ""
    model_secret: str = ""
    model_env: dict[str, str] | list[dict[str, Any]] = Field(default_factory=dict)
    # metadata
    labels: dict[str, str] = Field(default_factory=dict)
    annotations: dict[str, str] = Field(default_factory=dict)
    pod_labels: dict[str, str] = Field(default_factory=dict)
    pod_annotations: dict[str, str] = Field(default_factory=dict)
    # pod settings
    volumes: list[dict[str, Any]] = Field(default_factory=list)
    volume_mounts: list[dict[str, Any]] = Field(default_factory=list)
    node_selector: dict[str, str] = Field(default_factory=dict)
    tolerations: list[dict[str, Any]] = Field(default_factory=list)
    affinity: dict[str, Any] = Field(default_factory=dict)
    service_account: str = ""
    image_pull_secrets: list[str] = Field(default_factory=list)
    pod_targets: list[str] = Field(default_factory=list)
    # lifecycle
    active_deadline_seconds: int | None = None
    suspend: bool = False
    queue_name: str = ""
    patch: dict[str, Any] = Field(default_factory=dict)

    @classmethod
    def parse(cls, **inputs: Any) -> TrainJobInputs:
        """Build from keyword inputs, turning type errors into :class:`InvalidSpecErrors`.

        ``None`` means "not set" for every input, so optional component inputs can be
        passed straight through.
        """
        given = {k: v for k, v in inputs.items() if v is not None}
        unknown = sorted(set(given) - set(cls.model_fields))
        errors = [ValidationError(k, given[k], f"one of the known inputs ({', '.join(sorted(cls.model_fields))})") for k in unknown]
        if errors:
            raise InvalidSpecErrors(errors)
        try:
            return cls(**given)
        except pydantic.ValidationError as e:
            raise InvalidSpecErrors(
                [ValidationError(".".join(str(p) for p in err["loc"]), err.get("input"), err["msg"]) for err in e.errors()]
            ) from None

    def digest(self) -> str:
        """Digest of what the job runs (identity fields left out): tells iterations apart."""
        content = self.model_dump(exclude={"name", "name_prefix", "run_id", "task_name", "pipeline_name"})
        return naming.digest(json.dumps(content, sort_keys=True, default=str))


# --------------------------------------------------------------------------- validation


def env_list(env: dict[str, str] | list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Normalise ``{"A": "1"}`` or a list of EnvVar dicts to a list of EnvVar dicts."""
    if isinstance(env, dict):
        return [{"name": k, "value": str(v)} for k, v in env.items()]
    return [dict(e) for e in env]


def _check_env(field: str, env: list[dict[str, Any]], *, reserved: bool) -> list[ValidationError]:
    errors: list[ValidationError] = []
    seen: set[str] = set()
    for i, item in enumerate(env):
        where = f"{field}[{i}]"
        name = item.get("name")
        extra = set(item) - {"name", "value", "valueFrom"}
        if extra:
            errors.append(ValidationError(where, item, "an EnvVar with keys name, value or valueFrom"))
            continue
        if not isinstance(name, str) or not _ENV_NAME.match(name):
            errors.append(
                ValidationError(f"{where}.name", name, "an env var name: letters, digits, '_', '-', '.', not starting with a digit")
            )
            continue
        if name in seen:
            errors.append(ValidationError(f"{where}.name", name, "each env var name once"))
        seen.add(name)
        if reserved and name.upper().startswith(RESERVED_ENV_PREFIXES):
            errors.append(
                ValidationError(
                    f"{where}.name",
                    name,
                    f"a name not starting with {', '.join(RESERVED_ENV_PREFIXES)} (the Trainer "
                    "controller sets those itself; use num_nodes / num_proc_per_node)",
                )
            )
        if "value" in item and "valueFrom" in item:
            errors.append(ValidationError(where, item, "either value or valueFrom, not both"))
        if "valueFrom" in item:
            source = item["valueFrom"]
            if (
                not isinstance(source, dict)
                or len(source) != 1
                or next(iter(source))
                not in (
                    "secretKeyRef",
                    "configMapKeyRef",
                    "fieldRef",
                    "resourceFieldRef",
                )
            ):
                errors.append(
                    ValidationError(
                        f"{where}.valueFrom",
                        source,
                        "one of secretKeyRef, configMapKeyRef, fieldRef, resourceFieldRef",
                    )
                )
        elif item.get("value") and _CREDENTIAL_ENV.search(name):
            errors.append(
                ValidationError(
                    f"{where}.value",
                    "<hidden>",
                    f"no literal value for credential-like {name}: pass it by reference, e.g. "
                    f"{{'name': '{name}', 'valueFrom': {{'secretKeyRef': {{'name': 'my-secret', 'key': '{name.lower()}'}}}}}} "
                    "or the initializer's secret input",
                )
            )
    return errors


def _check_map(field: str, values: dict[str, str], *, label_values: bool) -> list[ValidationError]:
    errors: list[ValidationError] = []
    for key, value in values.items():
        prefix, _, name = key.rpartition("/")
        if (prefix and (len(prefix) > 253 or not _DNS_SUBDOMAIN.match(prefix))) or not (
            name and len(name) <= 63 and _QUALIFIED_NAME.match(name)
        ):
            errors.append(
                ValidationError(
                    f"{field}[{key!r}]",
                    key,
                    "a key [prefix/]name: name <= 63 characters of alphanumerics, '-', '_', '.', "
                    "starting and ending alphanumeric; prefix a DNS subdomain",
                )
            )
        if label_values and (len(value) > 63 or (value and not _QUALIFIED_NAME.match(value))):
            errors.append(
                ValidationError(
                    f"{field}[{key!r}]",
                    value,
                    "a label value: empty or <= 63 characters of alphanumerics, '-', '_', '.', starting and ending alphanumeric",
                )
            )
    return errors


def _check_uri(field: str, uri: str, schemes: tuple[str, ...]) -> list[ValidationError]:
    if not uri:
        return []
    match = _URI.match(uri)
    if not match or match.group(1).lower() not in schemes:
        allowed = ", ".join(f"{s}://" for s in schemes)
        return [ValidationError(field, uri, f"a URI starting with {allowed} (the Trainer initializer's schemes)")]
    if len(uri) > 2048:
        return [ValidationError(field, uri, "at most 2048 characters")]
    return []


def _check_dns_name(field: str, value: str, what: str) -> list[ValidationError]:
    if value and (len(value) > 253 or not _DNS_SUBDOMAIN.match(value)):
        return [ValidationError(field, value, f"a {what} name: lower-case DNS subdomain (RFC 1123)")]
    return []


def _check_resources(field: str, resources: dict[str, Any]) -> list[ValidationError]:
    errors: list[ValidationError] = []
    unknown = set(resources) - set(_RESOURCE_KEYS)
    if unknown:
        return [ValidationError(field, resources, "a ResourceRequirements dict with limits and/or requests")]
    for kind in ("limits", "requests"):
        for res, qty in (resources.get(kind) or {}).items():
            if not is_quantity(qty):
                errors.append(ValidationError(f"{field}.{kind}[{res!r}]", qty, "a Kubernetes quantity such as '2', '500m', '16Gi'"))
            elif parse_quantity(qty) < 0:
                errors.append(ValidationError(f"{field}.{kind}[{res!r}]", qty, "a quantity >= 0"))
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    for res, qty in requests.items():
        if res in limits and is_quantity(qty) and is_quantity(limits[res]):
            if parse_quantity(qty) > parse_quantity(limits[res]):
                errors.append(ValidationError(f"{field}.requests[{res!r}]", qty, f"at most the limit {limits[res]!r}"))
    return errors


def _check_pod_settings(inputs: TrainJobInputs) -> list[ValidationError]:
    errors: list[ValidationError] = []
    volume_names = set()
    for i, volume in enumerate(inputs.volumes):
        name = volume.get("name")
        if not isinstance(name, str) or not naming.RFC1035.match(name.replace(".", "-")):
            errors.append(ValidationError(f"volumes[{i}].name", name, "a DNS label naming the volume"))
        elif len(volume) < 2:
            errors.append(ValidationError(f"volumes[{i}]", volume, "a Volume with a source, e.g. persistentVolumeClaim"))
        volume_names.add(name)
    known_volumes = volume_names | {"initializer"}  # Trainer runtimes declare "initializer"
    for i, mount in enumerate(inputs.volume_mounts):
        if mount.get("name") not in known_volumes:
            errors.append(
                ValidationError(
                    f"volume_mounts[{i}].name",
                    mount.get("name"),
                    f"the name of a volume in volumes ({', '.join(sorted(known_volumes))})",
                )
            )
        path = mount.get("mountPath")
        if not isinstance(path, str) or not path.startswith("/"):
            errors.append(ValidationError(f"volume_mounts[{i}].mountPath", path, "an absolute path"))
    for i, tol in enumerate(inputs.tolerations):
        operator = tol.get("operator", "Equal")
        if operator not in _TOLERATION_OPERATORS:
            errors.append(ValidationError(f"tolerations[{i}].operator", operator, "Exists or Equal"))
        if tol.get("effect", "") not in _TOLERATION_EFFECTS:
            errors.append(ValidationError(f"tolerations[{i}].effect", tol.get("effect"), "NoSchedule, PreferNoSchedule or NoExecute"))
        if operator == "Exists" and tol.get("value"):
            errors.append(ValidationError(f"tolerations[{i}].value", tol.get("value"), "no value with operator Exists"))
    bad_affinity = set(inputs.affinity) - set(_AFFINITY_KEYS)
    if bad_affinity:
        errors.append(ValidationError("affinity", sorted(bad_affinity), f"keys among {', '.join(_AFFINITY_KEYS)}"))
    errors += _check_map("node_selector", inputs.node_selector, label_values=True)
    errors += _check_dns_name("service_account", inputs.service_account, "service account")
    for i, secret in enumerate(inputs.image_pull_secrets):
        errors += _check_dns_name(f"image_pull_secrets[{i}]", secret, "Secret")
    for i, target in enumerate(inputs.pod_targets):
        if target not in TRAINER_JOBS + INITIALIZER_JOBS:
            errors.append(ValidationError(f"pod_targets[{i}]", target, f"a replicated job: {', '.join(TRAINER_JOBS + INITIALIZER_JOBS)}"))
    return errors


def validate(inputs: TrainJobInputs, *, api_version: ApiVersion | None = "v2.2", local: bool = False) -> TrainJobInputs:
    """Check every input; raise one :class:`InvalidSpecErrors` listing all problems.

    With ``api_version=None`` the checks that depend on the cluster's Trainer version are
    left for :func:`render` (the launcher validates this way before any API call).
    ``local=True`` also accepts the initializer URIs only local mode serves
    (``builtin://``, ``file://``).

    Returns:
        ``inputs`` unchanged, for chaining.

    Example:
        >>> validate(TrainJobInputs(num_nodes=0, run_id="r1"))
        Traceback (most recent call last):
        ...
        kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
          - num_nodes: got 0; expected an integer from 1 to 1024
    """
    e: list[ValidationError] = []
    if api_version is not None and api_version not in API_VERSIONS:
        e.append(ValidationError("api_version", api_version, f"one of {', '.join(API_VERSIONS)} or auto"))
    if not inputs.runtime:
        e.append(ValidationError("runtime", inputs.runtime, "the name of a ClusterTrainingRuntime or TrainingRuntime"))
    else:
        e += _check_dns_name("runtime", inputs.runtime, "runtime")
    if inputs.runtime_kind not in ("ClusterTrainingRuntime", "TrainingRuntime"):
        e.append(ValidationError("runtime_kind", inputs.runtime_kind, "ClusterTrainingRuntime or TrainingRuntime"))
    if inputs.namespace and (len(inputs.namespace) > 63 or not _DNS_LABEL.match(inputs.namespace)):
        e.append(ValidationError("namespace", inputs.namespace, "a namespace name: RFC-1123 label, <= 63 characters"))
    if inputs.image and (len(inputs.image) > 500 or not _IMAGE.match(inputs.image)):
        e.append(ValidationError("image", inputs.image, "an image reference without spaces, <= 500 characters"))
    if len(inputs.command) > 128 or len(inputs.args) > 128:
        e.append(ValidationError("command/args", len(inputs.command) + len(inputs.args), "at most 128 items each"))
    if inputs.num_nodes is not None and not (1 <= inputs.num_nodes <= _MAX_NODES):
        e.append(ValidationError("num_nodes", inputs.num_nodes, f"an integer from 1 to {_MAX_NODES}"))
    ppn = inputs.num_proc_per_node
    if isinstance(ppn, str):
        if ppn.isdigit():
            ppn = int(ppn)
        elif api_version in ("v2.1", None) and ppn in ("auto", "cpu", "gpu"):
            ppn = None
        else:
            allowed = "an integer >= 1" + (" or auto, cpu, gpu" if api_version == "v2.1" else " (Trainer v2.2+ takes integers only)")
            e.append(ValidationError("num_proc_per_node", inputs.num_proc_per_node, allowed))
            ppn = None
    if isinstance(ppn, int) and ppn < 1:
        e.append(ValidationError("num_proc_per_node", ppn, "an integer >= 1"))
    e += _check_resources("resources_per_node", inputs.resources_per_node)
    e += _check_env("env", env_list(inputs.env), reserved=True)
    extra = LOCAL_SCHEMES if local else ()
    e += _check_uri("dataset_uri", inputs.dataset_uri, DATASET_SCHEMES + extra)
    e += _check_uri("model_uri", inputs.model_uri, MODEL_SCHEMES + extra)
    e += _check_dns_name("dataset_secret", inputs.dataset_secret, "Secret")
    e += _check_dns_name("model_secret", inputs.model_secret, "Secret")
    e += _check_env("dataset_env", env_list(inputs.dataset_env), reserved=False)
    e += _check_env("model_env", env_list(inputs.model_env), reserved=False)
    for field, uri, secret, env in (
        ("dataset", inputs.dataset_uri, inputs.dataset_secret, inputs.dataset_env),
        ("model", inputs.model_uri, inputs.model_secret, inputs.model_env),
    ):
        if (secret or env) and not uri:
            e.append(ValidationError(f"{field}_uri", uri, f"a URI when {field}_secret or {field}_env is set"))
    e += _check_map("labels", inputs.labels, label_values=True)
    e += _check_map("pod_labels", inputs.pod_labels, label_values=True)
    e += _check_map("annotations", inputs.annotations, label_values=False)
    e += _check_map("pod_annotations", inputs.pod_annotations, label_values=False)
    e += _check_pod_settings(inputs)
    if inputs.active_deadline_seconds is not None:
        if inputs.active_deadline_seconds < 1:
            e.append(ValidationError("active_deadline_seconds", inputs.active_deadline_seconds, "an integer >= 1"))
        elif api_version == "v2.1":
            e.append(
                ValidationError(
                    "active_deadline_seconds", inputs.active_deadline_seconds, "unset: Trainer v2.1 has no activeDeadlineSeconds (v2.2+)"
                )
            )
    if inputs.queue_name and (len(inputs.queue_name) > 63 or not _QUALIFIED_NAME.match(inputs.queue_name)):
        e.append(
            ValidationError(
                "queue_name",
                inputs.queue_name,
                f"a label value (it becomes the {QUEUE_LABEL} label): <= 63 "
                "characters of alphanumerics, '-', '_', '.', starting and ending alphanumeric",
            )
        )
    if inputs.name:
        try:
            naming.check_name(inputs.name, naming.DNS_LABEL_MAX)
        except ValidationError as err:
            e.append(err)
    if inputs.name_prefix:
        try:
            naming.trainjob_name(run_id="", task_name="", prefix=inputs.name_prefix)
        except ValidationError as err:
            e.append(err)
    if not inputs.name and not inputs.run_id:
        e.append(ValidationError("run_id", inputs.run_id, "the KFP run id (or an explicit name) to derive a stable name"))
    if e:
        raise InvalidSpecErrors(e)
    return inputs


# --------------------------------------------------------------------------- rendering


def deep_merge(base: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """Merge ``patch`` into a copy of ``base``: dicts merge, other values replace, ``None`` deletes.

    Example:
        >>> deep_merge({"a": {"b": 1, "c": 2}}, {"a": {"c": None, "d": 3}})
        {'a': {'b': 1, 'd': 3}}
    """
    out = copy.deepcopy(base)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def lineage_labels(inputs: TrainJobInputs) -> dict[str, str]:
    """Labels that tie a TrainJob (and its JobSet and pods) to its pipeline run and task."""
    labels = {"app.kubernetes.io/managed-by": "kfp-trainer", LABEL_DIGEST: inputs.digest()}
    if inputs.run_id:
        labels[LABEL_RUN] = naming.label_value(inputs.run_id)
    if inputs.task_name:
        labels[LABEL_TASK] = naming.label_value(inputs.task_name)
    if inputs.pipeline_name:
        labels[LABEL_PIPELINE] = naming.label_value(inputs.pipeline_name)
    return labels


def resolve_name(inputs: TrainJobInputs, *, max_length: int | None = None) -> str:
    """The TrainJob's name: the explicit one, else derived from run, task and inputs."""
    budget = naming.max_name_length() if max_length is None else max_length
    if inputs.name:
        return naming.check_name(inputs.name, budget)
    return naming.trainjob_name(
        run_id=inputs.run_id,
        task_name=inputs.task_name,
        prefix=inputs.name_prefix,
        discriminator=inputs.digest(),
        max_length=budget,
    )


def _trainer(inputs: TrainJobInputs) -> dict[str, Any]:
    trainer: dict[str, Any] = {}
    if inputs.image:
        trainer["image"] = inputs.image
    if inputs.command:
        trainer["command"] = list(inputs.command)
    if inputs.args:
        trainer["args"] = list(inputs.args)
    if inputs.env:
        trainer["env"] = env_list(inputs.env)
    if inputs.num_nodes is not None:
        trainer["numNodes"] = inputs.num_nodes
    ppn = inputs.num_proc_per_node
    if ppn is not None:
        trainer["numProcPerNode"] = int(ppn) if isinstance(ppn, int) or str(ppn).isdigit() else ppn
    if inputs.resources_per_node:
        trainer["resourcesPerNode"] = copy.deepcopy(inputs.resources_per_node)
    return trainer


def _initializer(inputs: TrainJobInputs) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, uri, secret, env in (
        ("dataset", inputs.dataset_uri, inputs.dataset_secret, inputs.dataset_env),
        ("model", inputs.model_uri, inputs.model_secret, inputs.model_env),
    ):
        if not uri:
            continue
        item: dict[str, Any] = {"storageUri": uri}
        if env:
            item["env"] = env_list(env)
        if secret:
            item["secretRef"] = {"name": secret}
        out[key] = item
    return out


def _pod_spec_patch(inputs: TrainJobInputs, job: str, api_version: ApiVersion) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if inputs.service_account:
        spec["serviceAccountName"] = inputs.service_account
    if inputs.volumes:
        spec["volumes"] = copy.deepcopy(inputs.volumes)
    if inputs.volume_mounts:
        container = "node" if job in TRAINER_JOBS else job
        spec["containers"] = [{"name": container, "volumeMounts": copy.deepcopy(inputs.volume_mounts)}]
    if inputs.image_pull_secrets:
        spec["imagePullSecrets"] = [{"name": s} for s in inputs.image_pull_secrets]
    if inputs.node_selector:
        spec["nodeSelector"] = dict(inputs.node_selector)
    if inputs.affinity:
        spec["affinity"] = copy.deepcopy(inputs.affinity)
    if inputs.tolerations:
        spec["tolerations"] = copy.deepcopy(inputs.tolerations)
    return spec


def pod_targets(inputs: TrainJobInputs, runtime_jobs: list[str] | None) -> list[str]:
    """Replicated jobs that get the pod settings: the trainer's, plus ``pod_targets``.

    With the runtime's job names known, targets the runtime lacks are dropped (a patch for
    a missing replicated job is an error on the server).
    """
    wanted = list(dict.fromkeys(["node", *inputs.pod_targets]))
    if runtime_jobs is None:
        return wanted
    if "launcher" in runtime_jobs and "launcher" not in wanted:
        wanted.append("launcher")
    return [j for j in wanted if j in runtime_jobs]


def render(
    inputs: TrainJobInputs,
    *,
    api_version: ApiVersion = "v2.2",
    runtime_jobs: list[str] | None = None,
    max_name_length: int | None = None,
    local: bool = False,
) -> dict[str, Any]:
    """Validate ``inputs`` and render the TrainJob manifest for ``api_version``.

    Args:
        inputs: What to run.
        api_version: ``"v2.2"`` (runtimePatches, Trainer v2.2+) or ``"v2.1"``
            (podTemplateOverrides).
        runtime_jobs: Replicated job names of the referenced runtime, when known.
        max_name_length: Name budget for the runtime, when known.
        local: Render for the local backend (accepts ``builtin://`` and ``file://`` URIs).

    Returns:
        The TrainJob as a dict, ready for ``kubectl apply`` or the API.

    Raises:
        InvalidSpecErrors: Any input is invalid (all problems listed).
    """
    validate(inputs, api_version=api_version, local=local)
    name = resolve_name(inputs, max_length=max_name_length)
    lineage = lineage_labels(inputs)
    metadata: dict[str, Any] = {"name": name, "labels": dict(lineage)}
    if inputs.namespace:
        metadata["namespace"] = inputs.namespace
    if inputs.queue_name:
        metadata["labels"][QUEUE_LABEL] = inputs.queue_name
    annotations = {}
    if inputs.run_id:
        annotations[ANNOTATION_RUN] = inputs.run_id
    if inputs.task_name:
        annotations[ANNOTATION_TASK] = inputs.task_name
    if annotations:
        metadata["annotations"] = annotations

    spec: dict[str, Any] = {"runtimeRef": {"apiGroup": GROUP, "kind": inputs.runtime_kind, "name": inputs.runtime}}
    initializer = _initializer(inputs)
    if initializer:
        spec["initializer"] = initializer
    trainer = _trainer(inputs)
    if trainer:
        spec["trainer"] = trainer
    if inputs.suspend:
        spec["suspend"] = True
    if inputs.active_deadline_seconds is not None:
        spec["activeDeadlineSeconds"] = inputs.active_deadline_seconds

    jobset_labels = {**lineage, **inputs.labels}
    jobset_annotations = dict(inputs.annotations)
    pod_labels = {**lineage, **inputs.pod_labels}
    pod_annotations = dict(inputs.pod_annotations)
    targets = pod_targets(inputs, runtime_jobs)
    if api_version == "v2.1":
        spec["labels"] = jobset_labels
        if jobset_annotations:
            spec["annotations"] = jobset_annotations
        overrides = []
        for job in targets:
            override: dict[str, Any] = {"targetJobs": [{"name": job}], "metadata": _metadata(pod_labels, pod_annotations)}
            pod_spec = _pod_spec_patch(inputs, job, api_version)
            if pod_spec:
                override["spec"] = pod_spec
            overrides.append(override)
        spec["podTemplateOverrides"] = overrides
    else:
        replicated = [
            {
                "name": job,
                "template": {
                    "spec": {
                        "template": _without_empty(
                            {"metadata": _metadata(pod_labels, pod_annotations), "spec": _pod_spec_patch(inputs, job, api_version)}
                        )
                    }
                },
            }
            for job in targets
        ]
        spec["runtimePatches"] = [
            {
                "manager": MANAGER,
                "trainingRuntimeSpec": {
                    "template": {
                        "metadata": _metadata(jobset_labels, jobset_annotations),
                        "spec": {"replicatedJobs": replicated},
                    }
                },
            }
        ]
    manifest = {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}
    if inputs.patch:
        manifest = deep_merge(manifest, inputs.patch)
        _check_patched(manifest, api_version)
    return manifest


def _metadata(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"labels": dict(labels)}
    if annotations:
        out["annotations"] = dict(annotations)
    return out


def _without_empty(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v}


def dig(obj: Any, *keys: str) -> Any:
    """``obj[k1][k2]...``, or ``None`` where a level is missing (or not a mapping).

    Example:
        >>> dig({"spec": {"template": {}}}, "spec", "template", "spec")
    """
    for key in keys:
        if not isinstance(obj, dict):
            return None
        obj = obj.get(key)
    return obj


def _check_patched(manifest: dict[str, Any], api_version: ApiVersion) -> None:
    """Re-check what a raw ``patch`` may have broken: the name and env the webhook rejects."""
    errors: list[ValidationError] = []
    name = manifest.get("metadata", {}).get("name", "")
    if not isinstance(name, str) or not naming.RFC1035.match(name) or len(name) > naming.DNS_LABEL_MAX:
        errors.append(ValidationError("patch.metadata.name", name, "an RFC-1035 label of at most 63 characters"))
    spec = manifest.get("spec", {})
    errors += _check_env("patch.spec.trainer.env", (spec.get("trainer") or {}).get("env") or [], reserved=True)
    rejected = ("node", "dataset-initializer", "model-initializer")
    for patch in spec.get("runtimePatches") or []:
        jobs = dig(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs") or []
        for job in jobs:
            containers = dig(job, "template", "spec", "template", "spec", "containers") or []
            for container in containers:
                if container.get("name") in rejected and container.get("env"):
                    errors.append(
                        ValidationError(
                            f"patch.runtimePatches[{job.get('name')}].containers[{container['name']}].env",
                            container["env"],
                            "no env patch on the node or initializer containers (the Trainer webhook "
                            "rejects it): use env, dataset_env or model_env",
                        )
                    )
    if api_version == "v2.2" and "podTemplateOverrides" in spec:
        errors.append(
            ValidationError("patch.spec.podTemplateOverrides", "...", "runtimePatches (podTemplateOverrides was removed in Trainer v2.2)")
        )
    if errors:
        raise InvalidSpecErrors(errors)


def build_trainjob(*, api_version: ApiVersion = "v2.2", **inputs: Any) -> dict[str, Any]:
    """Render the TrainJob manifest from the same inputs the ``train_job`` component takes.

    Example:
        >>> m = build_trainjob(runtime="torch-distributed", run_id="r1", task_name="train",
        ...                    num_nodes=2, env={"EPOCHS": "3"})
        >>> m["spec"]["trainer"]["env"]
        [{'name': 'EPOCHS', 'value': '3'}]
    """
    return render(TrainJobInputs.parse(**inputs), api_version=api_version)
