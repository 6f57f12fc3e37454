"""Every rule about the inputs of one TrainJob, checked at once before anything is created. Pure.

:func:`validate` runs the value rules of :mod:`~kfp_trainer.spec.rules` over each input
and, when the inputs are otherwise valid, renders the job and checks the merged ``patch``
with :mod:`~kfp_trainer.spec.policy`. All problems are raised together as one
:class:`~kfp_trainer.errors.InvalidSpecErrors`; each names the field, shows the value
(``<hidden>`` for anything secret-like, see :mod:`kfp_trainer.redaction`) and says what
is allowed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from .. import naming
from ..dicts import dig
from ..errors import InvalidSpecErrors, ValidationError
from . import env_rules, placeholders, rules
from .host_access import HOST_ADMIN
from .inputs import (
    API_VERSIONS,
    DATASET_SCHEMES,
    INITIALIZER_JOBS,
    INT64_MAX,
    LABEL_MANAGED_BY,
    LABEL_PREFIX,
    LOCAL_SCHEMES,
    MAX_ANNOTATIONS_BYTES,
    MAX_LIST_ITEMS,
    MAX_NODES,
    MAX_PROC_PER_NODE,
    MODEL_SCHEMES,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    RESERVED_ENV_PREFIXES,
    TRAINER_JOBS,
    ApiVersion,
    TrainJobInputs,
    env_list,
)
from .manifest import build, pod_targets
from .pod_fields import check_pod_fields, check_runtime_init_containers
from .policy import check_manifest

_TOLERATION_OPERATORS = ("Exists", "Equal")
_TOLERATION_EFFECTS = ("", "NoSchedule", "PreferNoSchedule", "NoExecute")
_AFFINITY_KEYS = ("nodeAffinity", "podAffinity", "podAntiAffinity")
_MAX_IDENTITY = 1024


def _check_volumes(inputs: TrainJobInputs, allow_host_access: bool | None) -> list[ValidationError]:
    errors: list[ValidationError] = []
    names: set[str] = set()
    for i, volume in enumerate(inputs.volumes):
        name = volume.get("name")
        if not isinstance(name, str) or not rules.ok(rules.DNS_LABEL, name, 63):
            errors.append(ValidationError(f"volumes[{i}].name", name, "a DNS label naming the volume"))
            continue
        names.add(name)
        sources = set(volume) - {"name"}
        if len(sources) != 1:
            errors.append(ValidationError(f"volumes[{i}]", volume, "a Volume with a source (exactly one), e.g. persistentVolumeClaim"))
        elif "hostPath" in sources and allow_host_access is False:
            errors.append(ValidationError(f"volumes[{i}].hostPath", volume["hostPath"], "another volume source: " + HOST_ADMIN))
    known = names | {"initializer"}  # Trainer runtimes declare "initializer"
    for i, mount in enumerate(inputs.volume_mounts):
        if mount.get("name") not in known:
            errors.append(
                ValidationError(
                    f"volume_mounts[{i}].name", mount.get("name"), f"the name of a volume in volumes ({', '.join(sorted(known))})"
                )
            )
        errors += rules.check_local_path(f"volume_mounts[{i}].mountPath", mount.get("mountPath"), absolute=True)
        if "subPath" in mount:
            errors += rules.check_local_path(f"volume_mounts[{i}].subPath", mount["subPath"], absolute=False)
        if mount.get("mountPropagation") == "Bidirectional" and allow_host_access is False:
            errors.append(
                ValidationError(f"volume_mounts[{i}].mountPropagation", "Bidirectional", "None or HostToContainer: " + HOST_ADMIN)
            )
    return errors


def _check_scheduling(inputs: TrainJobInputs) -> list[ValidationError]:
    errors: list[ValidationError] = []
    for i, tol in enumerate(inputs.tolerations):
        operator = tol.get("operator", "Equal")
        if operator not in _TOLERATION_OPERATORS:
            errors.append(ValidationError(f"tolerations[{i}].operator", operator, "Exists or Equal"))
        if tol.get("effect", "") not in _TOLERATION_EFFECTS:
            errors.append(ValidationError(f"tolerations[{i}].effect", tol.get("effect"), "NoSchedule, PreferNoSchedule or NoExecute"))
        if operator == "Exists" and tol.get("value"):
            errors.append(ValidationError(f"tolerations[{i}].value", tol.get("value"), "no value with operator Exists"))
        key, value = tol.get("key", ""), tol.get("value", "")
        if key != "" and not rules.ok(rules.QUALIFIED_NAME, str(key).rpartition("/")[2] if isinstance(key, str) else None, 63):
            errors.append(ValidationError(f"tolerations[{i}].key", key, "a taint key: [prefix/]name"))
        if value != "" and not rules.ok(rules.QUALIFIED_NAME, value, 63):
            errors.append(
                ValidationError(f"tolerations[{i}].value", value, "a taint value: <= 63 characters of alphanumerics, '-', '_', '.'")
            )
        seconds = tol.get("tolerationSeconds")
        if seconds is not None and (isinstance(seconds, bool) or not isinstance(seconds, int)):
            errors.append(ValidationError(f"tolerations[{i}].tolerationSeconds", seconds, "a whole number of seconds"))
    bad_affinity = set(inputs.affinity) - set(_AFFINITY_KEYS)
    if bad_affinity:
        errors.append(ValidationError("affinity", sorted(bad_affinity), f"keys among {', '.join(_AFFINITY_KEYS)}"))
    errors += rules.check_map("node_selector", inputs.node_selector, label_values=True)
    errors += rules.check_dns_name("service_account", inputs.service_account, "service account")
    for i, secret in enumerate(inputs.image_pull_secrets):
        errors += rules.check_dns_name(f"image_pull_secrets[{i}]", secret, "Secret")
    for i, target in enumerate(inputs.pod_targets):
        if target not in TRAINER_JOBS + INITIALIZER_JOBS:
            errors.append(ValidationError(f"pod_targets[{i}]", target, f"a replicated job: {', '.join(TRAINER_JOBS + INITIALIZER_JOBS)}"))
    return errors


def _check_trainer(inputs: TrainJobInputs, api_version: ApiVersion | None) -> list[ValidationError]:
    e: list[ValidationError] = []
    if inputs.image and not rules.ok(rules.IMAGE, inputs.image, 500):
        e.append(
            ValidationError("image", inputs.image, "an image reference without spaces, <= 500 characters (registry/name:tag[@digest])")
        )
    for field in ("command", "args", "resume_args"):
        items = getattr(inputs, field)
        if len(items) > MAX_LIST_ITEMS:
            e.append(ValidationError(field, f"{len(items)} items", f"at most {MAX_LIST_ITEMS} items"))
        e += rules.check_args(field, items)
    if inputs.num_nodes is not None and not (1 <= inputs.num_nodes <= MAX_NODES):
        e.append(ValidationError("num_nodes", inputs.num_nodes, f"an integer from 1 to {MAX_NODES}"))
    ppn = inputs.num_proc_per_node
    if isinstance(ppn, str):
        words = api_version in ("v2.1", None) and ppn in ("auto", "cpu", "gpu")
        if not words:
            allowed = "an integer >= 1" + (" or auto, cpu, gpu" if api_version == "v2.1" else " (Trainer v2.2+ takes integers only)")
            e.append(ValidationError("num_proc_per_node", ppn, allowed))
    elif ppn is not None and not (1 <= ppn <= MAX_PROC_PER_NODE):
        e.append(ValidationError("num_proc_per_node", ppn, f"an integer >= 1 (at most {MAX_PROC_PER_NODE})"))
    # whole devices (no half GPU) are checked with each quantity, in rules.check_quantity
    e += rules.check_resources("resources_per_node", inputs.resources_per_node) or rules.check_structure(
        "resources_per_node", inputs.resources_per_node
    )
    e += env_rules.check_env("env", env_list(inputs.env), reserved=RESERVED_ENV_PREFIXES, file_refs=False)
    e += placeholders.unknown_placeholder_errors({"command": inputs.command, "args": inputs.args, "env": inputs.env})
    return e


def _check_initializers(inputs: TrainJobInputs, local: bool) -> list[ValidationError]:
    e: list[ValidationError] = []
    extra = LOCAL_SCHEMES if local else ()
    e += rules.check_uri("dataset_uri", inputs.dataset_uri, DATASET_SCHEMES + extra)
    e += rules.check_uri("model_uri", inputs.model_uri, MODEL_SCHEMES + extra)
    e += rules.check_dns_name("dataset_secret", inputs.dataset_secret, "Secret")
    e += rules.check_dns_name("model_secret", inputs.model_secret, "Secret")
    e += env_rules.check_env("dataset_env", env_list(inputs.dataset_env), file_refs=False)
    e += env_rules.check_env("model_env", env_list(inputs.model_env), file_refs=False)
    for field, uri, secret, env in (
        ("dataset", inputs.dataset_uri, inputs.dataset_secret, inputs.dataset_env),
        ("model", inputs.model_uri, inputs.model_secret, inputs.model_env),
    ):
        if (secret or env) and not uri:
            e.append(ValidationError(f"{field}_uri", uri, f"a URI when {field}_secret or {field}_env is set"))
    return e


def _check_identity(inputs: TrainJobInputs) -> list[ValidationError]:
    e: list[ValidationError] = []
    if not inputs.runtime:
        e.append(ValidationError("runtime", inputs.runtime, "the name of a ClusterTrainingRuntime or TrainingRuntime"))
    else:
        e += rules.check_dns_name("runtime", inputs.runtime, "runtime")
    if inputs.runtime_kind not in ("ClusterTrainingRuntime", "TrainingRuntime"):
        e.append(ValidationError("runtime_kind", inputs.runtime_kind, "ClusterTrainingRuntime or TrainingRuntime"))
    e += rules.check_dns_name("namespace", inputs.namespace, "namespace", label=True)
    for field in ("run_id", "task_name", "pipeline_name", "task_id"):
        e += rules.check_text(field, getattr(inputs, field), max_bytes=_MAX_IDENTITY)
    checks: tuple[tuple[Callable[[str], object], str | None], ...] = (
        (lambda v: naming.check_name(v, naming.DNS_LABEL_MAX), inputs.name),
        (lambda v: naming.trainjob_name(run_id="", task_name="", prefix=v), inputs.name_prefix),
    )
    for check, value in checks:
        if value:
            try:
                check(value)
            except ValidationError as err:
                e.append(err)
    if not inputs.name and not inputs.run_id:
        e.append(ValidationError("run_id", inputs.run_id, "the KFP run id (or an explicit name) to derive a stable name"))
    return e


def _check_lifecycle(inputs: TrainJobInputs, api_version: ApiVersion | None) -> list[ValidationError]:
    e: list[ValidationError] = []
    if inputs.active_deadline_seconds is not None:
        if not 1 <= inputs.active_deadline_seconds <= INT64_MAX:
            e.append(ValidationError("active_deadline_seconds", inputs.active_deadline_seconds, "an integer >= 1"))
        elif api_version == "v2.1":
            e.append(
                ValidationError(
                    "active_deadline_seconds", inputs.active_deadline_seconds, "unset: Trainer v2.1 has no activeDeadlineSeconds (v2.2+)"
                )
            )
    if inputs.queue_name and not rules.ok(rules.QUALIFIED_NAME, inputs.queue_name, 63):
        e.append(
            ValidationError(
                "queue_name",
                inputs.queue_name,
                f"a label value (it becomes the {QUEUE_LABEL} label): <= 63 characters of alphanumerics, '-', '_', '.', "
                "starting and ending alphanumeric",
            )
        )
    if inputs.priority_class and not rules.ok(rules.DNS_SUBDOMAIN, inputs.priority_class, 63):
        e.append(
            ValidationError(
                "priority_class",
                inputs.priority_class,
                f"the name of a Kueue WorkloadPriorityClass (it becomes the {PRIORITY_LABEL} label): <= 63 characters of "
                "lowercase alphanumerics, '-' and '.', starting and ending alphanumeric",
            )
        )
    return e


def validate(
    inputs: TrainJobInputs,
    *,
    api_version: ApiVersion | None = "v2.2",
    local: bool = False,
    allow_host_access: bool | None = None,
) -> TrainJobInputs:
    """Check every input; raise one :class:`InvalidSpecErrors` listing all problems.

    With ``api_version=None`` the checks that depend on the cluster's Trainer version are
    left for :func:`~kfp_trainer.spec.render` (the launcher validates this way before any
    API call); likewise ``allow_host_access=None`` (the default) leaves the host-access
    policy to ``render``, which knows the runtime. ``local=True`` also accepts the
    initializer URIs only local mode serves (``builtin://``, ``file://``).

    Returns:
        ``inputs`` unchanged, for chaining.

    Example:
        >>> validate(TrainJobInputs(num_nodes=0, run_id="r1"))
        Traceback (most recent call last):
        ...
        kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
          - num_nodes: got 0; expected an integer from 1 to 1024
    """
    # the runtime's name budget is checked by render; here only the RFC-1035 limit
    _, e = checked_build(inputs, api_version=api_version, local=local, allow_host_access=allow_host_access,
                         max_name_length=naming.DNS_LABEL_MAX)  # fmt: skip
    if e:
        raise InvalidSpecErrors(e)
    return inputs


def checked_build(
    inputs: TrainJobInputs,
    *,
    api_version: ApiVersion | None,
    local: bool = False,
    allow_host_access: bool | None = None,
    runtime_jobs: list[str] | None = None,
    max_name_length: int | None = None,
    init_containers: Mapping[str, Sequence[str]] | None = None,
) -> tuple[dict[str, Any] | None, list[ValidationError]]:
    """``(manifest, problems)``: the one check-and-build under :func:`validate` and :func:`~kfp_trainer.spec.render`.

    Every input rule (:func:`input_errors`); when they pass, the job built once
    (:func:`~kfp_trainer.spec.manifest.build`) and checked as built -- the ``patch`` merged, the
    policy, the size -- and, with the runtime's facts, its init containers and initializer jobs.
    ``manifest`` is None when the inputs themselves fail. Pure.
    """
    errors = input_errors(inputs, api_version=api_version, local=local, allow_host_access=allow_host_access)
    if init_containers is not None and inputs.init_containers and not errors:
        errors = check_runtime_init_containers(inputs, pod_targets(inputs, runtime_jobs), init_containers)
    if errors:
        return None, errors
    try:
        base, manifest = build(
            inputs, api_version=api_version or "v2.2", runtime_jobs=runtime_jobs, max_name_length=max_name_length,
            init_containers=init_containers,
        )  # fmt: skip
    except ValidationError as err:  # the name does not fit the budget
        return None, [err]
    errors = check_manifest(manifest, base=base, api_version=api_version, allow_host_access=allow_host_access, local=local)
    if runtime_jobs is not None and not local:
        errors += _check_initializer_jobs(manifest, runtime_jobs, patched=bool(inputs.patch))
    return manifest, _unique(errors)


def _check_initializer_jobs(manifest: dict[str, Any], runtime_jobs: list[str], *, patched: bool) -> list[ValidationError]:
    """The Trainer webhook refuses initializer input on a runtime without that initializer job: say so first."""
    errors = []
    for key, job in (("dataset", "dataset-initializer"), ("model", "model-initializer")):
        if key in (dig(manifest, "spec", "initializer") or {}) and job not in runtime_jobs:
            ref = dig(manifest, "spec", "runtimeRef") or {}
            errors.append(
                ValidationError(
                    f"{key}_uri" if not patched else f"{key}_uri (or patch.spec.initializer.{key})",
                    dig(manifest, "spec", "initializer", key, "storageUri"),
                    f"no {key} initializer on runtime {ref.get('kind', '')}/{ref.get('name', '')}, which has no {job} job "
                    f"(its jobs: {', '.join(runtime_jobs) or 'none'}): pick a runtime with one (e.g. a torchtune-* runtime), "
                    f"or pass the {key} as an input artifact",
                )
            )
    return errors


def input_errors(
    inputs: TrainJobInputs,
    *,
    api_version: ApiVersion | None = "v2.2",
    local: bool = False,
    allow_host_access: bool | None = None,
) -> list[ValidationError]:
    """Every problem of the inputs themselves, field by field (:func:`validate` without the rendered job's checks)."""
    e: list[ValidationError] = []
    if api_version is not None and api_version not in API_VERSIONS:
        e.append(ValidationError("api_version", api_version, f"one of {', '.join(API_VERSIONS)} or auto"))
        api_version = None
    e += _check_identity(inputs)
    e += _check_trainer(inputs, api_version)
    e += _check_initializers(inputs, local)
    for field, label_values in (("labels", True), ("pod_labels", True), ("annotations", False), ("pod_annotations", False)):
        values = getattr(inputs, field)
        e += rules.check_map(field, values, label_values=label_values)
        size = sum(len(k.encode("utf-8", "surrogatepass")) + len(v.encode("utf-8", "surrogatepass")) for k, v in values.items())
        if not label_values and size > MAX_ANNOTATIONS_BYTES:
            e.append(
                ValidationError(field, rules.size_text(size), f"annotations of at most {rules.size_text(MAX_ANNOTATIONS_BYTES)} in all")
            )
        for key in values:
            if key.startswith(LABEL_PREFIX) or key == LABEL_MANAGED_BY:
                e.append(
                    ValidationError(
                        f"{field}[{key!r}]", key, f"a key outside {LABEL_PREFIX} and {LABEL_MANAGED_BY} (the launcher's lineage)"
                    )
                )
    for field in ("volumes", "volume_mounts", "tolerations", "affinity", "patch"):
        e += rules.check_structure(field, getattr(inputs, field))
    e += _check_volumes(inputs, allow_host_access) + _check_scheduling(inputs)
    e += _check_lifecycle(inputs, api_version)
    e += check_pod_fields(inputs, api_version, allow_host_access)
    return _unique(e)


def _unique(errors: list[ValidationError]) -> list[ValidationError]:
    seen: set[tuple[str, str]] = set()
    out = []
    for error in errors:
        key = (error.field, error.allowed)
        if key not in seen:
            seen.add(key)
            out.append(error)
    return out
