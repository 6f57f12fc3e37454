"""Valid inputs -> the TrainJob manifest for the Trainer API the cluster serves. Pure: no I/O.

* ``v2.2`` (Trainer v2.2 and later): pod settings go into ``spec.runtimePatches``;
* ``v2.1``: pod settings go into ``spec.podTemplateOverrides`` and JobSet labels into
  ``spec.labels`` / ``spec.annotations``.

:func:`render` validates first and checks the result once the ``patch`` is merged
(:mod:`kfp_trainer.spec.policy`), so what it returns is safe to send.

Example:
    >>> from kfp_trainer.spec import TrainJobInputs
    >>> manifest = render(TrainJobInputs(runtime="torch-distributed", num_nodes=2, run_id="run-1", task_name="train"))
    >>> manifest["spec"]["trainer"]["numNodes"]
    2
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from .. import naming
from ..errors import InvalidSpecErrors, ValidationError
from ..quantity import number_as_quantity
from .inputs import (
    ANNOTATION_RUN,
    ANNOTATION_TASK,
    API_VERSION,
    GROUP,
    LABEL_DIGEST,
    LABEL_MANAGED_BY,
    LABEL_PIPELINE,
    LABEL_RUN,
    LABEL_SCOPE,
    LABEL_TASK,
    MANAGER,
    PRIORITY_LABEL,
    QUEUE_LABEL,
    TRAINER_JOBS,
    ApiVersion,
    TrainJobInputs,
    dig,
    env_list,
)
from .pod_fields import check_runtime_init_containers
from .policy import check_manifest
from .validate import validate


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
    labels = {LABEL_MANAGED_BY: "kfp-trainer", LABEL_DIGEST: inputs.digest()}
    if inputs.run_id:
        labels[LABEL_RUN] = naming.label_value(inputs.run_id)
    if inputs.task_name:
        labels[LABEL_TASK] = naming.label_value(inputs.task_name)
    if inputs.pipeline_name:
        labels[LABEL_PIPELINE] = naming.label_value(inputs.pipeline_name)
    if inputs.task_id:
        labels[LABEL_SCOPE] = naming.label_value(inputs.task_id)
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
    if inputs.args or inputs.resume_args or "args" in inputs.model_fields_set:  # args=[] given: sent as [] (the SDK's no overrides)
        trainer["args"] = list(inputs.args) + list(inputs.resume_args)
    if inputs.env:
        trainer["env"] = env_list(inputs.env)
    if inputs.num_nodes is not None:
        trainer["numNodes"] = inputs.num_nodes
    ppn = inputs.num_proc_per_node
    if ppn is not None:
        trainer["numProcPerNode"] = int(ppn) if isinstance(ppn, int) or (str(ppn).isascii() and str(ppn).isdecimal()) else ppn
    if inputs.resources_per_node:
        trainer["resourcesPerNode"] = _quantities_as_text(inputs.resources_per_node)
    return trainer


def _quantities_as_text(resources: dict[str, Any]) -> dict[str, Any]:
    """Resource quantities as strings (``8`` -> ``"8"``, ``0.5`` -> ``"500m"``), as the API stores them after the Trainer webhook.

    Example:
        >>> _quantities_as_text({"limits": {"nvidia.com/gpu": 8, "memory": "16Gi"}})
        {'limits': {'nvidia.com/gpu': '8', 'memory': '16Gi'}}
    """
    out = copy.deepcopy(resources)
    for kind in ("limits", "requests"):
        values = out.get(kind)
        if isinstance(values, dict):
            out[kind] = {k: _number_as_text(v) for k, v in values.items()}
    return out


def _number_as_text(value: Any) -> Any:
    """A number as the API server stores it (``2.0`` -> ``"2"``, ``0.1`` -> ``"100m"``)."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        return value
    return number_as_quantity(value) or repr(value)  # finer than 1n: validation refuses it


def _initializer(inputs: TrainJobInputs) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, uri, secret, env in (
        ("dataset", inputs.dataset_uri, inputs.dataset_secret, inputs.dataset_env),
        ("model", inputs.model_uri, inputs.model_secret, inputs.model_env),
    ):
        if not uri:
            continue
        item: dict[str, Any] = {"storageUri": uri}
        if env or isinstance(env, list):  # an explicit empty list is kept, as the kubeflow SDK writes it
            item["env"] = env_list(env)
        if secret:
            item["secretRef"] = {"name": secret}
        out[key] = item
    return out


def _pod_spec_patch(inputs: TrainJobInputs, job: str, init_names: Sequence[str] | None = None) -> dict[str, Any]:
    spec: dict[str, Any] = {}
    if inputs.service_account:
        spec["serviceAccountName"] = inputs.service_account
    if inputs.volumes:
        spec["volumes"] = copy.deepcopy(inputs.volumes)
    container: dict[str, Any] = {"name": "node" if job in TRAINER_JOBS else job}
    if inputs.volume_mounts:
        container["volumeMounts"] = copy.deepcopy(inputs.volume_mounts)
    if inputs.container_security_context:
        container["securityContext"] = copy.deepcopy(inputs.container_security_context)
    if len(container) > 1:
        spec["containers"] = [container]
    inits = [copy.deepcopy(c) for c in inputs.init_containers if init_names is None or c.get("name") in init_names]
    if inits:
        spec["initContainers"] = inits
    if inputs.security_context:
        spec["securityContext"] = copy.deepcopy(inputs.security_context)
    if inputs.scheduling_gates:
        spec["schedulingGates"] = [{"name": gate} for gate in inputs.scheduling_gates]
    if inputs.termination_grace_period_seconds is not None:
        spec["terminationGracePeriodSeconds"] = inputs.termination_grace_period_seconds
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


