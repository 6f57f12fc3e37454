"""Create, adopt, replace and delete against the real API server, garbage collector and Job controller.

No Trainer or JobSet controller runs here: where a test needs what they would make (a Job owned
by the TrainJob, a Failed condition), it makes it; everything else is the real control plane.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

import pytest
from k8s_objects import (
    backend,
    dead_launcher,
    get_trainjob,
    manifest,
    owned_job,
    recording,
    set_condition,
    set_finalizers,
    trainjobs,
    wait_for,
)
from kubernetes import client

from kfp_trainer import spec
from kfp_trainer.backends import owner
from kfp_trainer.backends.kube.watch import watch
from kfp_trainer.errors import DeletionTimeoutError, ForbiddenError, OwnershipError, RejectedError
from kfp_trainer.jobstatus import JobRef

OLDER = Path(__file__).resolve().parents[2].parent / "shared" / "kubeflow-trainer-older"
HOLD = "kfp-trainer.test/hold"
pytestmark = pytest.mark.timeout(120)


# ----------------------------------------------------------------------------- deletion


def test_delete_waits_with_watches_until_the_jobs_and_pods_are_gone(kube_client, cluster, api_client, namespace):
    cluster.wait_gc_ready()
    rec = recording(kube_client)
    kube = backend(rec, namespace)
    sub = kube.submit(manifest(namespace))
    owned_job(api_client, get_trainjob(api_client, namespace, sub.ref.name), pods=2)
    core = client.CoreV1Api(api_client)
    selector = f"jobset.sigs.k8s.io/jobset-name={sub.ref.name}"
    pods = wait_for(lambda: (p := core.list_namespaced_pod(namespace, label_selector=selector).items) and len(p) == 2 and p, what="pods")
    held = pods[0].metadata.name  # a pod that takes a while to go (a slow kubelet, a long grace period)
    core.patch_namespaced_pod(held, namespace, {"metadata": {"finalizers": [HOLD]}})
    release = threading.Timer(2.0, lambda: core.patch_namespaced_pod(held, namespace, {"metadata": {"finalizers": None}}))
    rec.requests.clear()
    release.start()
    started = time.monotonic()

    left = kube.delete(sub.ref, wait=60)

    release.join()
    assert left == "" and time.monotonic() - started >= 1.5
    assert get_trainjob(api_client, namespace, sub.ref.name) is None
    assert client.BatchV1Api(api_client).list_namespaced_job(namespace, label_selector=selector).items == []
    assert core.list_namespaced_pod(namespace, label_selector=selector).items == []
    # It waited on the pod with a watch; never a GET of the TrainJob (or anything) in a loop.
    assert rec.count("GET", "/pods", watch="true") >= 1
    assert rec.count("GET", f"/trainjobs/{sub.ref.name}") == 0
    assert len(rec.requests) <= 10, rec.requests


def test_delete_reports_what_is_left_and_how_to_remove_it(kube_client, cluster, api_client, namespace):
    cluster.wait_gc_ready()
    kube = backend(kube_client, namespace)
    sub = kube.submit(manifest(namespace))
    owned_job(api_client, get_trainjob(api_client, namespace, sub.ref.name))
    core = client.CoreV1Api(api_client)
    selector = f"jobset.sigs.k8s.io/jobset-name={sub.ref.name}"
    pod = wait_for(lambda: core.list_namespaced_pod(namespace, label_selector=selector).items, what="the pod")[0]
    core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"finalizers": [HOLD]}})
    try:
        started = time.monotonic()
        left = kube.delete(sub.ref, wait=4)
        assert 3.5 <= time.monotonic() - started < 15
        assert f"Pod {pod.metadata.name} (terminating)" in left
        assert f"kubectl delete jobset,job,pod -n {namespace} -l jobset.sigs.k8s.io/jobset-name={sub.ref.name}" in left
    finally:
        core.patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"finalizers": None}})


def test_delete_never_touches_a_newer_job_of_the_same_name(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace)
    first = kube.submit(manifest(namespace, run="r1"))
    kube.delete(first.ref)
    second = kube.submit(manifest(namespace, run="r1"))
    assert kube.delete(JobRef(namespace, first.ref.name, first.ref.uid)) == ""
    assert get_trainjob(api_client, namespace, second.ref.name)["metadata"]["uid"] == second.ref.uid


# ----------------------------------------------------------------------------- lineage: one live job per run and task


def test_a_retry_with_changed_inputs_replaces_the_stale_job_and_says_so(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace)
    stale = kube.submit(manifest(namespace, dead_launcher(), run="r1", env={"LR": "0.1"}))
    other_task = kube.submit(manifest(namespace, dead_launcher(), run="r1", task="evaluate"))
    other_run = kube.submit(manifest(namespace, dead_launcher(), run="r2", env={"LR": "0.1"}))

    retry = kube.submit(manifest(namespace, run="r1", env={"LR": "0.2"}))

    assert retry.ref.name != stale.ref.name and not retry.adopted
    assert any(f"replaced stale TrainJob {stale.ref}" in note for note in retry.notes), retry.notes
    names = sorted(j["metadata"]["name"] for j in trainjobs(api_client, namespace))
    assert names == sorted([retry.ref.name, other_task.ref.name, other_run.ref.name])


def test_an_explicitly_named_retry_with_changed_inputs_replaces_the_stale_job_of_that_name(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace)
    stale = kube.submit(manifest(namespace, dead_launcher(), run="r1", name="fixed", env={"LR": "0.1"}))
    old_digest = get_trainjob(api_client, namespace, "fixed")["metadata"]["labels"][spec.LABEL_DIGEST]
    other_run = kube.submit(manifest(namespace, dead_launcher(), run="r2", name="fixed-r2", env={"LR": "0.1"}))

    retry = kube.submit(manifest(namespace, run="r1", name="fixed", env={"LR": "0.2"}))

    assert retry.ref.name == "fixed" and retry.ref.uid != stale.ref.uid and not retry.adopted
    assert any(f"replaced stale TrainJob {stale.ref} of an earlier try" in note for note in retry.notes), retry.notes
    now = get_trainjob(api_client, namespace, "fixed")
    assert now["metadata"]["uid"] == retry.ref.uid and now["metadata"]["labels"][spec.LABEL_DIGEST] != old_digest
    assert sorted((j["metadata"]["name"], j["metadata"]["uid"]) for j in trainjobs(api_client, namespace)) == sorted(
        [("fixed", retry.ref.uid), ("fixed-r2", other_run.ref.uid)]
    )


def test_an_explicitly_named_earlier_try_whose_launcher_runs_is_left_alone_with_a_clear_error(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace)
    running = kube.submit(manifest(namespace, owner.current(), run="r1", name="fixed", env={"LR": "0.1"}))  # this process: alive
    with pytest.raises(OwnershipError, match=r"this run and task with other inputs .* its launcher process \d+ on .* still runs it"):
        kube.submit(manifest(namespace, run="r1", name="fixed", env={"LR": "0.2"}))
    assert [j["metadata"]["uid"] for j in trainjobs(api_client, namespace)] == [running.ref.uid]


def test_an_explicitly_named_job_of_another_run_is_never_replaced(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace)
    theirs = kube.submit(manifest(namespace, dead_launcher(), run="r1", name="fixed", env={"LR": "0.1"}))
    with pytest.raises(OwnershipError, match="was not created by this task"):
        kube.submit(manifest(namespace, run="r2", name="fixed", env={"LR": "0.2"}))
    assert [j["metadata"]["uid"] for j in trainjobs(api_client, namespace)] == [theirs.ref.uid]


def test_a_sibling_followed_by_a_live_launcher_is_left_alone(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace)
    sibling = kube.submit(manifest(namespace, owner.current(), run="r1", env={"ITEM": "1"}))  # this process: alive
    mine = kube.submit(manifest(namespace, run="r1", env={"ITEM": "2"}))
    assert any(f"left TrainJob {sibling.ref}" in note and "still runs it" in note for note in mine.notes), mine.notes
    assert len(trainjobs(api_client, namespace)) == 2


def test_a_finished_earlier_try_is_kept(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace)
    done = kube.submit(manifest(namespace, dead_launcher(), run="r1", env={"LR": "0.1"}))
    set_condition(api_client, namespace, done.ref.name, "Complete", "AllJobsCompleted")
    retry = kube.submit(manifest(namespace, run="r1", env={"LR": "0.2"}))
    assert any("kept TrainJob" in note for note in retry.notes)
    assert len(trainjobs(api_client, namespace)) == 2


def test_adopting_records_the_new_launcher(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace)
    gone = dead_launcher()
    first = kube.submit(manifest(namespace, gone, run="r1"))
    again = kube.submit(manifest(namespace, run="r1"))
    assert again.adopted and again.ref.uid == first.ref.uid
    assert owner.parse(get_trainjob(api_client, namespace, first.ref.name)) == owner.current()


# ----------------------------------------------------------------------------- terminating jobs


def test_a_terminating_job_is_never_adopted_the_new_one_is_created_once_it_is_gone(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace, replace_timeout=60)
    m = manifest(namespace, run="r1")
    old = kube.submit(m)
    set_finalizers(api_client, namespace, old.ref.name, [HOLD])
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, old.ref.name)
    release = threading.Timer(2.0, lambda: set_finalizers(api_client, namespace, old.ref.name, []))
    release.start()
    started = time.monotonic()
    new = kube.submit(m)
    release.join()
    assert not new.adopted and new.ref.uid != old.ref.uid
    assert time.monotonic() - started >= 1.5
    assert any("being deleted; waited for it to go" in note for note in new.notes)


def test_when_the_failed_job_does_not_go_the_launcher_fails_clearly_and_creates_nothing(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace, replace_timeout=3)
    m = manifest(namespace, run="r1")
    old = kube.submit(m)
    set_condition(api_client, namespace, old.ref.name, "Failed")
    set_finalizers(api_client, namespace, old.ref.name, [HOLD])
    try:
        with pytest.raises(DeletionTimeoutError) as info:
            kube.submit(m)
        assert info.value.exit_code == 3
        assert "still being deleted after 3s" in str(info.value) and "not creating another one" in str(info.value)
        assert "finalizers" in str(info.value)
        assert [j["metadata"]["uid"] for j in trainjobs(api_client, namespace)] == [old.ref.uid]
    finally:
        set_finalizers(api_client, namespace, old.ref.name, [])


# ----------------------------------------------------------------------------- the server's refusals


@pytest.mark.parametrize("size", [1_600_000, 2 * 1024 * 1024, 4 * 1024 * 1024], ids=["etcd-limit", "grpc-limit", "http-413"])
def test_an_oversized_job_is_the_users_error_and_not_retried(kube_client, api_client, namespace, size):
    rec = recording(kube_client)
    m = manifest(namespace)
    m["spec"]["trainer"] = {"env": [{"name": "BLOB", "value": "x" * size}]}
    with pytest.raises(RejectedError, match="too large") as info:
        backend(rec, namespace).submit(m)
    assert info.value.exit_code == 2
    assert "volume or the pipeline workspace" in str(info.value)
    assert rec.count("POST", "/trainjobs") == 1
    assert trainjobs(api_client, namespace) == []


def test_a_policy_denial_carries_the_policys_message_not_rbac_advice(kube_client, api_client, namespace):
    admission = client.AdmissionregistrationV1Api(api_client)
    name = f"deny-{namespace}"
    policy = {
        "metadata": {"name": name},
        "spec": {
            "failurePolicy": "Fail",
            "matchConstraints": {
                "resourceRules": [{"apiGroups": [spec.GROUP], "apiVersions": ["*"], "operations": ["CREATE"], "resources": [spec.PLURAL]}]
            },
            "validations": [{"expression": "false", "message": "TrainJobs need a cost-center label"}],
        },
    }
    binding = {
        "metadata": {"name": name},
        "spec": {
            "policyName": name,
            "validationActions": ["Deny"],
            "matchResources": {"namespaceSelector": {"matchLabels": {"kubernetes.io/metadata.name": namespace}}},
        },
    }
    admission.create_validating_admission_policy(policy)
    admission.create_validating_admission_policy_binding(binding)
    try:
        kube = backend(kube_client, namespace)

        def denied():
            try:
                kube.submit(manifest(namespace))
            except RejectedError as e:
                return e
            kube.delete(JobRef(namespace, trainjobs(api_client, namespace)[0]["metadata"]["name"]))  # policy not active yet
            return None

        error = wait_for(denied, timeout=30, what="the policy to be enforced")
        assert "TrainJobs need a cost-center label" in str(error)
        assert not isinstance(error, ForbiddenError) and "rbac" not in str(error).lower()
    finally:
        admission.delete_validating_admission_policy_binding(name)
        admission.delete_validating_admission_policy(name)


def test_forcing_v21_on_a_v22_cluster_says_which_api_to_use(kube_client, api_client, namespace):
    m = owner.annotate(spec.render(manifest_inputs(namespace), api_version="v2.1"))
    with pytest.raises(RejectedError, match="this cluster serves Trainer v2.2 or later.*use api_version auto or v2.2"):
        backend(kube_client, namespace, api_version="v2.1").submit(m)
    assert trainjobs(api_client, namespace) == []


def test_a_v22_manifest_on_a_v21_cluster_says_which_api_to_use_and_auto_detects_it(kube_client, cluster, api_client, namespace):
    m = owner.annotate(spec.render(manifest_inputs(namespace), api_version="v2.2"))
    rec = recording(kube_client)
    with cluster.use_trainjob_crd(OLDER / "trainjobs-v2.1.0.yaml"):
        with pytest.raises(RejectedError, match="this cluster serves Trainer v2.1.*use api_version auto or v2.1"):
            backend(kube_client, namespace, api_version="v2.2").submit(m)
        assert backend(rec, namespace).detect_api_version() == "v2.1"
    assert backend(rec, namespace).detect_api_version() == "v2.2"
    # Two detections, one small dry-run request each; the 1 MB OpenAPI document is never read.
    assert rec.count("POST", "/trainjobs", dryRun="All") == 2
    assert rec.count("GET", "/openapi/") == 0
    assert trainjobs(api_client, namespace) == []


def manifest_inputs(namespace: str):
    from k8s_objects import inputs

    return inputs(namespace, node_selector={"a": "b"})


# ----------------------------------------------------------------------------- watch


def test_a_watch_from_a_compacted_version_gets_a_real_410_and_relists(kube_client, api_client, namespace):
    kube = backend(kube_client, namespace)
    sub = kube.submit(manifest(namespace))
    path = f"/apis/{spec.GROUP}/{spec.VERSION}/namespaces/{namespace}/{spec.PLURAL}"
    events = watch(kube_client, path, [("fieldSelector", f"metadata.name={sub.ref.name}")], resource_version="1", timeout_seconds=5)
    first = next(e for e in events if e is not None)
    # Started from a version, the watch lists only after the server said 410 Gone.
    assert first[0] == "LIST" and [i["metadata"]["uid"] for i in first[1]["items"]] == [sub.ref.uid]


# ----------------------------------------------------------------------------- least privilege


def test_the_pipeline_runner_role_covers_submit_replace_and_delete(kube_client, cluster, api_client, namespace):
    import uuid

    import yaml

    rbac = client.RbacAuthorizationV1Api(api_client)
    client.CoreV1Api(api_client).create_namespaced_service_account(namespace, {"metadata": {"name": "pipeline-runner"}})
    docs = [d for d in yaml.safe_load_all((Path(__file__).resolve().parents[2] / "deploy" / "rbac.yaml").read_text()) if d]
    suffix = uuid.uuid4().hex[:8]
    cleanup = []
    for doc in docs:
        doc["metadata"].pop("namespace", None)
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        if doc["kind"] == "Role":
            rbac.create_namespaced_role(namespace, doc)
        elif doc["kind"] == "RoleBinding":
            rbac.create_namespaced_role_binding(namespace, doc)
        else:
            doc["metadata"]["name"] += f"-{suffix}"
            if doc["kind"] == "ClusterRole":
                rbac.create_cluster_role(doc)
                cleanup.append((rbac.delete_cluster_role, doc["metadata"]["name"]))
            else:
                doc["roleRef"]["name"] += f"-{suffix}"
                rbac.create_cluster_role_binding(doc)
                cleanup.append((rbac.delete_cluster_role_binding, doc["metadata"]["name"]))
    runner = recording(kube_client)
    runner.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:pipeline-runner")
    try:
        kube = backend(runner, namespace)
        assert kube.detect_api_version(runtime=("ClusterTrainingRuntime", "torch-distributed")) == "v2.2"
        stale = kube.submit(manifest(namespace, dead_launcher(), run="r1", env={"LR": "1"}))
        fresh = kube.submit(manifest(namespace, run="r1", env={"LR": "2"}))
        assert any("replaced stale" in n for n in fresh.notes) and get_trainjob(api_client, namespace, stale.ref.name) is None
        assert kube.delete(fresh.ref, wait=10) == ""
        assert rec_paths(runner, "/jobs", "/pods")  # the deletion waited on Jobs and pods too, as the runner
        assert [r for r in runner.refused if r[0] == 403] == []
    finally:
        for delete, name in cleanup:
            delete(name)


def rec_paths(rec, *parts: str) -> bool:
    return all(any(part in path for _, path, _ in rec.requests) for part in parts)
