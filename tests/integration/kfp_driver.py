"""What a KFP 2.15-2.17 backend hands one container task, computed from compiled pipeline YAML.

A small, test-only reading of the backend's driver (``backend/src/v2/driver``): how it
resolves a task's parameter inputs (constants, KFP placeholders, pipeline parameters,
``ParallelFor`` items), and the ``TaskConfig`` it passes to a component that declares
``taskConfigPassthroughs``: the container's resources (``initPodSpecPatch``), the workspace
volume when an input names it (``needsWorkspaceMount``), and the Kubernetes platform config
(``extendPodSpecPatch``: Secrets as env, PVC mounts, node selector, tolerations). Used to
drive a launcher step exactly as a run on a cluster would.
"""

from __future__ import annotations

import copy
import re
from typing import Any

import yaml

WORKSPACE_MOUNT = "/kfp-workspace"
_INPUT_REF = re.compile(r"\{\{\$\.inputs\.parameters\['([^']+)'\]\}\}")


def load(text: str) -> tuple[dict, dict]:
    """(pipeline spec, platform spec) of compiled pipeline YAML."""
    docs = [d for d in yaml.safe_load_all(text) if d]
    return docs[0], (docs[1] if len(docs) > 1 else {})


def find_task(spec: dict, task: str) -> tuple[dict, list[str]]:
    """The task named ``task`` anywhere in the DAG, and the names of the DAG tasks above it."""

    def walk(dag: dict, path: list[str]) -> tuple[dict, list[str]] | None:
        for name, item in (dag.get("tasks") or {}).items():
            if name == task:
                return item, path
            component = spec["components"].get(item["componentRef"]["name"], {})
            if "dag" in component:
                found = walk(component["dag"], [*path, name])
                if found:
                    return found
        return None

    found = walk(spec["root"]["dag"], [])
    if found is None:
        raise KeyError(f"no task {task!r} in the pipeline")
    return found


def _substitute(value: Any, values: dict[str, Any], context: dict[str, str]) -> Any:
    if isinstance(value, list):
        return [_substitute(v, values, context) for v in value]
    if isinstance(value, dict):
        return {k: _substitute(v, values, context) for k, v in value.items()}
    if not isinstance(value, str):
        return value
    if value in context:
        return context[value]
    if "{{$.workspace_path}}" in value:
        value = value.replace("{{$.workspace_path}}", WORKSPACE_MOUNT)
    whole = _INPUT_REF.fullmatch(value)
    if whole:
        return values[whole.group(1)]
    return _INPUT_REF.sub(lambda m: str(values[m.group(1)]), value)


