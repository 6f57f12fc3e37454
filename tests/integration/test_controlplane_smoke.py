"""The test control plane itself: the API server, the CRDs and webhooks, and the real
Trainer/JobSet controllers acting on TrainJobs whose pods are scripted on KWOK nodes."""

from __future__ import annotations

import json
import signal
import subprocess
import time
from pathlib import Path

import pytest
from helpers import (
    GROUP,
    VERSION,
    create_trainjob,
    events,
    finished_condition,
    follow_log,
    get_jobset,
    get_trainjob,
    pod,
    pod_patch,
    pods,
    trainjob,
    wait_for,
)
from kubernetes import client
from kubernetes.client.rest import ApiException
from testcluster import PodScript

OLDER = Path(__file__).resolve().parents[3] / "shared" / "kubeflow-trainer-older"
pytestmark = pytest.mark.timeout(120)


def scripted(name: str, script: PodScript, runtime: str = "torch-distributed", jobs=("node",), **spec) -> dict:
    """A TrainJob whose pods (of ``jobs``) act out ``script``."""
    return trainjob(name, runtime, runtimePatches=pod_patch(jobs, annotations=script.annotations()), **spec)


# --------------------------------------------------------------------------- API server, CRDs, webhooks


def test_version_is_1_36(cluster):
    out = subprocess.run(
        ["kubectl", "--kubeconfig", cluster.kubeconfig, "get", "--raw", "/version"], capture_output=True, text=True, timeout=30, check=True
    ).stdout
    v = json.loads(out)
    assert v["gitVersion"].startswith("v1.36."), v
    assert v["major"] == "1" and v["minor"].startswith("36"), v


def test_trainer_and_jobset_crds_runtimes_and_webhooks_are_installed(api_client, cluster):
    ext = client.ApiextensionsV1Api(api_client)
    for n in ("trainjobs.trainer.kubeflow.org", "trainingruntimes.trainer.kubeflow.org", "jobsets.jobset.x-k8s.io"):
        crd = ext.read_custom_resource_definition(n)
        assert {c.type: c.status for c in crd.status.conditions}["Established"] == "True"
    names = {
        r["metadata"]["name"]
        for r in client.CustomObjectsApi(api_client).list_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes")["items"]
    }
    assert {"torch-distributed", "deepspeed-distributed", "torchtune-llama3.2-1b"} <= names
    adm = client.AdmissionregistrationV1Api(api_client)
    hooks = {w.name: w for c in adm.list_validating_webhook_configuration().items for w in c.webhooks}
    hooks |= {w.name: w for c in adm.list_mutating_webhook_configuration().items for w in c.webhooks}
    expected = {
        "validator.trainjob.trainer.kubeflow.org": "/validate-trainer-kubeflow-org-v1alpha1-trainjob",
        "defaulter.trainjob.trainer.kubeflow.org": "/mutate-trainer-kubeflow-org-v1alpha1-trainjob",
        "validator.clustertrainingruntime.trainer.kubeflow.org": "/validate-trainer-kubeflow-org-v1alpha1-clustertrainingruntime",
        "vjobset.kb.io": "/validate-jobset-x-k8s-io-v1alpha2-jobset",
        "mjobset.kb.io": "/mutate-jobset-x-k8s-io-v1alpha2-jobset",
        "mpod.kb.io": "/mutate--v1-pod",
        "vpod.kb.io": "/validate--v1-pod",
    }
    for name, path in expected.items():
        assert hooks[name].client_config.url == f"https://127.0.0.1:{cluster.ports.webhooks}{path}", name
        assert hooks[name].failure_policy == "Fail"


def test_unknown_field_rejected_under_strict_validation(api_client, namespace, cluster):
    body = trainjob("strict-probe")
    body["spec"]["trainer"]["bogusField"] = 1
    with pytest.raises(ApiException) as ei:
        create_trainjob(api_client, namespace, body, strict=True)
    assert ei.value.status in (400, 422)
    assert "unknown field" in ei.value.body and "bogusField" in ei.value.body
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
    with pytest.raises(ApiException) as ei:
        create_trainjob(api_client, namespace, trainjob("a" * 64))
    assert ei.value.status == 422
    assert "no more than 63 characters" in ei.value.body
    create_trainjob(api_client, namespace, trainjob("a" * 63))


