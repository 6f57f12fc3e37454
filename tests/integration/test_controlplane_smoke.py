"""Smoke tests of the integration control plane and the trainer simulator."""

from __future__ import annotations

import json
import subprocess
import time
from pathlib import Path

import pytest
from kubernetes import client
from kubernetes.client.rest import ApiException
from simulator import Script

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
OLDER = Path(__file__).resolve().parents[3] / "shared" / "kubeflow-trainer-older"


def trainjob(name: str, runtime: str = "torch-distributed", **spec) -> dict:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {"image": "python:3.11", "command": ["python", "-c", "print('hi')"]},
        },
    }
    body["spec"].update(spec)
    return body


def create_trainjob(api_client, ns: str, body: dict, strict: bool = True) -> dict:
    co = client.CustomObjectsApi(api_client)
    kw = {"field_validation": "Strict"} if strict else {}
    return co.create_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", body, **kw)


def get_trainjob(api_client, ns: str, name: str) -> dict:
    return client.CustomObjectsApi(api_client).get_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", name)


def wait_for(pred, timeout: float = 30, interval: float = 0.2, what: str = "condition"):
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")


def condition(tj: dict, typ: str) -> dict | None:
    for c in (tj.get("status") or {}).get("conditions") or []:
        if c["type"] == typ:
            return c
    return None


def finished_condition(api_client, ns, name):
    tj = get_trainjob(api_client, ns, name)
    for t in ("Complete", "Failed"):
        c = condition(tj, t)
        if c and c["status"] == "True":
            return c
    return None


def node0_pod(api_client, ns: str, name: str, phase: str | None = None):
    pods = (
        client.CoreV1Api(api_client)
        .list_namespaced_pod(
            ns,
            label_selector=(
                f"jobset.sigs.k8s.io/jobset-name={name},jobset.sigs.k8s.io/replicatedjob-name=node,"
                "batch.kubernetes.io/job-completion-index=0"
            ),
        )
        .items
    )
    pods = [p for p in pods if phase is None or p.status.phase == phase]
    return pods[0] if pods else None


# --------------------------------------------------------------------------- API server


def test_version_is_1_36(cluster):
    out = subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, "get", "--raw", "/version"],
        capture_output=True,
        text=True,
        timeout=30,
        check=True,
    ).stdout
    v = json.loads(out)
    assert v["gitVersion"].startswith("v1.36."), v
    assert v["major"] == "1" and v["minor"].startswith("36"), v


def test_trainer_crds_and_runtimes_installed(api_client):
    ext = client.ApiextensionsV1Api(api_client)
    for n in ("trainjobs", "trainingruntimes", "clustertrainingruntimes"):
        crd = ext.read_custom_resource_definition(f"{n}.{GROUP}")
        assert {c.type: c.status for c in crd.status.conditions}["Established"] == "True"
    names = {
        r["metadata"]["name"]
        for r in client.CustomObjectsApi(api_client).list_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes")["items"]
    }
    assert {"torch-distributed", "deepspeed-distributed", "torchtune-llama3.2-1b"} <= names


def test_unknown_field_rejected_under_strict_validation(api_client, namespace, cluster):
    body = trainjob("strict-probe")
    body["spec"]["trainer"]["bogusField"] = 1
    with pytest.raises(ApiException) as ei:
        create_trainjob(api_client, namespace, body, strict=True)
    assert ei.value.status in (400, 422)
    assert "unknown field" in ei.value.body and "bogusField" in ei.value.body
    # The same through kubectl's strict client-side flag (sent as fieldValidation=Strict).
    proc = subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, "-n", namespace, "create", "--validate=strict", "-f", "-"],
        input=json.dumps(body),
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert proc.returncode != 0
    assert "unknown field" in proc.stderr
    # Without strict validation the API server drops the field instead.
    created = create_trainjob(api_client, namespace, body, strict=False)
    assert "bogusField" not in created["spec"]["trainer"]


def test_64_char_name_rejected_by_crd_rule(api_client, namespace):
    name = "a" * 64
    with pytest.raises(ApiException) as ei:
        create_trainjob(api_client, namespace, trainjob(name))
    assert ei.value.status == 422
    assert "no more than 63 characters" in ei.value.body
    create_trainjob(api_client, namespace, trainjob("a" * 63))