def _metadata(labels: dict[str, str], annotations: dict[str, str]) -> dict[str, Any]:
    out: dict[str, Any] = {"labels": dict(labels)}
    if annotations:
        out["annotations"] = dict(annotations)
    return out


def build(
    inputs: TrainJobInputs,
    *,
    api_version: ApiVersion = "v2.2",
    runtime_jobs: list[str] | None = None,
    max_name_length: int | None = None,
    merge_patch: bool = True,
    init_containers: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """The manifest (patch merged unless ``merge_patch=False``), unchecked: for :func:`render` and the validator."""
    lineage = lineage_labels(inputs)
    metadata: dict[str, Any] = {"name": resolve_name(inputs, max_length=max_name_length), "labels": dict(lineage)}
    if inputs.namespace:
        metadata["namespace"] = inputs.namespace
    if inputs.queue_name:
        metadata["labels"][QUEUE_LABEL] = inputs.queue_name
    if inputs.priority_class:
        metadata["labels"][PRIORITY_LABEL] = inputs.priority_class
    annotations = {key: value for key, value in ((ANNOTATION_RUN, inputs.run_id), (ANNOTATION_TASK, inputs.task_name)) if value}
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
    if inputs.managed_by:
        spec["managedBy"] = inputs.managed_by

    jobset_labels = {**lineage, **inputs.labels}
    pod_labels = {**lineage, **inputs.pod_labels}
    targets = pod_targets(inputs, runtime_jobs)
    if api_version == "v2.1":
        spec["labels"] = jobset_labels
        if inputs.annotations:
            spec["annotations"] = dict(inputs.annotations)
        overrides = []
        for job in targets:
            override: dict[str, Any] = {"targetJobs": [{"name": job}], "metadata": _metadata(pod_labels, inputs.pod_annotations)}
            pod_spec = _pod_spec_patch(inputs, job, None if init_containers is None else init_containers.get(job, ()))
            if pod_spec:
                override["spec"] = pod_spec
            overrides.append(override)
        spec["podTemplateOverrides"] = overrides
    else:
        replicated = []
        for job in targets:
            inits = None if init_containers is None else init_containers.get(job, ())
            template = {"metadata": _metadata(pod_labels, inputs.pod_annotations), "spec": _pod_spec_patch(inputs, job, inits)}
            replicated.append({"name": job, "template": {"spec": {"template": {k: v for k, v in template.items() if v}}}})
        spec["runtimePatches"] = [
            {
                "manager": MANAGER,
                "trainingRuntimeSpec": {
                    "template": {"metadata": _metadata(jobset_labels, inputs.annotations), "spec": {"replicatedJobs": replicated}}
                },
            }
        ]
    manifest = {"apiVersion": API_VERSION, "kind": "TrainJob", "metadata": metadata, "spec": spec}
    return deep_merge(manifest, inputs.patch) if inputs.patch and merge_patch else manifest


def render(
    inputs: TrainJobInputs,
    *,
    api_version: ApiVersion = "v2.2",
    runtime_jobs: list[str] | None = None,
    max_name_length: int | None = None,
    local: bool = False,
    allow_host_access: bool = False,
    init_containers: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, Any]:
    """Validate ``inputs`` and render the TrainJob manifest for ``api_version``.

    Args:
        inputs: What to run.
        api_version: ``"v2.2"`` (runtimePatches, Trainer v2.2+) or ``"v2.1"``
            (podTemplateOverrides).
        runtime_jobs: Replicated job names of the referenced runtime, when known.
        max_name_length: Name budget for the runtime, when known.
        local: Render for the local backend (accepts ``builtin://`` and ``file://`` URIs).
        allow_host_access: The runtime allows host access (hostPath volumes, privileged
            containers, host namespaces and ports); see :mod:`kfp_trainer.spec.policy`.
        init_containers: The runtime's init container names per replicated job, when known:
            ``init_containers`` inputs must name one of them (the Trainer API patches only those).

    Returns:
        The TrainJob as a dict, ready for ``kubectl apply`` or the API.

    Raises:
        InvalidSpecErrors: Any input is invalid, or the merged ``patch`` breaks the policy
            (all problems listed).
    """
    validate(inputs, api_version=api_version, local=local, allow_host_access=allow_host_access)
    if init_containers is not None and inputs.init_containers:
        errors = check_runtime_init_containers(inputs, pod_targets(inputs, runtime_jobs), init_containers)
        if errors:
            raise InvalidSpecErrors(errors)
    shape: dict[str, Any] = dict(
        api_version=api_version, runtime_jobs=runtime_jobs, max_name_length=max_name_length, init_containers=init_containers
    )
    manifest = build(inputs, **shape)
    if inputs.patch or runtime_jobs is not None or max_name_length is not None:
        base = build(inputs, **shape, merge_patch=False)
        errors = check_manifest(manifest, base=base, api_version=api_version, allow_host_access=allow_host_access, local=local)
        if runtime_jobs is not None and not local:
            errors += _check_initializer_jobs(manifest, runtime_jobs, patched=bool(inputs.patch))
        if errors:
            raise InvalidSpecErrors(errors)
    return manifest


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


def build_trainjob(*, api_version: ApiVersion = "v2.2", **inputs: Any) -> dict[str, Any]:
    """Render the TrainJob manifest from the same inputs the ``train_job`` component takes.

    Example:
        >>> m = build_trainjob(runtime="torch-distributed", run_id="r1", task_name="train",
        ...                    num_nodes=2, env={"EPOCHS": "3"})
        >>> m["spec"]["trainer"]["env"]
        [{'name': 'EPOCHS', 'value': '3'}]
    """
    return render(TrainJobInputs.parse(**inputs), api_version=api_version)