def test_trainjob_crd_swap_to_v2_1_0(cluster, api_client, namespace):
    path = OLDER / "trainjobs-v2.1.0.yaml"
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


def test_trainer_webhook_refuses_a_trainjob_naming_a_missing_runtime(api_client, namespace):
    with pytest.raises(ApiException) as ei:
        create_trainjob(api_client, namespace, trainjob("nort", runtime="does-not-exist"))
    assert ei.value.status == 403
    body = json.loads(ei.value.body)
    assert body["message"].startswith('admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request')
    assert 'ClusterTrainingRuntime.trainer.kubeflow.org "does-not-exist" not found' in body["message"]


# --------------------------------------------------------------------------- the controllers' work


def test_trainjob_becomes_a_jobset_jobs_and_pods_on_kwok_nodes_and_completes(api_client, namespace):
    lines = [f"step {i}" for i in range(6)]
    script = PodScript(lines=lines, line_delay=0.4)
    body = trainjob(
        "ok",
        trainer={"image": "python:3.11", "numNodes": 2},
        runtimePatches=pod_patch(
            annotations=script.annotations(), labels={"pipeline-run": "r1"}, spec={"nodeSelector": {"nvidia.com/gpu.present": "true"}}
        ),
    )
    tj = create_trainjob(api_client, namespace, body)
    # The Trainer controller made the JobSet (controller owner reference to the TrainJob) ...
    js = wait_for(lambda: get_jobset(api_client, namespace, "ok"), 30, what="JobSet")
    owner = js["metadata"]["ownerReferences"][0]
    assert (owner["kind"], owner["name"], owner["uid"], owner["controller"]) == ("TrainJob", "ok", tj["metadata"]["uid"], True)
    # ... the JobSet controller the Job (owned by the JobSet) ...
    batch = client.BatchV1Api(api_client)
    job = wait_for(lambda: batch.list_namespaced_job(namespace).items, 30, what="Job")[0]
    assert job.metadata.name == "ok-node-0"
    assert job.metadata.owner_references[0].kind == "JobSet" and job.metadata.owner_references[0].uid == js["metadata"]["uid"]
    assert job.spec.completion_mode == "Indexed" and job.spec.completions == 2
    # ... the job controller the pods, which the scheduler put on KWOK GPU nodes.
    first = wait_for(lambda: pod(api_client, namespace, "ok", phase="Running"), 60, what="node-0 pod Running")
    assert first.metadata.name.startswith("ok-node-0-0-")
    assert first.metadata.labels.get("pipeline-run") == "r1"
    assert first.spec.node_name.startswith("kwok-gpu-")
    assert {e.name for e in first.spec.containers[0].env} >= {"PET_NNODES", "PET_NODE_RANK", "PET_MASTER_ADDR"}
    # The log streams through the API server, line by line, as scripted.
    resp = client.CoreV1Api(api_client).read_namespaced_pod_log(
        first.metadata.name, namespace, container="node", follow=True, _preload_content=False, _request_timeout=60
    )
    got, stamps, buf = [], [], b""
    try:
        for chunk in resp.stream(1024):
            buf += chunk
            while b"\n" in buf:
                line, buf = buf.split(b"\n", 1)
                got.append(line.decode())
                stamps.append(time.monotonic())
    finally:
        resp.release_conn()
    assert got == lines
    assert stamps[-1] - stamps[0] > 1.0, "lines should stream over time, not at once"
    c = wait_for(lambda: finished_condition(api_client, namespace, "ok"), 60, what="finished")
    assert (c["type"], c["reason"], c["message"]) == ("Complete", "AllJobsCompleted", "jobset completed successfully")
    status = get_trainjob(api_client, namespace, "ok")["status"]
    assert status["jobsStatus"] == [{"name": "node", "active": 0, "failed": 0, "ready": 0, "succeeded": 1, "suspended": 0}]
    assert [p.status.phase for p in pods(api_client, namespace, "ok")] == ["Succeeded", "Succeeded"]


