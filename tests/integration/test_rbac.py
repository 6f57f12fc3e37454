"""deploy/rbac.yaml on a real API server: the launcher's service account can do its job and no more."""

from __future__ import annotations

import copy
import uuid
from pathlib import Path

import pytest
import yaml
from k8s_objects import impersonating
from kubernetes import client
from kubernetes.client.rest import ApiException
from testcluster import PodScript

from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.spec import TrainJobInputs, render

RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac.yaml"
SA = "pipeline-runner"
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


def rbac_docs(namespace: str, suffix: str) -> list[dict]:
    """deploy/rbac.yaml moved to ``namespace``; cluster-scoped names made unique for this test."""
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    out = []
    for doc in docs:
        doc = copy.deepcopy(doc)
        if "namespace" in doc["metadata"]:
            doc["metadata"]["namespace"] = namespace
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            doc["metadata"]["name"] += f"-{suffix}"
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] += f"-{suffix}"
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        out.append(doc)
    return out


def apply_rbac(api_client: client.ApiClient, namespace: str) -> list:
    """The ``pipeline-runner`` service account in ``namespace`` with deploy/rbac.yaml's rights;
    returns ``(delete, name)`` of the cluster-scoped objects, for the caller to remove."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    client.CoreV1Api(api_client).create_namespaced_service_account(namespace, {"metadata": {"name": SA}})
    suffix = uuid.uuid4().hex[:8]
    cluster_scoped = []
    for doc in rbac_docs(namespace, suffix):
        kind = doc["kind"]
        if kind == "Role":
            rbac.create_namespaced_role(namespace, doc)
        elif kind == "RoleBinding":
            rbac.create_namespaced_role_binding(namespace, doc)
        elif kind == "ClusterRole":
            rbac.create_cluster_role(doc)
            cluster_scoped.append((rbac.delete_cluster_role, doc["metadata"]["name"]))
        elif kind == "ClusterRoleBinding":
            rbac.create_cluster_role_binding(doc)
            cluster_scoped.append((rbac.delete_cluster_role_binding, doc["metadata"]["name"]))
        else:  # pragma: no cover - the manifest holds only these four kinds
            raise AssertionError(f"unexpected kind {kind} in {RBAC}")
    return cluster_scoped


@pytest.fixture
def runner(cluster, api_client, namespace):
    """Apply the RBAC for ``pipeline-runner`` in ``namespace``; yield an API client impersonating it."""
    cluster_scoped = apply_rbac(api_client, namespace)
    impersonated = cluster.api_client()
    impersonated.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:{SA}")
    try:
        yield impersonated
    finally:
        impersonated.close()
        for delete, name in cluster_scoped:
            delete(name)


@pytest.fixture
def runner_kube(runner, kube_client, namespace):
    """The backend's own client acting as ``pipeline-runner`` (``runner`` applied its RBAC): what a step runs on."""
    acting = impersonating(kube_client, f"system:serviceaccount:{namespace}:{SA}")
    yield acting
    acting.close()


def can(api: client.ApiClient, namespace: str | None, verb: str, resource: str, group: str = "", subresource: str = "") -> bool:
    review = {
        "spec": {
            "resourceAttributes": {
                "namespace": namespace or "",
                "verb": verb,
                "group": group,
                "resource": resource,
                "subresource": subresource,
            }
        }
    }
    return bool(client.AuthorizationV1Api(api).create_self_subject_access_review(review).status.allowed)


def trainjob(namespace: str, task: str) -> dict:
    inputs = TrainJobInputs(
        runtime="torch-distributed",
        namespace=namespace,
        run_id="rbac-run",
        task_name=task,
        image="python:3.11",
        command=["python", "-c", "print('hi')"],
    )
    return render(inputs, api_version="v2.2")


def test_the_manifest_is_least_privilege_by_construction():
    docs = [d for d in yaml.safe_load_all(RBAC.read_text()) if d]
    assert sorted(d["kind"] for d in docs) == ["ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"]
    for doc in docs:
        for rule in doc.get("rules") or []:
            assert "*" not in rule["verbs"] and "*" not in rule["resources"] and "*" not in rule["apiGroups"]
            assert "secrets" not in rule["resources"]
    cluster_role = next(d for d in docs if d["kind"] == "ClusterRole")
    assert cluster_role["rules"] == [
        {"apiGroups": ["trainer.kubeflow.org"], "resources": ["clustertrainingruntimes"], "verbs": ["get", "list"]},
        {"apiGroups": [""], "resources": ["nodes"], "verbs": ["get"]},  # a starting pod's node: is it ready?
    ]


def test_pipeline_runner_can_launch_follow_and_delete_trainjobs_in_its_namespace(runner, runner_kube, namespace):
    backend = KubernetesBackend(runner_kube, namespace=namespace)
    info = backend.resolve_runtime(TrainJobInputs(runtime="torch-distributed", namespace=namespace, run_id="r", task_name="t"))
    assert info.api_version in ("v2.1", "v2.2")
    co = client.CustomObjectsApi(runner)
    body = trainjob(namespace, "train")
    created = co.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", body)
    name = created["metadata"]["name"]
    assert co.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)["metadata"]["uid"]
    assert co.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"]
    for verb, resource, group, sub in (
        ("watch", "trainjobs", GROUP, ""),
        ("patch", "trainjobs", GROUP, ""),
        ("delete", "trainjobs", GROUP, ""),
        ("list", "trainingruntimes", GROUP, ""),
        ("watch", "pods", "", ""),
        ("get", "pods", "", "log"),
        ("list", "events", "", ""),
    ):
        assert can(runner, namespace, verb, resource, group, sub), (verb, resource, sub)
    assert can(runner, None, "list", "clustertrainingruntimes", GROUP)
    assert can(runner, None, "get", "nodes")
    client.CoreV1Api(runner).list_namespaced_pod(namespace)
    client.CoreV1Api(runner).list_namespaced_event(namespace)
    co.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)


