"""Each sample pipeline's training step, driven as a KFP backend runs it, against a real API server.

For every TrainJob task of every ``pipelines/*/pipeline.yaml``, the test computes what the
backend's driver would hand the task (``kfp_driver``: resolved inputs, the TaskConfig of its
passthroughs), builds the executor input KFP's launcher passes to the container, and runs
the component's code through KFP's own executor under the ``pipeline-runner`` service
account (``deploy/rbac.yaml``). It records the TrainJob as the API server stored it (a
watch) and checks that the spec carries the run's workspace volume, the Secrets by
reference and the resources set on the task. Nothing here needs the TrainJob's pods to run:
the step is given a short start limit, after which it deletes its TrainJob, and the test
checks that nothing was left behind.

The only liberty taken: the workspace's mount path is a folder of this machine instead of
``/kfp-workspace`` (the step runs here, not in a pod), replaced the same way in the inputs
and in the TaskConfig.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client, watch

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kfp_driver  # noqa: E402
from k8s_objects import impersonating  # noqa: E402

from kfp_trainer.backends.kubernetes import KubernetesBackend  # noqa: E402

REPO = Path(__file__).resolve().parents[2]
RBAC = REPO / "deploy" / "rbac.yaml"
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
SA = "pipeline-runner"
# (pipeline, task, parameters a user sets in the UI for this check)
CASES = [
    ("llm_finetune", "train-job", {"accelerator_type": "nvidia.com/gpu", "accelerators_per_node": 2, "num_nodes": 2}),
    ("pytorch_distributed", "train-job", {}),
    ("hparam_sweep", "train-job", {"cpu_per_node": "500m", "memory_per_node": "1Gi"}),  # sized for a small cluster
]


def pipeline_module(name: str):
    import importlib.util

    spec = importlib.util.spec_from_file_location(f"it_pipeline_{name}", REPO / "pipelines" / name / "pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def runner(cluster, api_client, kube_client, namespace):
    """deploy/rbac.yaml applied for ``pipeline-runner`` in ``namespace``; the backend's client acting as it."""
    rbac, core = client.RbacAuthorizationV1Api(api_client), client.CoreV1Api(api_client)
    core.create_namespaced_service_account(namespace, {"metadata": {"name": SA}})
    suffix, cleanup = uuid.uuid4().hex[:8], []
    for doc in (copy.deepcopy(d) for d in yaml.safe_load_all(RBAC.read_text()) if d):
        if "namespace" in doc["metadata"]:
            doc["metadata"]["namespace"] = namespace
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        if doc["kind"].startswith("Cluster"):
            doc["metadata"]["name"] += f"-{suffix}"
            if doc["kind"] == "ClusterRoleBinding":
                doc["roleRef"]["name"] += f"-{suffix}"
                rbac.create_cluster_role_binding(doc)
                cleanup.append((rbac.delete_cluster_role_binding, doc["metadata"]["name"]))
            else:
                rbac.create_cluster_role(doc)
                cleanup.append((rbac.delete_cluster_role, doc["metadata"]["name"]))
        elif doc["kind"] == "Role":
            rbac.create_namespaced_role(namespace, doc)
        else:
            rbac.create_namespaced_role_binding(namespace, doc)
    impersonated = impersonating(kube_client, f"system:serviceaccount:{namespace}:{SA}")
    try:
        yield impersonated
    finally:
        impersonated.close()
        for delete, name in cleanup:
            delete(name)


class StoredTrainJobs:
    """Every TrainJob the API server stores in a namespace, as it stored it (a watch)."""

    def __init__(self, api: client.ApiClient, namespace: str) -> None:
        self.api, self.namespace, self.added, self.deleted = api, namespace, [], []
        self.error: BaseException | None = None
        self._stopping = threading.Event()
        self._watch = watch.Watch()
        self._ready = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        co = client.CustomObjectsApi(self.api)
        try:
            version = co.list_namespaced_custom_object(GROUP, VERSION, self.namespace, "trainjobs")["metadata"]["resourceVersion"]
            self._ready.set()
            for event in self._watch.stream(co.list_namespaced_custom_object, GROUP, VERSION, self.namespace, "trainjobs",
                                            resource_version=version, timeout_seconds=120):
                kind = event["type"]
                (self.added if kind == "ADDED" else self.deleted if kind == "DELETED" else []).append(event["object"])
        except Exception as e:  # the connection closed by stop() ends the stream with an error: not one of ours
            if not self._stopping.is_set():
                self.error = e
        finally:
            self._ready.set()

    def __enter__(self) -> StoredTrainJobs:
        self._thread.start()
        assert self._ready.wait(30)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stopping.set()
        self._watch.stop()
        assert self.error is None, f"watching TrainJobs failed: {self.error!r}"


def executor_input(spec: dict, task: str, inputs: dict, config: dict, root: Path, run_id: str, artifacts: dict[str, Path]) -> dict:
    """What KFP's launcher gives the container: parameters, input artifacts, output artifact URIs."""
    item, _ = kfp_driver.find_task(spec, task)
    component = spec["components"][item["componentRef"]["name"]]
    declared = component["inputDefinitions"]["parameters"]
    params = {k: v for k, v in inputs.items() if k in declared}
    params.update({k: config for k, v in declared.items() if v["parameterType"] == "TASK_CONFIG"})
    task_root = root / "pipeline-root" / spec["pipelineInfo"]["name"] / run_id / task / str(uuid.uuid4())
    outputs = {
        name: {"artifacts": [{"name": name, "type": {"schemaTitle": out["artifactType"]["schemaTitle"]},
                              "uri": str(task_root / name), "metadata": {}}]}
        for name, out in component["outputDefinitions"]["artifacts"].items()
    }
    in_artifacts = {
        name: {"artifacts": [{"name": name, "type": {"schemaTitle": component["inputDefinitions"]["artifacts"][name]["artifactType"]
                                                     ["schemaTitle"]}, "uri": str(path), "metadata": {"source_uri": "test://"}}]}
        for name, path in artifacts.items()
    }
    return {
        "inputs": {"parameterValues": params, "artifacts": in_artifacts},
        "outputs": {
            "artifacts": outputs,
            "parameters": {n: {"outputFile": str(task_root / n)} for n in component["outputDefinitions"].get("parameters", {})},
            "outputFile": str(task_root / "executor_output.json"),
        },
    }