def test_crash_looping_pod_fails_the_trainjob_once_the_job_backoff_limit_is_reached(api_client, namespace):
    script = PodScript(lines=["epoch 1", "CUDA error"], exit_code=3, crash_backoff=0.1)
    create_trainjob(api_client, namespace, scripted("bad", script))
    c = wait_for(lambda: finished_condition(api_client, namespace, "bad"), 90, what="finished")
    assert (c["type"], c["reason"], c["message"]) == (
        "Failed",
        "FailedJobs",
        "jobset failed due to one or more job failures (first failed job: bad-node-0)",
    )
    job = client.BatchV1Api(api_client).read_namespaced_job("bad-node-0", namespace)
    assert {c.type: c.reason for c in job.status.conditions}["Failed"] == "BackoffLimitExceeded"
    assert get_trainjob(api_client, namespace, "bad")["status"]["jobsStatus"][0]["failed"] == 1


def test_trainjob_that_cannot_create_its_jobset_gets_a_warning_event_and_no_condition(api_client, namespace):
    # A quota of zero JobSets: the Trainer's JobSet is refused by the API server.
    client.CoreV1Api(api_client).create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "no-jobsets"}, "spec": {"hard": {"count/jobsets.jobset.x-k8s.io": "0"}}}
    )
    create_trainjob(api_client, namespace, trainjob("stuck"))

    def repeated():
        # The controller retries: a second failed reconcile means the first one's status
        # update (if it made any) is done.
        evs = events(api_client, namespace, "stuck", "TrainJobResourcesCreationFailed")
        count = sum(max(e.count or 1, (e.series.count if e.series else 0) or 1) for e in evs)
        return evs if count >= 2 else None

    ev = wait_for(repeated, 30, what="the event twice")[0]
    assert ev.type == "Warning" and ev.involved_object.kind == "TrainJob"
    assert ev.message.startswith("TrainJob resources reconciliation failed: ")
    assert "exceeded quota: no-jobsets" in ev.message
    # After reconciles that failed: no condition, no JobSet.
    assert not (get_trainjob(api_client, namespace, "stuck").get("status") or {}).get("conditions")
    assert get_jobset(api_client, namespace, "stuck") is None


def test_deleting_a_trainjob_garbage_collects_its_jobset_jobs_and_pods(cluster, api_client, namespace):
    cluster.wait_gc_ready()
    create_trainjob(api_client, namespace, scripted("gc", PodScript(lines=["tick"], exit_delay=float("inf")), trainer={"numNodes": 2}))
    core = client.CoreV1Api(api_client)
    wait_for(lambda: len(pods(api_client, namespace, "gc", phase="Running")) == 2, 60, what="2 running pods")
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", "gc", propagation_policy="Background"
    )
    wait_for(lambda: get_jobset(api_client, namespace, "gc") is None, 30, what="JobSet garbage-collected")
    wait_for(lambda: not client.BatchV1Api(api_client).list_namespaced_job(namespace).items, 30, what="Jobs garbage-collected")
    wait_for(lambda: not core.list_namespaced_pod(namespace).items, 30, what="pods garbage-collected")


def test_container_restart_keeps_the_previous_log(api_client, namespace):
    script = PodScript(lines=["a", "b", "c"], line_delay=0.1, crashes=1, crash_after=[2], crash_exit_code=137, crash_backoff=0.5)
    create_trainjob(api_client, namespace, scripted("flaky", script))
    c = wait_for(lambda: finished_condition(api_client, namespace, "flaky"), 60, what="finished")
    assert c["type"] == "Complete"
    p = pod(api_client, namespace, "flaky")
    cs = p.status.container_statuses[0]
    assert cs.restart_count == 1 and cs.last_state.terminated.exit_code == 137
    core = client.CoreV1Api(api_client)
    assert core.read_namespaced_pod_log(p.metadata.name, namespace, container="node").splitlines() == ["a", "b", "c"]
    assert core.read_namespaced_pod_log(p.metadata.name, namespace, container="node", previous=True).splitlines() == ["a", "b"]


def test_unschedulable_pod_runs_once_a_node_gets_the_label(api_client, namespace):
    label = f"kfp-trainer.test/{namespace}"
    create_trainjob(api_client, namespace, trainjob("slow", runtimePatches=pod_patch(spec={"nodeSelector": {label: "yes"}})))

    def unschedulable():
        p = pod(api_client, namespace, "slow")
        conds = {c.type: c for c in (p.status.conditions or [])} if p else {}
        c = conds.get("PodScheduled")
        return c if c and c.status == "False" and c.reason == "Unschedulable" else None

    wait_for(unschedulable, 30, what="Unschedulable pod")
    core = client.CoreV1Api(api_client)
    core.patch_node("kwok-cpu-0", {"metadata": {"labels": {label: "yes"}}})
    try:
        c = wait_for(lambda: finished_condition(api_client, namespace, "slow"), 60, what="finished")
        assert c["type"] == "Complete"
        assert pod(api_client, namespace, "slow").spec.node_name == "kwok-cpu-0"
    finally:
        core.patch_node("kwok-cpu-0", {"metadata": {"labels": {label: None}}})


