"""The typed pod fields and managed_by on the test control plane: the Trainer's webhooks accept what
the launcher renders, and the real Trainer and JobSet controllers carry each field to the pods.
"""

from __future__ import annotations

import io
import json
import threading
import time
from pathlib import Path

import pytest
from helpers import events, get_jobset, get_trainjob, pods, wait_for
from kubernetes import client
from testcluster import PodScript

from kfp_trainer import spec
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import InvalidSpecErrors, RejectedError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

REPO = Path(__file__).resolve().parents[2]
OLDER = REPO.parent / "shared" / "kubeflow-trainer-older"
pytestmark = pytest.mark.timeout(240)
FILE_REF = {"fileKeyRef": {"volumeName": "cfg", "path": "vars.env", "key": "DATA_VERSION"}}


def inputs(namespace: str, **kw) -> TrainJobInputs:
    return TrainJobInputs(run_id=f"run-{time.time_ns()}", task_name="train", namespace=namespace, **kw)


def runtime_with_init_container(namespace: str) -> dict:
    """A namespaced TrainingRuntime like torch-distributed whose trainer pods fetch a config first."""
    pod = {
        "initContainers": [{"name": "fetch-config", "image": "busybox:1", "command": ["sh", "-c", "echo DATA_VERSION=7 > /cfg/vars.env"],
                            "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}],
        "containers": [{"name": "node", "image": "pytorch/pytorch", "volumeMounts": [{"name": "cfg", "mountPath": "/cfg"}]}],
        "volumes": [{"name": "cfg", "emptyDir": {}}],
    }  # fmt: skip
    job = {"name": "node", "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                        "spec": {"template": {"spec": pod}}}}  # fmt: skip
    return {
        "apiVersion": f"{spec.GROUP}/{spec.VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {"name": "torch-with-config", "namespace": namespace, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [job]}}},
    }


def test_typed_pod_fields_pass_the_webhooks_and_reach_the_pods(kube_client, api_client, namespace):
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, "trainingruntimes", runtime_with_init_container(namespace)
    )
    inp = inputs(
        namespace,
        runtime="torch-with-config",
        runtime_kind="TrainingRuntime",
        scheduling_gates=["example.com/data-ready"],
        security_context={"runAsUser": 1000, "runAsNonRoot": True, "fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}},
        container_security_context={"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}},
        termination_grace_period_seconds=45,
        init_containers=[{"name": "fetch-config", "env": [{"name": "DATA_VERSION", "valueFrom": FILE_REF}],
                          "securityContext": {"runAsUser": 1001}}],
        pod_annotations=PodScript(lines=["step 1", "done"]).annotations(),
    )  # fmt: skip
    backend = KubernetesBackend(kube_client, namespace=namespace, watch_timeout=5)
    out, result = io.StringIO(), {}
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=1.0, start_timeout=120), out=out)
    thread = threading.Thread(target=lambda: result.update(outcome=launcher.run(prepare(launcher.backend, inp))), daemon=True)
    thread.start()
    name = prepare(launcher.backend, inp).manifest["metadata"]["name"]
    pod = wait_for(lambda: next(iter(pods(api_client, namespace, name)), None), 60, what="a trainer pod")
    s = raw_pod(api_client, namespace, pod.metadata.name)["spec"]  # as stored: the Python client's models predate fileKeyRef
    assert s["schedulingGates"] == [{"name": "example.com/data-ready"}]
    assert s["securityContext"] == {"runAsUser": 1000, "runAsNonRoot": True, "fsGroup": 2000, "seccompProfile": {"type": "RuntimeDefault"}}
    assert s["terminationGracePeriodSeconds"] == 45
    node = next(c for c in s["containers"] if c["name"] == "node")
    assert node["securityContext"] == {"allowPrivilegeEscalation": False, "readOnlyRootFilesystem": True, "capabilities": {"drop": ["ALL"]}}
    [init] = s["initContainers"]
    assert init["name"] == "fetch-config" and init["image"] == "busybox:1"  # the runtime's init container, patched
    from_file = next(e for e in init["env"] if e["name"] == "DATA_VERSION")["valueFrom"]
    assert from_file == {"fileKeyRef": {**FILE_REF["fileKeyRef"], "optional": False}}
    assert init["securityContext"] == {"runAsUser": 1001}
    # Gated: the scheduler leaves it alone until the gate is removed (here by the test, in a cluster by its owner).
    wait_for(lambda: condition_reason(api_client, namespace, pod.metadata.name) == "SchedulingGated", 30, what="SchedulingGated")
    assert "nodeName" not in raw_pod(api_client, namespace, pod.metadata.name)["spec"]
    client.CoreV1Api(api_client).patch_namespaced_pod(pod.metadata.name, namespace, {"spec": {"schedulingGates": None}})
    thread.join(90)
    assert result["outcome"].succeeded, out.getvalue()
    assert "step 1" in out.getvalue()


def raw_pod(api, namespace: str, pod_name: str) -> dict:
    return json.loads(client.CoreV1Api(api).read_namespaced_pod(pod_name, namespace, _preload_content=False).data)


def condition_reason(api, namespace: str, pod_name: str) -> str | None:
    pod = client.CoreV1Api(api).read_namespaced_pod(pod_name, namespace)
    return next((c.reason for c in pod.status.conditions or [] if c.type == "PodScheduled"), None)


def test_an_init_container_the_runtime_lacks_is_refused_before_anything_is_created(kube_client, api_client, namespace):
    backend = KubernetesBackend(kube_client, namespace=namespace, watch_timeout=5)
    inp = inputs(namespace, init_containers=[{"name": "fetch-config", "env": [{"name": "A", "value": "1"}]}])
    with pytest.raises(InvalidSpecErrors, match=r"init_containers\[0\]\.name: got 'fetch-config'; expected an init container the runtime"):
        Launcher(backend, out=io.StringIO()).run(prepare(backend, inp))
    lister = client.CustomObjectsApi(api_client).list_namespaced_custom_object
    assert lister(spec.GROUP, spec.VERSION, namespace, spec.PLURAL)["items"] == []
    # Why the launcher checks: the Trainer's webhook accepts such a patch (it validates the runtime with the
    # patches merged in), and the init container it adds has no image, so the JobSet's Jobs cannot be created.
    body = spec.render(inp.model_copy(update={"name": "no-such-init"}))
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, body)
    failed = wait_for(lambda: events(api_client, namespace, "no-such-init", reason="JobCreationFailed"), 30, what="JobCreationFailed")
    assert "initContainers[0].image: Required value" in failed[0].message


def test_the_trainer_drops_file_key_ref_from_the_trainer_env_so_the_launcher_refuses_it(api_client, namespace):
    """Why ``env`` refuses fileKeyRef: Trainer v2.3.0 copies only secret/configMap/field/resource refs into the
    node container, so the JobSet's Job cannot be created. When this test fails, the Trainer passes it on."""
    body = {
        "apiVersion": f"{spec.GROUP}/{spec.VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": "file-ref", "namespace": namespace},
        "spec": {"runtimeRef": {"name": "torch-distributed"},
                 "trainer": {"image": "python:3.11", "env": [{"name": "DATA_VERSION", "valueFrom": FILE_REF}]}},
    }  # fmt: skip
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, body)
    jobset = wait_for(lambda: get_jobset(api_client, namespace, "file-ref"), 30, what="the JobSet")
    node = jobset["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert next(e for e in node["env"] if e["name"] == "DATA_VERSION")["valueFrom"] == {}
    failed = wait_for(lambda: events(api_client, namespace, "file-ref", reason="JobCreationFailed"), 30, what="JobCreationFailed")
    assert "must specify one of" in failed[0].message
    with pytest.raises(InvalidSpecErrors, match=r"env\[0\]\.valueFrom\.fileKeyRef: .* does not pass fileKeyRef on"):
        spec.render(inputs(namespace, env=[{"name": "DATA_VERSION", "valueFrom": FILE_REF}]))


def test_a_multikueue_job_passes_the_webhook_and_is_followed_by_the_status_multikueue_mirrors(kube_client, api_client, namespace):
    inp = inputs(namespace, managed_by=spec.MULTIKUEUE, queue_name="team-q")
    backend = KubernetesBackend(kube_client, namespace=namespace, watch_timeout=5)
    out, result = io.StringIO(), {}
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=1.0, start_timeout=120), out=out)
    thread = threading.Thread(target=lambda: result.update(outcome=launcher.run(prepare(launcher.backend, inp))), daemon=True)
    thread.start()
    name = prepare(launcher.backend, inp).manifest["metadata"]["name"]
    stored = wait_for(lambda: get_trainjob(api_client, namespace, name), 30, what="the TrainJob")
    assert stored["spec"]["managedBy"] == spec.MULTIKUEUE
    wait_for(lambda: "its pods and logs are there" in out.getvalue(), 30, what="the launcher's note")
    assert get_jobset(api_client, namespace, name) is None  # the Trainer leaves it to MultiKueue
    # MultiKueue mirrors the worker cluster's status onto this TrainJob (the test plays it).
    now = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    mirrored = {"status": {
        "jobsStatus": [{"name": "node", "active": 0, "ready": 0, "succeeded": 1, "failed": 0, "suspended": 0}],
        "conditions": [{"type": "Complete", "status": "True", "reason": "AllJobsCompleted", "message": "on worker-1",
                        "lastTransitionTime": now}],
    }}  # fmt: skip
    patch_status = client.CustomObjectsApi(api_client).patch_namespaced_custom_object_status
    patch_status(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, name, mirrored)
    thread.join(60)
    outcome = result["outcome"]
    assert outcome.succeeded and outcome.message == "on worker-1"
    assert get_jobset(api_client, namespace, name) is None