def test_trainjob_crd_swap_to_v2_1_0(cluster, api_client, namespace):
    path = OLDER / "trainjobs-v2.1.0.yaml"
    if not path.exists():
        pytest.skip(f"{path} missing")
    patched = trainjob("old-api", runtimePatches=[{"manager": "kfp-trainer.kubeflow.org/launcher"}])
    old = trainjob("old-api", podTemplateOverrides=[{"targetJobs": [{"name": "node"}]}])
    with cluster.use_trainjob_crd(path):
        with pytest.raises(ApiException) as ei:
            create_trainjob(api_client, namespace, patched)
        assert "runtimePatches" in ei.value.body
        create_trainjob(api_client, namespace, old)
    # Back on v2.3.0: runtimePatches accepted, podTemplateOverrides unknown.
    with pytest.raises(ApiException):
        create_trainjob(api_client, namespace, trainjob("old-api-2", podTemplateOverrides=[{"targetJobs": [{"name": "node"}]}]))
    patched["metadata"]["name"] = "new-api"
    create_trainjob(api_client, namespace, patched)


# --------------------------------------------------------------------------- simulator


def test_scripted_success_and_pod_log_through_api_server(api_client, namespace, trainer_sim):
    lines = [f"step {i}" for i in range(6)]
    trainer_sim.script("ok", Script.success(lines, line_delay=0.4))
    create_trainjob(
        api_client,
        namespace,
        trainjob(
            "ok",
            runtimePatches=[
                {
                    "manager": "kfp-trainer.kubeflow.org/launcher",
                    "trainingRuntimeSpec": {
                        "template": {
                            "spec": {
                                "replicatedJobs": [
                                    {
                                        "name": "node",
                                        "template": {
                                            "spec": {
                                                "template": {
                                                    "metadata": {"labels": {"pipeline-run": "r1"}},
                                                    "spec": {"nodeSelector": {"nvidia.com/gpu.present": "true"}},
                                                }
                                            }
                                        },
                                    }
                                ]
                            }
                        }
                    },
                }
            ],
        ),
    )
    core = client.CoreV1Api(api_client)
    pod = wait_for(lambda: node0_pod(api_client, namespace, "ok", "Running"), 60, what="node-0 pod Running")
    assert pod.metadata.name.startswith("ok-node-0-0-")
    assert pod.metadata.labels["jobset.sigs.k8s.io/job-index"] == "0"
    assert pod.metadata.labels["pipeline-run"] == "r1"
    assert pod.spec.node_name.startswith("kwok-gpu-")
    assert pod.spec.containers[0].name == "node"
    assert pod.spec.containers[0].image == "python:3.11"
    # Follow the log through the API server: lines arrive over time.
    resp = core.read_namespaced_pod_log(
        pod.metadata.name, namespace, container="node", follow=True, _preload_content=False, _request_timeout=60
    )
    got, stamps = [], []
    buf = b""
    try:
        for chunk in resp.stream(1024):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                got.append(line.decode())
                stamps.append(time.monotonic())
            if len(got) >= len(lines):
                break
    finally:
        resp.release_conn()
    assert got == lines
    assert stamps[-1] - stamps[0] > 1.0, "lines should stream over time, not at once"
    c = wait_for(lambda: finished_condition(api_client, namespace, "ok"), 60, what="finished")
    assert c["type"] == "Complete" and c["reason"] == "AllJobsCompleted"
    tj = get_trainjob(api_client, namespace, "ok")
    js = {s["name"]: s for s in tj["status"]["jobsStatus"]}
    assert js["node"]["succeeded"] == 1 and js["node"]["active"] == 0
    job = client.BatchV1Api(api_client).read_namespaced_job("ok-node-0", namespace)
    assert job.spec.completion_mode == "Indexed"
    assert job.metadata.owner_references[0].kind == "TrainJob"
    # A finished pod's log stays readable.
    text = core.read_namespaced_pod_log(pod.metadata.name, namespace, container="node")
    assert text.splitlines() == lines


def test_scripted_failure(api_client, namespace, trainer_sim):
    trainer_sim.script("bad", Script.failure(["epoch 1", "CUDA error"], reason="FailedJobs", message="node failed: exit 3", exit_code=3))
    create_trainjob(api_client, namespace, trainjob("bad"))
    c = wait_for(lambda: finished_condition(api_client, namespace, "bad"), 60, what="finished")
    assert (c["type"], c["reason"], c["message"]) == ("Failed", "FailedJobs", "node failed: exit 3")
    pod = node0_pod(api_client, namespace, "bad", "Failed")
    assert pod.status.container_statuses[0].state.terminated.exit_code == 3
    log = client.CoreV1Api(api_client).read_namespaced_pod_log(pod.metadata.name, namespace, container="node")
    assert log.splitlines() == ["epoch 1", "CUDA error"]