def test_suspended_trainjob_conditions_and_resume_as_the_controller_writes_them(api_client, namespace):
    create_trainjob(api_client, namespace, trainjob("susp", suspend=True))

    def suspended():
        c = (get_trainjob(api_client, namespace, "susp").get("status") or {}).get("conditions") or []
        return c if c else None

    conds = wait_for(suspended, 30, what="Suspended condition")
    assert [(c["type"], c["status"], c["reason"], c["message"]) for c in conds] == [
        ("Suspended", "True", "Suspended", "TrainJob is suspended")
    ]
    assert get_jobset(api_client, namespace, "susp")["spec"]["suspend"] is True
    assert not pods(api_client, namespace, "susp")
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", "susp", {"spec": {"suspend": False}}
    )
    c = wait_for(lambda: finished_condition(api_client, namespace, "susp"), 60, what="finished")
    assert c["type"] == "Complete"
    conds = {c["type"]: c for c in get_trainjob(api_client, namespace, "susp")["status"]["conditions"]}
    assert (conds["Suspended"]["status"], conds["Suspended"]["reason"], conds["Suspended"]["message"]) == (
        "False",
        "Resumed",
        "TrainJob is resumed",
    )


def test_active_deadline_fails_the_trainjob_and_removes_its_jobset(api_client, namespace):
    create_trainjob(api_client, namespace, scripted("dl", PodScript(lines=["tick"], exit_delay=float("inf")), activeDeadlineSeconds=3))
    c = wait_for(lambda: finished_condition(api_client, namespace, "dl"), 30, what="finished")
    assert (c["type"], c["reason"]) == ("Failed", "DeadlineExceeded")
    assert c["message"] == "TrainJob exceeded its active deadline"
    wait_for(lambda: get_jobset(api_client, namespace, "dl") is None, 30, what="JobSet deleted")
    wait_for(lambda: not client.CoreV1Api(api_client).list_namespaced_pod(namespace).items, 30, what="pods removed")


def test_jobset_failure_policy_restarts_the_jobs_and_the_second_attempt_succeeds(api_client, namespace):
    runtime = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {"name": "one-retry"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "failurePolicy": {"maxRestarts": 1},
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                "spec": {
                                    "backoffLimit": 0,
                                    "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "node", "image": "busybox"}]}},
                                },
                            },
                        }
                    ],
                }
            },
        },
    }
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", runtime)
    body = scripted("retry", PodScript(lines=["try"], exit_code=1, failing_attempts=1))
    body["spec"]["runtimeRef"] = {"name": "one-retry", "kind": "TrainingRuntime", "apiGroup": GROUP}
    create_trainjob(api_client, namespace, body)
    c = wait_for(lambda: finished_condition(api_client, namespace, "retry"), 90, what="finished")
    assert (c["type"], c["reason"]) == ("Complete", "AllJobsCompleted")
    assert get_jobset(api_client, namespace, "retry")["status"]["restarts"] == 1
    phases = sorted((p.metadata.labels["jobset.sigs.k8s.io/restart-attempt"], p.status.phase) for p in pods(api_client, namespace, "retry"))
    assert phases == [("1", "Succeeded")]  # the failed attempt's Job and pod were replaced


