"""Inputs -> the TrainJob manifest, unchecked: the one builder under :mod:`.validate` and :mod:`.render`. Pure.

* ``v2.2`` (Trainer v2.2 and later): pod settings go into ``spec.runtimePatches``;
* ``v2.1``: pod settings go into ``spec.podTemplateOverrides`` and JobSet labels into
  ``spec.labels`` / ``spec.annotations``.

In both the ``labels`` input is the TrainJob's ``metadata.labels`` as well as its JobSet's.

:func:`build` returns the job as given (``base``, the ``patch`` not merged) and the job to
send (``patch`` merged): the policy (:mod:`kfp_trainer.spec.policy`) compares the two. Nothing
here validates: :func:`~kfp_trainer.spec.validate.checked_build` does, around its one call of :func:`build`.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

from .. import naming
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
    env_list,
)


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
    init_containers: Mapping[str, Sequence[str]] | None = None,
) -> tuple[dict[str, Any], dict[str, Any]]:
    """``(base, manifest)``: the job as the inputs give it, and the same with ``patch`` merged. Unchecked.

    Built once; ``manifest`` is ``base`` itself when there is no ``patch``.

    Example:
        >>> base, manifest = build(TrainJobInputs(runtime="torch-distributed", run_id="r1", patch={"spec": {"suspend": True}}))
        >>> "suspend" in base["spec"], manifest["spec"]["suspend"]
        (False, True)
    """
    lineage = lineage_labels(inputs)
    # The user's labels are the TrainJob's own (kubectl get trainjobs -l team=a), and its JobSet's (below).
    metadata: dict[str, Any] = {"name": resolve_name(inputs, max_length=max_name_length), "labels": {**lineage, **inputs.labels}}
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
    return manifest, (deep_merge(manifest, inputs.patch) if inputs.patch else manifest)