def test_missing_runtime_and_never_start_emit_warning_only(api_client, namespace, trainer_sim):
    trainer_sim.script("stuck", Script.never_starting("simulated: cannot build JobSet"))
    create_trainjob(api_client, namespace, trainjob("stuck"))
    create_trainjob(api_client, namespace, trainjob("noruntime", runtime="does-not-exist"))
    core = client.CoreV1Api(api_client)

    def warnings(name):
        evs = core.list_namespaced_event(namespace, field_selector=f"involvedObject.name={name}").items
        return [e for e in evs if e.reason == "TrainJobResourcesCreationFailed" and e.type == "Warning"]

    ev = wait_for(lambda: warnings("stuck"), 30, what="event")[0]
    assert ev.message == "simulated: cannot build JobSet"
    assert ev.involved_object.kind == "TrainJob"
    ev = wait_for(lambda: warnings("noruntime"), 30, what="event")[0]
    assert "does-not-exist" in ev.message
    time.sleep(1.0)
    for n in ("stuck", "noruntime"):
        tj = get_trainjob(api_client, namespace, n)
        assert not (tj.get("status") or {}).get("conditions")
    assert not client.BatchV1Api(api_client).list_namespaced_job(namespace).items


def test_delete_trainjob_garbage_collects_jobs_and_pods(cluster, api_client, namespace, trainer_sim):
    cluster.wait_gc_ready()  # up to ~30 s after a fresh start (see docs/controlplane.md)
    trainer_sim.script("gc", Script(lines=["tick"] * 1000, line_delay=0.5, outcome="run_forever"))
    create_trainjob(api_client, namespace, trainjob("gc", trainer={"image": "python:3.11", "numNodes": 2}))
    batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)
    wait_for(
        lambda: len([p for p in core.list_namespaced_pod(namespace).items if p.status.phase == "Running"]) == 2,
        60,
        what="2 running pods",
    )
    job = batch.read_namespaced_job("gc-node-0", namespace)
    assert job.spec.completions == 2 and job.spec.parallelism == 2
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", "gc")
    wait_for(lambda: not batch.list_namespaced_job(namespace).items, 15, what="jobs garbage-collected")
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 15, what="pods garbage-collected")


def test_container_restart_and_previous_log(api_client, namespace, trainer_sim):
    trainer_sim.script("flaky", Script.restarting(["a", "b", "c"], restarts=[2], line_delay=0.1, restart_delay=0.5))
    create_trainjob(api_client, namespace, trainjob("flaky"))
    c = wait_for(lambda: finished_condition(api_client, namespace, "flaky"), 60, what="finished")
    assert c["type"] == "Complete"
    pod = node0_pod(api_client, namespace, "flaky")
    cs = pod.status.container_statuses[0]
    assert cs.restart_count == 1
    assert cs.last_state.terminated.exit_code != 0
    core = client.CoreV1Api(api_client)
    assert core.read_namespaced_pod_log(pod.metadata.name, namespace, container="node").splitlines() == ["a", "b", "c"]
    assert core.read_namespaced_pod_log(pod.metadata.name, namespace, container="node", previous=True).splitlines() == [
        "a",
        "b",
    ]


def test_slow_scheduling_then_runs(api_client, namespace, trainer_sim):
    trainer_sim.script("slow", Script.slow_scheduling(4, lines=["x"]))
    create_trainjob(api_client, namespace, trainjob("slow"))

    def unschedulable():
        p = node0_pod(api_client, namespace, "slow")
        if not p or not p.status.conditions:
            return None
        c = {c.type: c for c in p.status.conditions}.get("PodScheduled")
        return c if c and c.status == "False" and c.reason == "Unschedulable" else None

    wait_for(unschedulable, 30, what="Unschedulable pod")
    assert node0_pod(api_client, namespace, "slow").status.phase == "Pending"
    c = wait_for(lambda: finished_condition(api_client, namespace, "slow"), 60, what="finished")
    assert c["type"] == "Complete"