def test_jobset_failure_policy_exhausted_fails_the_trainjob(api_client, namespace):
    runtime = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {"name": "one-retry"},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "failurePolicy": {"maxRestarts": 1},
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                "spec": {
                                    "backoffLimit": 0,
                                    "template": {"spec": {"restartPolicy": "Never", "containers": [{"name": "node", "image": "busybox"}]}},
                                },
                            },
                        }
                    ],
                }
            },
        },
    }
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", runtime)
    body = scripted("doomed", PodScript(lines=["try"], exit_code=2))
    body["spec"]["runtimeRef"] = {"name": "one-retry", "kind": "TrainingRuntime", "apiGroup": GROUP}
    create_trainjob(api_client, namespace, body)
    c = wait_for(lambda: finished_condition(api_client, namespace, "doomed"), 90, what="finished")
    assert (c["type"], c["reason"], c["message"]) == (
        "Failed",
        "ReachedMaxRestarts",
        "jobset failed due to reaching max number of restarts (first failed job: doomed-node-0)",
    )
    assert get_jobset(api_client, namespace, "doomed")["status"]["restarts"] == 1
    failed = [p for p in pods(api_client, namespace, "doomed") if p.status.phase == "Failed"]
    assert failed and failed[0].status.container_statuses[0].state.terminated.exit_code == 2


# --------------------------------------------------------------------------- logs like a kubelet


def test_follow_stream_ends_when_the_container_exits(api_client, namespace):
    lines = [f"line {i}" for i in range(5)]
    create_trainjob(api_client, namespace, scripted("fol", PodScript(lines=lines, line_delay=0.3)))
    p = wait_for(lambda: pod(api_client, namespace, "fol", phase="Running"), 60, what="Running")
    t0 = time.monotonic()
    assert follow_log(api_client, namespace, p.metadata.name) == lines
    assert time.monotonic() - t0 < 15
    wait_for(lambda: pod(api_client, namespace, "fol", phase="Succeeded"), 30, what="Succeeded")
    t0 = time.monotonic()
    assert follow_log(api_client, namespace, p.metadata.name) == lines
    assert time.monotonic() - t0 < 5


def test_follow_stream_ends_at_a_crash_and_a_new_call_gets_the_new_instance(api_client, namespace):
    # Lines a second apart, and the follow starts once the first is there: on a loaded machine a
    # pod reported Running at 0.3 s per line had crashed, or not written yet, when the follow began.
    script = PodScript(lines=["a", "b", "c"], line_delay=1.0, crashes=1, crash_after=[2], crash_backoff=3)
    create_trainjob(api_client, namespace, scripted("rs", script))
    p = wait_for(lambda: pod(api_client, namespace, "rs", phase="Running"), 60, what="Running")
    core = client.CoreV1Api(api_client)
    wait_for(lambda: core.read_namespaced_pod_log(p.metadata.name, namespace, container="node").startswith("a"), 30, what="the first line")
    assert follow_log(api_client, namespace, p.metadata.name) == ["a", "b"]

    def backing_off():
        q = pod(api_client, namespace, "rs")
        cs = (q.status.container_statuses or [None])[0] if q else None
        return q if cs and cs.state.waiting and cs.state.waiting.reason == "CrashLoopBackOff" else None

    wait_for(backing_off, 10, what="CrashLoopBackOff")
    # Between the crash and the restart the crashed instance's log is served, like a kubelet does.
    assert follow_log(api_client, namespace, p.metadata.name) == ["a", "b"]

    def restarted_and_running():
        q = pod(api_client, namespace, "rs")
        cs = (q.status.container_statuses or [None])[0] if q else None
        return q if cs and cs.restart_count == 1 and cs.state.running else None

    wait_for(restarted_and_running, 30, what="second instance running")
    assert follow_log(api_client, namespace, p.metadata.name) == ["a", "b", "c"]


def test_log_of_a_container_that_has_not_started_is_refused_like_a_kubelet(api_client, namespace):
    create_trainjob(api_client, namespace, scripted("late", PodScript(lines=["x"], start_delay=float("inf"))))
    p = wait_for(lambda: pod(api_client, namespace, "late"), 30, what="pod")

    def waiting():
        q = pod(api_client, namespace, "late")
        cs = (q.status.container_statuses or [None])[0]
        return cs and cs.state.waiting and cs.state.waiting.reason == "ContainerCreating"

    wait_for(waiting, 30, what="ContainerCreating")
    with pytest.raises(ApiException) as ei:
        client.CoreV1Api(api_client).read_namespaced_pod_log(p.metadata.name, namespace, container="node")
    assert ei.value.status == 400
    assert json.loads(ei.value.body)["message"] == f'container "node" in pod "{p.metadata.name}" is waiting to start: ContainerCreating'