def test_pipeline_runner_cannot_touch_other_namespaces_secrets_or_cluster_objects(runner, namespace, api_client):
    other = f"it-other-{uuid.uuid4().hex[:8]}"
    core_admin = client.CoreV1Api(api_client)
    core_admin.create_namespace({"metadata": {"name": other}})
    try:
        co = client.CustomObjectsApi(runner)
        with pytest.raises(ApiException) as err:
            co.create_namespaced_custom_object(GROUP, VERSION, other, "trainjobs", trainjob(other, "train"))
        assert err.value.status == 403
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(runner).list_namespaced_secret(namespace)
        assert err.value.status == 403
        with pytest.raises(ApiException) as err:
            client.CoreV1Api(runner).read_namespaced_secret("anything", namespace)
        assert err.value.status == 403
        assert not can(runner, namespace, "create", "pods")
        assert not can(runner, namespace, "delete", "pods")
        assert not can(runner, namespace, "create", "trainingruntimes", GROUP)
        assert not can(runner, None, "create", "clustertrainingruntimes", GROUP)
        assert not can(runner, None, "list", "nodes") and not can(runner, None, "patch", "nodes")
        assert not can(runner, other, "list", "pods")
        assert not can(runner, other, "get", "trainjobs", GROUP)
    finally:
        core_admin.delete_namespace(other, propagation_policy="Background")


def test_train_job_step_under_the_runner_account_passes_task_config_to_the_stored_trainjob(
    runner_kube, namespace, api_client, tmp_path, monkeypatch
):
    from kfp import dsl

    from kfp_trainer.components import train_job

    monkeypatch.setattr(
        "kfp_trainer.backends.select_backend",
        lambda kind="auto", **kw: KubernetesBackend(runner_kube, namespace=namespace, watch_timeout=2),
    )
    workspace = tmp_path / "kfp-workspace"
    # The run's workspace claim, bound to a volume by the real PV controller (no provisioner here).
    core = client.CoreV1Api(api_client)
    pv_name = f"ws-{namespace}"
    core.create_persistent_volume(
        {
            "metadata": {"name": pv_name},
            "spec": {
                "capacity": {"storage": "1Gi"},
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "hostPath": {"path": str(workspace)},
                "claimRef": {"namespace": namespace, "name": "run-ws"},
            },
        }
    )
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {
            "metadata": {"name": "run-ws"},
            "spec": {
                "accessModes": ["ReadWriteOnce"],
                "storageClassName": "",
                "volumeName": pv_name,
                "resources": {"requests": {"storage": "1Gi"}},
            },
        },
    )
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "train.jsonl").write_text("{}\n")

    def artifact(cls, path: Path):
        a = cls(uri=str(path), name=path.name, metadata={})
        a.path = str(path)
        return a

    task_config = dsl.TaskConfig(
        resources={"limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}, "requests": {"cpu": "1"}},
        env=[{"name": "EPOCHS", "value": "3"}],
        node_selector={"nvidia.com/gpu.present": "true"},
        tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {"weight": 1, "preference": {"matchExpressions": [{"key": "zone", "operator": "In", "values": ["a"]}]}}
                ]
            }
        },
        volumes=[{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "run-ws"}}],
        volume_mounts=[{"name": "kfp-workspace", "mountPath": str(workspace)}],
    )
    handle = tmp_path / "trainjob.txt"
    metrics = artifact(dsl.Metrics, tmp_path / "metrics")
    train_job.python_func(
        output_model=artifact(dsl.Model, tmp_path / "model"),
        metrics=metrics,
        report=artifact(dsl.HTML, tmp_path / "report.html"),
        trainjob=str(handle),
        image="python:3.11",
        command=["python", "train.py"],
        args=["--data", "{dataset}"],
        dataset=artifact(dsl.Dataset, tmp_path / "data"),
        run_id=f"rbac-{uuid.uuid4().hex[:8]}",
        task_name="train",
        pipeline_name="p",
        backend="kubernetes",
        namespace=namespace,
        workspace_path=str(workspace),
        task_config=task_config,
        pod_annotations=PodScript(lines=["epoch 1/2 loss=0.50", "epoch 2/2 loss=0.25"]).annotations(),
    )
    ns, name = handle.read_text().split("/")
    assert ns == namespace
    stored = client.CustomObjectsApi(api_client).get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)
    trainer = stored["spec"]["trainer"]
    assert trainer["resourcesPerNode"] == task_config.resources
    assert {"name": "EPOCHS", "value": "3"} in trainer["env"]
    assert trainer["args"][1].startswith(f"{workspace}/.kfp-trainer/") and (Path(trainer["args"][1]) / "train.jsonl").exists()
    patch = stored["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = patch["template"]["spec"]["template"]["spec"]
    assert pod["nodeSelector"] == task_config.node_selector
    assert pod["tolerations"] == task_config.tolerations
    assert pod["affinity"] == task_config.affinity
    assert pod["volumes"] == task_config.volumes
    assert pod["containers"] == [{"name": "node", "volumeMounts": task_config.volume_mounts}]
    assert metrics.metadata["loss"] == 0.25  # the scripted log ends with "loss=0.25"