def test_suspended_trainjob(api_client, namespace, trainer_sim):
    create_trainjob(api_client, namespace, trainjob("susp", suspend=True))

    def suspended():
        tj = get_trainjob(api_client, namespace, "susp")
        c = condition(tj, "Suspended")
        return c if c and c["status"] == "True" else None

    wait_for(suspended, 30, what="Suspended condition")
    job = client.BatchV1Api(api_client).read_namespaced_job("susp-node-0", namespace)
    assert job.spec.suspend is True
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", "susp", {"spec": {"suspend": False}}
    )
    c = wait_for(lambda: finished_condition(api_client, namespace, "susp"), 60, what="finished")
    assert c["type"] == "Complete"
    assert condition(get_trainjob(api_client, namespace, "susp"), "Suspended")["status"] == "False"


# --------------------------------------------------------------------------- log streaming like a kubelet


def follow_log(api_client, ns: str, pod: str, timeout: float = 60) -> list[str]:
    """Follow a pod's log until the server ends the stream."""
    resp = client.CoreV1Api(api_client).read_namespaced_pod_log(
        pod, ns, container="node", follow=True, _preload_content=False, _request_timeout=timeout
    )
    try:
        data = b"".join(resp.stream(1024))
    finally:
        resp.release_conn()
    return data.decode().splitlines()


def test_follow_stream_ends_when_container_exits(api_client, namespace, trainer_sim):
    lines = [f"line {i}" for i in range(5)]
    trainer_sim.script("fol", Script.success(lines, line_delay=0.3))
    create_trainjob(api_client, namespace, trainjob("fol"))
    pod = wait_for(lambda: node0_pod(api_client, namespace, "fol", "Running"), 60, what="Running")
    t0 = time.monotonic()
    assert follow_log(api_client, namespace, pod.metadata.name) == lines
    assert time.monotonic() - t0 < 15
    # Following a finished container returns its log and ends at once.
    wait_for(lambda: node0_pod(api_client, namespace, "fol", "Succeeded"), 30, what="Succeeded")
    t0 = time.monotonic()
    assert follow_log(api_client, namespace, pod.metadata.name) == lines
    assert time.monotonic() - t0 < 5


def test_follow_stream_ends_at_restart_and_new_call_gets_new_instance(api_client, namespace, trainer_sim):
    trainer_sim.script("rs", Script.restarting(["a", "b", "c"], restarts=[2], line_delay=0.3, restart_delay=1.5))
    create_trainjob(api_client, namespace, trainjob("rs"))
    pod = wait_for(lambda: node0_pod(api_client, namespace, "rs", "Running"), 60, what="Running")
    assert follow_log(api_client, namespace, pod.metadata.name) == ["a", "b"]

    def restarted_and_running():
        p = node0_pod(api_client, namespace, "rs")
        cs = (p.status.container_statuses or [None])[0] if p else None
        return p if cs and cs.restart_count == 1 and cs.state.running else None

    pod = wait_for(restarted_and_running, 30, what="second instance running")
    assert follow_log(api_client, namespace, pod.metadata.name) == ["a", "b", "c"]


def test_log_of_not_started_container_is_rejected_like_a_kubelet(api_client, namespace, trainer_sim):
    trainer_sim.script("late", Script(start_delay=5, lines=["x"]))
    create_trainjob(api_client, namespace, trainjob("late"))
    pod = wait_for(lambda: node0_pod(api_client, namespace, "late"), 30, what="pod")
    wait_for(lambda: node0_pod(api_client, namespace, "late").spec.node_name, 30, what="bound")
    time.sleep(0.5)
    with pytest.raises(ApiException) as ei:
        client.CoreV1Api(api_client).read_namespaced_pod_log(pod.metadata.name, namespace, container="node")
    assert ei.value.status == 400
    assert "is waiting to start" in ei.value.body
    c = wait_for(lambda: finished_condition(api_client, namespace, "late"), 60, what="finished")
    assert c["type"] == "Complete"


# --------------------------------------------------------------------------- more runtimes, RBAC