def test_namespaced_runtime_with_a_sidecar_has_per_container_logs(api_client, namespace):
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
    body = scripted("side", PodScript(lines=["main 1", "main 2"]))
    body["spec"]["runtimeRef"] = {"name": "with-sidecar", "kind": "TrainingRuntime", "apiGroup": GROUP}
    create_trainjob(api_client, namespace, body)
    c = wait_for(lambda: finished_condition(api_client, namespace, "side"), 60, what="finished")
    assert c["type"] == "Complete"
    p = pod(api_client, namespace, "side")
    assert [x.name for x in p.spec.containers] == ["node", "sidecar"]
    core = client.CoreV1Api(api_client)
    assert core.read_namespaced_pod_log(p.metadata.name, namespace, container="node").splitlines() == ["main 1", "main 2"]
    assert core.read_namespaced_pod_log(p.metadata.name, namespace, container="sidecar") == ""


# --------------------------------------------------------------------------- initializers, storage, RBAC


def test_torchtune_initializers_run_before_the_trainer_on_a_provisioned_volume(api_client, namespace):
    body = scripted(
        "tune",
        PodScript(lines=["fetching", "ok"]),
        runtime="torchtune-llama3.2-1b",
        jobs=("dataset-initializer", "model-initializer", "node"),
        initializer={"dataset": {"storageUri": "hf://tatsu-lab/alpaca"}, "model": {"storageUri": "hf://meta-llama/x"}},
    )
    body["spec"]["trainer"] = {"numNodes": 1}
    create_trainjob(api_client, namespace, body)
    c = wait_for(lambda: finished_condition(api_client, namespace, "tune"), 120, what="finished")
    assert c["type"] == "Complete"
    batch, core = client.BatchV1Api(api_client), client.CoreV1Api(api_client)
    jobs = {j.metadata.name: j for j in batch.list_namespaced_job(namespace).items}
    assert set(jobs) == {"tune-dataset-initializer-0", "tune-model-initializer-0", "tune-node-0"}
    env = {e.name: e.value for e in jobs["tune-dataset-initializer-0"].spec.template.spec.containers[0].env}
    assert env["STORAGE_URI"] == "hf://tatsu-lab/alpaca"
    # JobSet's dependsOn: the trainer Job was created only after both initializers completed.
    for n in ("tune-dataset-initializer-0", "tune-model-initializer-0"):
        assert jobs[n].status.completion_time <= jobs["tune-node-0"].metadata.creation_timestamp
    # The runtime's volumeClaimPolicies claim, provisioned and bound, mounted by every pod.
    pvc = core.read_namespaced_persistent_volume_claim("initializer-tune", namespace)
    assert pvc.status.phase == "Bound" and pvc.spec.storage_class_name == "standard"
    for job in ("dataset-initializer", "model-initializer", "node"):
        vols = pod(api_client, namespace, "tune", job=job).spec.volumes
        assert any(v.persistent_volume_claim and v.persistent_volume_claim.claim_name == "initializer-tune" for v in vols), job
    tj = get_trainjob(api_client, namespace, "tune")
    assert {s["name"] for s in tj["status"]["jobsStatus"]} == {"dataset-initializer", "model-initializer", "node"}


def test_rbac_is_enforced_for_an_impersonated_service_account(cluster, api_client, namespace):
    client.CoreV1Api(api_client).create_namespaced_service_account(namespace, {"metadata": {"name": "pipeline-runner"}})
    as_sa = cluster.api_client()
    as_sa.default_headers["Impersonate-User"] = f"system:serviceaccount:{namespace}:pipeline-runner"
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


# --------------------------------------------------------------------------- the cluster's own processes


def test_pod_scripting_survives_an_api_server_restart(cluster, namespace):
    """The pod scripting process reconnects after connection errors and goes on writing logs."""
    cluster.restart("kube-apiserver", kill=signal.SIGKILL)
    api = cluster.api_client()
    try:
        wait_for(cluster.is_running, 60, what="API server back")
        assert cluster.podscript.running()
        create_trainjob(api, namespace, scripted("after", PodScript(lines=["still", "here"])))
        c = wait_for(lambda: finished_condition(api, namespace, "after"), 90, what="finished")
        assert c["type"] == "Complete"
        p = pod(api, namespace, "after")
        assert client.CoreV1Api(api).read_namespaced_pod_log(p.metadata.name, namespace, container="node").splitlines() == ["still", "here"]
    finally:
        api.close()