def _scope_values(spec: dict, path: list[str], params: dict[str, Any], loop_index: int,
                  outputs: dict[tuple[str, str], Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The parameters visible inside the DAGs on ``path``: pipeline parameters, upstream outputs, loop items."""
    values = {f"pipelinechannel--{k}": v for k, v in params.items()}
    values.update(params)
    dag = spec["root"]["dag"]
    for name in path:
        item = dag["tasks"][name]
        for key, source in ((item.get("inputs") or {}).get("parameters") or {}).items():
            produced = source.get("taskOutputParameter")
            if produced and (produced["producerTask"], produced["outputParameterKey"]) in (outputs or {}):  # handed in from before
                values[key] = (outputs or {})[(produced["producerTask"], produced["outputParameterKey"])]
        iterator = item.get("parameterIterator")
        if iterator:
            items = values[iterator["items"]["inputParameter"]]
            values[iterator["itemInput"]] = items[loop_index]
        dag = spec["components"][item["componentRef"]["name"]]["dag"]
    return values


def task_inputs(spec: dict, task: str, params: dict[str, Any], context: dict[str, str], loop_index: int = 0,
                outputs: dict[tuple[str, str], Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The parameter values the driver puts into the task's executor input.

    ``outputs``: the parameter outputs of the tasks that ran before, by (task, output name).
    """
    item, path = find_task(spec, task)
    scope = _scope_values(spec, path, params, loop_index, outputs)
    given = (item.get("inputs") or {}).get("parameters") or {}
    resolved: dict[str, Any] = {}
    for name, source in given.items():  # channels first: constants may refer to them
        if "componentInputParameter" in source:
            resolved[name] = copy.deepcopy(scope[source["componentInputParameter"]])
    for name, source in given.items():
        if "runtimeValue" in source:
            resolved[name] = _substitute(source["runtimeValue"]["constant"], resolved, context)
        elif "taskOutputParameter" in source:
            produced = source["taskOutputParameter"]
            resolved[name] = copy.deepcopy((outputs or {})[(produced["producerTask"], produced["outputParameterKey"])])
    return resolved


def _resources(container: dict, values: dict[str, Any]) -> dict[str, Any]:
    res = container.get("resources") or {}
    limits: dict[str, str] = {}
    requests: dict[str, str] = {}
    for key, target, name in (
        ("resourceCpuLimit", limits, "cpu"), ("resourceMemoryLimit", limits, "memory"),
        ("resourceCpuRequest", requests, "cpu"), ("resourceMemoryRequest", requests, "memory"),
    ):
        if res.get(key):
            target[name] = str(_substitute(res[key], values, {}))
    accelerator = res.get("accelerator") or {}
    kind = str(_substitute(accelerator.get("resourceType", ""), values, {}))
    count = str(_substitute(accelerator.get("resourceCount", ""), values, {}))
    if kind and count:
        limits[kind] = count.removesuffix(".0")
    return {"limits": limits, "requests": requests}


def task_config(
    spec: dict, platform: dict, task: str, inputs: dict[str, Any], *, params: dict[str, Any], run_name: str, loop_index: int = 0
) -> dict[str, Any]:
    """The TaskConfig (Kubernetes JSON) the driver passes to ``task``'s passthrough fields."""
    item, path = find_task(spec, task)
    scope = _scope_values(spec, path, params, loop_index)
    component = spec["components"][item["componentRef"]["name"]]
    fields = {p["field"] for p in component.get("taskConfigPassthroughs") or []}
    executor = component["executorLabel"]
    container = spec["deploymentSpec"]["executors"][executor]["container"]
    config: dict[str, Any] = {"env": None, "resources": None, "volumes": None, "volumeMounts": None, "nodeSelector": None,
                              "tolerations": None, "affinity": None}
    env = [{"name": e["name"], "value": e["value"]} for e in container.get("env") or []]
    volumes: list[dict] = []
    mounts: list[dict] = []
    if any(isinstance(v, str) and (WORKSPACE_MOUNT in v or "{{$.workspace_path}}" in v) for v in inputs.values()):
        volumes.append({"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": f"{run_name}-kfp-workspace"}})
        mounts.append({"name": "kfp-workspace", "mountPath": WORKSPACE_MOUNT})
    k8s = (((platform.get("platforms") or {}).get("kubernetes") or {}).get("deploymentSpec") or {}).get("executors", {}).get(executor, {})
    for pvc in k8s.get("pvcMount") or []:
        claim = pvc.get("constant") or pvc.get("pvcNameParameter", {}).get("runtimeValue", {}).get("constant")
        volumes.append({"name": claim, "persistentVolumeClaim": {"claimName": claim}})
        mounts.append({"name": claim, "mountPath": pvc["mountPath"]})
    for secret in k8s.get("secretAsEnv") or []:
        source = secret.get("secretNameParameter") or {}
        name = scope.get(source["componentInputParameter"]) if "componentInputParameter" in source else (
            source.get("runtimeValue", {}).get("constant") or secret.get("secretName"))
        for pair in secret.get("keyToEnv") or []:
            ref = {"name": name, "key": pair["secretKey"]}
            if "optional" in secret:
                ref["optional"] = secret["optional"]
            env.append({"name": pair["envVar"], "valueFrom": {"secretKeyRef": ref}})
    if "ENV" in fields:
        config["env"] = env
    if "RESOURCES" in fields:
        config["resources"] = _resources(container, inputs)
    if "KUBERNETES_VOLUMES" in fields:
        config["volumes"], config["volumeMounts"] = volumes, mounts
    if "KUBERNETES_NODE_SELECTOR" in fields and k8s.get("nodeSelector"):
        config["nodeSelector"] = k8s["nodeSelector"].get("labels")
    if "KUBERNETES_TOLERATIONS" in fields and k8s.get("tolerations"):
        config["tolerations"] = k8s["tolerations"]
    return config