def test_termination_grace_period_on_a_v22_trainer_fails_with_the_version_it_needs(kube_client, cluster, api_client, namespace):
    with cluster.use_trainjob_crd(OLDER / "trainjobs-v2.2.0.yaml"):
        backend = KubernetesBackend(kube_client, namespace=namespace, watch_timeout=5)
        with pytest.raises(RejectedError, match=r"terminationGracePeriodSeconds \(v2\.3\+\)"):
            Launcher(backend, out=io.StringIO()).run(prepare(backend, inputs(namespace, termination_grace_period_seconds=30)))
        lister = client.CustomObjectsApi(api_client).list_namespaced_custom_object
        assert lister(spec.GROUP, spec.VERSION, namespace, spec.PLURAL)["items"] == []
        # The other typed fields are in the v2.2 schema: the server accepts them (dry run).
        m = spec.render(inputs(namespace, scheduling_gates=["g"], security_context={"runAsNonRoot": True},
                               container_security_context={"readOnlyRootFilesystem": True}))  # fmt: skip
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            spec.GROUP, spec.VERSION, namespace, spec.PLURAL, m, field_validation="Strict", dry_run="All"
        )


def test_v21_renders_scheduling_gates_and_init_container_env_its_schema_accepts(cluster, api_client, namespace):
    m = spec.render(
        inputs(namespace, scheduling_gates=["g"], init_containers=[{"name": "fetch", "env": [{"name": "V", "valueFrom": FILE_REF}]}]),
        api_version="v2.1",
    )
    override = m["spec"]["podTemplateOverrides"][0]["spec"]
    assert override["schedulingGates"] == [{"name": "g"}] and override["initContainers"][0]["name"] == "fetch"
    with cluster.use_trainjob_crd(OLDER / "trainjobs-v2.1.0.yaml"):
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            spec.GROUP, spec.VERSION, namespace, spec.PLURAL, m, field_validation="Strict", dry_run="All"
        )