@pytest.mark.parametrize(("pipeline", "task", "params"), CASES, ids=[c[0] for c in CASES])
def test_training_step_creates_a_trainjob_with_the_workspace_the_secrets_by_reference_and_the_tasks_resources(
    pipeline, task, params, runner, namespace, api_client, tmp_path, monkeypatch
):
    from kfp.dsl import executor as kfp_executor

    from kfp_trainer.components import train_job

    module = pipeline_module(pipeline)
    spec, platform = kfp_driver.load((REPO / "pipelines" / pipeline / "pipeline.yaml").read_text())
    parameters = {**module.PARAMS, **params}
    run_id, run_name = str(uuid.uuid4()), f"{pipeline.replace('_', '-')}-{uuid.uuid4().hex[:5]}"
    context = {"{{$.pipeline_job_uuid}}": run_id, "{{$.pipeline_task_name}}": task, "{{$.pipeline_task_uuid}}": "4711",
               "{{$.pipeline_job_name}}": run_name}
    upstream = {}
    if pipeline == "hparam_sweep":  # the loop's train steps take their resources from a step before the loop
        upstream[("node-resources", "Output")] = module.node_resources.python_func(
            cpu_per_node=parameters["cpu_per_node"], memory_per_node=parameters["memory_per_node"]
        )
    inputs = kfp_driver.task_inputs(spec, task, parameters, context, outputs=upstream)
    config = kfp_driver.task_config(spec, platform, task, inputs, params=parameters, run_name=run_name)
    assert inputs["workspace_path"] == kfp_driver.WORKSPACE_MOUNT  # so the driver mounts the workspace
    # the step runs on this machine: the workspace is a local folder, in the inputs and in the TaskConfig alike
    workspace = tmp_path / "kfp-workspace"
    workspace.mkdir()
    inputs = json.loads(json.dumps(inputs).replace(kfp_driver.WORKSPACE_MOUNT, str(workspace)))
    config = json.loads(json.dumps(config).replace(kfp_driver.WORKSPACE_MOUNT, str(workspace)))
    inputs.update({"namespace": namespace, "backend": "kubernetes", "start_timeout": 4.0, "delete_after_success": True})
    artifacts = {}
    for name in ("dataset", "model"):
        if name in kfp_driver.find_task(spec, task)[0]["inputs"].get("artifacts", {}):
            (tmp_path / name).mkdir()
            (tmp_path / name / "data.txt").write_text(name)
            artifacts[name] = tmp_path / name
    monkeypatch.setattr(
        "kfp_trainer.backends.select_backend", lambda kind="auto", **kw: KubernetesBackend(runner, namespace=namespace, watch_timeout=2)
    )
    body = executor_input(spec, task, inputs, config, tmp_path, run_id, artifacts)
    with StoredTrainJobs(api_client, namespace) as stored:
        with pytest.raises(SystemExit):  # no controllers run the pods here: the start limit ends the step
            kfp_executor.Executor(executor_input=body, function_to_execute=train_job.python_func).execute()
    assert len(stored.added) == 1, [o["metadata"]["name"] for o in stored.added]
    job = stored.added[0]
    trainer, labels = job["spec"]["trainer"], job["metadata"]["labels"]
    assert labels["kfp-trainer.kubeflow.org/run-id"] == run_id and labels["kfp-trainer.kubeflow.org/task"] == task

    # the resources set on the task (set_cpu_limit, set_memory_limit, set_accelerator_*), per node
    limits = trainer["resourcesPerNode"]["limits"]
    assert limits["cpu"] == parameters["cpu_per_node"] and limits["memory"] == parameters["memory_per_node"]
    if parameters.get("accelerator_type"):
        assert limits[parameters["accelerator_type"]] == str(parameters["accelerators_per_node"])
        assert trainer["numNodes"] == parameters["num_nodes"]
    else:
        assert not any("gpu" in k for k in limits)

    # the run's workspace PVC, mounted where the step staged the data, on the trainer nodes
    patch = job["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = patch["template"]["spec"]["template"]["spec"]
    assert {"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": f"{run_name}-kfp-workspace"}} in pod["volumes"]
    node = next(c for c in pod["containers"] if c["name"] == "node")
    assert {"name": "kfp-workspace", "mountPath": str(workspace)} in node["volumeMounts"]
    staged = trainer["args"][trainer["args"].index("--dataset-dir") + 1]
    assert staged.startswith(f"{workspace}/.kfp-trainer/") and (Path(staged) / "data.txt").read_text() == "dataset"

    # credentials only by reference: Secret names and keys, never values
    env = {e["name"]: e for e in trainer.get("env") or []}
    if pipeline == "llm_finetune":
        for var, secret in (("HF_TOKEN", "hf-credentials"), ("AWS_SECRET_ACCESS_KEY", "s3-credentials")):
            assert env[var] == {"name": var, "valueFrom": {"secretKeyRef": {"name": secret, "key": var, "optional": True}}}
    assert all("value" not in e for e in env.values() if "valueFrom" in e)

    # the step deleted its TrainJob when its start limit passed: nothing is left behind
    assert client.CustomObjectsApi(api_client).list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"] == []
