"""The project's images (built here from deploy/Dockerfile.*, hack/k8s/images.py) in real pods on
the test cluster's real node: the ``train_job`` step itself runs in a pod of the component image
with the pod's service account (bound only by deploy/rbac.yaml) and in-cluster configuration, and
launches a TrainJob whose trainer pods run the trainer image on the same node."""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client
from realpods import on_real_node, wait_phase
from test_rbac import SA, rbac_docs
from testcluster import realnode

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

import images  # noqa: E402  (hack/k8s/images.py)

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


@pytest.fixture(scope="module")
def image_refs(real_node):
    """Both images imported into the real node's containerd (skipped when that digest is there)."""
    socket = str(real_node.containerd.socket)
    return {name: images.import_into(name, socket)[0].ref for name in images.IMAGES}


@pytest.fixture
def launcher_account(cluster, api_client, namespace):
    """The ``pipeline-runner`` service account in ``namespace`` with deploy/rbac.yaml's rights and no others."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    client.CoreV1Api(api_client).create_namespaced_service_account(namespace, {"metadata": {"name": SA}})
    suffix = uuid.uuid4().hex[:8]
    cleanup = []
    for doc in rbac_docs(namespace, suffix):
        kind = doc["kind"]
        if kind == "Role":
            rbac.create_namespaced_role(namespace, doc)
        elif kind == "RoleBinding":
            rbac.create_namespaced_role_binding(namespace, doc)
        elif kind == "ClusterRole":
            rbac.create_cluster_role(doc)
            cleanup.append((rbac.delete_cluster_role, doc["metadata"]["name"]))
        else:
            rbac.create_cluster_role_binding(doc)
            cleanup.append((rbac.delete_cluster_role_binding, doc["metadata"]["name"]))
    yield SA
    for delete, name in cleanup:
        delete(name)


def component_container(name: str) -> dict:
    """The container of a compiled component (components/<name>/component.yaml): command and args."""
    spec = yaml.safe_load((REPO / "components" / name / "component.yaml").read_text())
    (executor,) = spec["deploymentSpec"]["executors"].values()
    return executor["container"]


def executor_input(params: dict, outputs: list[str], parameters: list[str], root: str = "/tmp/kfp-outputs") -> str:
    """What KFP's launcher gives the step's container: parameters and where to write its outputs."""
    types = {"output_model": "system.Model", "metrics": "system.Metrics", "report": "system.HTML"}
    return json.dumps({
        "inputs": {"parameterValues": params},
        "outputs": {
            "artifacts": {n: {"artifacts": [{"name": n, "type": {"schemaTitle": types[n]}, "uri": f"{root}/{n}", "metadata": {}}]}
                          for n in outputs},
            "parameters": {n: {"outputFile": f"{root}/{n}"} for n in parameters},
            "outputFile": f"{root}/executor_output.json",
        },
    })


def test_the_train_job_step_runs_in_a_component_image_pod_and_its_trainjob_runs_the_trainer_image(
    cluster, api_client, namespace, real_node, image_refs, launcher_account
):
    core = client.CoreV1Api(api_client)
    server = urlparse(cluster.api_client().configuration.host)
    placement = realnode.pod_spec_for_real_node()
    script = "import os, torch, kfp_trainer.trainers.sft; print('trainer ran', os.getuid(), torch.__version__.split('+')[0])"
    run_id = str(uuid.uuid4())
    params = {
        "namespace": namespace, "backend": "kubernetes", "image": image_refs["trainer"], "num_nodes": 1,
        "command": ["python", "-c", script], "node_selector": placement["nodeSelector"], "tolerations": placement["tolerations"],
        "run_id": run_id, "task_name": "train-job", "task_id": "1", "pipeline_name": "real-pods", "start_timeout": 300.0,
        "delete_after_success": True,
    }
    container = component_container("train_job")
    args = [a.replace("{{$}}", executor_input(params, ["output_model", "metrics", "report"], ["trainjob"])) for a in container["args"]]
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": "train-job-step"},
        "spec": on_real_node({
            "restartPolicy": "Never", "serviceAccountName": launcher_account, "terminationGracePeriodSeconds": 5,
            # the API server listens on the machine's loopback (no Service network here): the pod shares the host's
            "hostNetwork": True,
            "securityContext": {"runAsNonRoot": True},
            "containers": [{
                "name": "main", "image": image_refs["component"], "imagePullPolicy": "Never",
                "command": container["command"], "args": args,
                "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": server.hostname},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": str(server.port)},
                        {"name": "KFP_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            }],
        }),
    }
    core.create_namespaced_pod(namespace, pod)
    done = wait_phase(core, namespace, "train-job-step", timeout=420)
    log = core.read_namespaced_pod_log("train-job-step", namespace)
    assert done.spec.node_name == realnode.NODE_NAME
    assert "trainer ran 1000 2." in log, log[-3000:]
    # the step's TrainJob ran its trainer pod on the real node, with the trainer image
    events = core.list_namespaced_event(namespace).items
    pulled = [e for e in events if e.reason in ("Pulled", "Started") and e.involved_object.kind == "Pod"
              and e.involved_object.name != "train-job-step"]
    assert pulled, [f"{e.reason} {e.involved_object.name}: {e.message}" for e in events]
    assert any(image_refs["trainer"] in (e.message or "") for e in events if e.reason == "Pulled"), \
        [e.message for e in events if e.reason == "Pulled"]
    # delete_after_success: the step removed its TrainJob once it succeeded
    jobs = client.CustomObjectsApi(api_client).list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"]
    assert jobs == []