def test_runtime_with_initializers(api_client, namespace, trainer_sim):
    trainer_sim.script("tune", Script.success(["tuning"], initializer_lines=["fetching", "ok"]))
    create_trainjob(
        api_client,
        namespace,
        trainjob(
            "tune",
            runtime="torchtune-llama3.2-1b",
            trainer={"numNodes": 1},
            initializer={"dataset": {"storageUri": "hf://tatsu-lab/alpaca"}, "model": {"storageUri": "hf://meta-llama/x"}},
        ),
    )
    c = wait_for(lambda: finished_condition(api_client, namespace, "tune"), 90, what="finished")
    assert c["type"] == "Complete"
    batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)
    names = {j.metadata.name for j in batch.list_namespaced_job(namespace).items}
    assert names == {"tune-dataset-initializer-0", "tune-model-initializer-0", "tune-node-0"}
    ds = batch.read_namespaced_job("tune-dataset-initializer-0", namespace)
    env = {e.name: e.value for e in ds.spec.template.spec.containers[0].env}
    assert env["STORAGE_URI"] == "hf://tatsu-lab/alpaca"
    # The trainer job started only after both initializers completed (JobSet dependsOn).
    node_job = batch.read_namespaced_job("tune-node-0", namespace)
    for n in ("tune-dataset-initializer-0", "tune-model-initializer-0"):
        done = batch.read_namespaced_job(n, namespace).status.completion_time
        assert done <= node_job.metadata.creation_timestamp
    assert core.read_namespaced_persistent_volume_claim("initializer-tune", namespace)
    tj = get_trainjob(api_client, namespace, "tune")
    assert {s["name"] for s in tj["status"]["jobsStatus"]} == {"dataset-initializer", "model-initializer", "node"}


def test_rbac_is_enforced_for_impersonated_service_account(cluster, api_client, namespace):
    sa = f"system:serviceaccount:{namespace}:pipeline-runner"
    client.CoreV1Api(api_client).create_namespaced_service_account(namespace, {"metadata": {"name": "pipeline-runner"}})
    as_sa = cluster.api_client()
    as_sa.default_headers["Impersonate-User"] = sa
    co = client.CustomObjectsApi(as_sa)
    try:
        with pytest.raises(ApiException) as ei:
            co.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")
        assert ei.value.status == 403
        rbac = client.RbacAuthorizationV1Api(api_client)
        rbac.create_namespaced_role(
            namespace,
            {
                "metadata": {"name": "trainjobs"},
                "rules": [{"apiGroups": [GROUP], "resources": ["trainjobs"], "verbs": ["get", "list", "create"]}],
            },
        )
        rbac.create_namespaced_role_binding(
            namespace,
            {
                "metadata": {"name": "trainjobs"},
                "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": "trainjobs"},
                "subjects": [{"kind": "ServiceAccount", "name": "pipeline-runner", "namespace": namespace}],
            },
        )
        wait_for(lambda: _can_list(co, namespace), 10, what="RBAC grant in effect")
        with pytest.raises(ApiException) as ei:
            co.delete_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", "x")
        assert ei.value.status == 403
    finally:
        as_sa.close()


def _can_list(co, ns) -> bool:
    try:
        co.list_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs")
        return True
    except ApiException:
        return False


def test_active_deadline_exceeded(api_client, namespace, trainer_sim):
    trainer_sim.script("dl", Script(lines=["tick"] * 100, line_delay=0.2, outcome="run_forever"))
    create_trainjob(api_client, namespace, trainjob("dl", activeDeadlineSeconds=2))
    c = wait_for(lambda: finished_condition(api_client, namespace, "dl"), 30, what="finished")
    assert (c["type"], c["reason"]) == ("Failed", "DeadlineExceeded")
    core = client.CoreV1Api(api_client)
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 30, what="pods removed")


def test_namespaced_runtime_with_sidecar_has_per_container_logs(api_client, namespace, trainer_sim):
    runtime = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {"name": "with-sidecar"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                "spec": {
                                    "template": {
                                        "spec": {
                                            "containers": [
                                                {"name": "node", "image": "pytorch/pytorch"},
                                                {"name": "sidecar", "image": "busybox"},
                                            ]
                                        }
                                    }
                                },
                            },
                        }
                    ]
                }
            },
        },
    }
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", runtime)
    trainer_sim.script("side", Script.success(["main 1", "main 2"]))
    body = trainjob("side")
    body["spec"]["runtimeRef"] = {"name": "with-sidecar", "kind": "TrainingRuntime", "apiGroup": GROUP}
    create_trainjob(api_client, namespace, body)
    c = wait_for(lambda: finished_condition(api_client, namespace, "side"), 60, what="finished")
    assert c["type"] == "Complete"
    pod = node0_pod(api_client, namespace, "side")
    assert [x.name for x in pod.spec.containers] == ["node", "sidecar"]
    core = client.CoreV1Api(api_client)
    assert core.read_namespaced_pod_log(pod.metadata.name, namespace, container="node").splitlines() == ["main 1", "main 2"]
    assert core.read_namespaced_pod_log(pod.metadata.name, namespace, container="sidecar") == ""
