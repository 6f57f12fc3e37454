"""A stop signal at any moment of a launch ends with the TrainJob deleted or never created (real API server)."""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from k8s_objects import backend, inputs, recording, trainjobs, wait_for
from kubernetes import client

from kfp_trainer import spec
from kfp_trainer.backends.kube.watch import wait_gone
from kfp_trainer.cancel import stopping
from kfp_trainer.errors import CancelledError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare

pytestmark = pytest.mark.timeout(300)


def test_a_signal_while_the_create_request_is_in_flight_deletes_what_it_created(kube_client, api_client, namespace):
    def sigterm_on_create(request):
        method, path, query = request
        if method == "POST" and path.endswith(f"/{spec.PLURAL}") and "dryRun" not in query:
            os.kill(os.getpid(), signal.SIGTERM)  # lands while the request is being sent

    rec = recording(kube_client, before=sigterm_on_create)
    out = io.StringIO()
    kube = backend(rec, namespace)
    with pytest.raises(CancelledError), stopping() as stop:  # as the entry points do
        Launcher(kube, LaunchOptions(logs="none"), out=out, stop=stop).run(prepare(kube, inputs(namespace, suspend=True), stop=stop))
    assert rec.count("POST", f"/{spec.PLURAL}") >= 1  # the create did reach the server
    assert "cancelled while submitting; deleted TrainJob" in out.getvalue()
    assert trainjobs(api_client, namespace) == []


def launch_cmd(cluster, namespace: str, run_id: str) -> list[str]:
    return [
        sys.executable,
        "-m",
        "kfp_trainer.cli",
        "launch",
        "--kubeconfig",
        cluster.kubeconfig,
        "--namespace",
        namespace,
        "--runtime",
        "torch-distributed",
        "--run-id",
        run_id,
        "--task-name",
        "train",
        "--logs",
        "none",
        "--suspend",  # with a real Trainer controller too, the job waits for the signal
    ]


def start(cluster, namespace: str, run_id: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}
    return subprocess.Popen(launch_cmd(cluster, namespace, run_id), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)


def test_sigterm_swept_from_process_start_to_following_never_leaks_a_job(cluster, api_client, namespace):
    # How long a launch takes to create its job here (the slowest of three: one fast launch on a
    # shared machine would end the sweep before any job exists): the sweep spans that and beyond.
    created_after = 0.0
    for i in range(3):
        proc = start(cluster, namespace, f"calibrate-{i}")
        began = time.monotonic()
        for line in proc.stdout:  # type: ignore[union-attr]
            if "created TrainJob" in line:
                break
        created_after = max(created_after, time.monotonic() - began)
        proc.send_signal(signal.SIGTERM)
        proc.communicate(timeout=60)
        assert proc.returncode == 130
    wait_for(lambda: trainjobs(api_client, namespace) == [], timeout=10, what="the calibration jobs deleted")

    points = 20
    outcomes = []

    def signal_at(i: int, delay: float) -> None:
        run_id = f"sweep-{i}"
        proc = start(cluster, namespace, run_id)
        time.sleep(delay)
        proc.send_signal(signal.SIGTERM)
        output, _ = proc.communicate(timeout=60)
        outcomes.append((round(delay, 2), proc.returncode, "created TrainJob" in output))
        # Killed by the signal's default action before handlers were installed (nothing created yet), or cancelled.
        assert proc.returncode in (130, -signal.SIGTERM), (delay, output)
        left = [j["metadata"]["name"] for j in trainjobs(api_client, namespace) if j["metadata"]["labels"].get(spec.LABEL_RUN) == run_id]
        assert left == [], (delay, output)

    for i in range(points):
        signal_at(i, created_after * 1.4 * i / (points - 1))
    # Launches slower than the calibration's (a busier moment of a shared machine): later points
    # until one lands after its job existed, each 1.3 times as late as the one before.
    for i in range(points, points + 8):
        if any(created for _, _, created in outcomes):
            break
        signal_at(i, created_after * 1.4 * 1.3 ** (i - points + 1))
    # The sweep really crossed creation: some signals landed after the job existed.
    assert any(created for _, _, created in outcomes), outcomes
    assert any(rc == 130 for _, rc, _ in outcomes), outcomes


def test_a_signal_ends_a_wait_for_an_earlier_try_to_go_at_once_but_never_a_deletions_wait(kube_client, api_client, namespace):
    """The handler shuts the waiting watch's stream down: without that, the read would go on
    until the server ends the stream (a signal whose handler does not raise ends no read)."""
    core = client.CoreV1Api(api_client)
    core.create_namespaced_config_map(namespace, {"metadata": {"name": "held", "finalizers": ["kfp-trainer.test/hold"]}})
    core.delete_namespaced_config_map("held", namespace)  # stays, being deleted, until the finalizer goes
    path, selectors = f"/api/v1/namespaces/{namespace}/configmaps", [("fieldSelector", "metadata.name=held")]
    try:
        with pytest.raises(CancelledError), stopping() as stop:
            threading.Timer(1.0, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
            began = time.monotonic()
            try:
                wait_gone(kube_client, path, selectors, timeout=20, stop=stop)
            finally:
                assert time.monotonic() - began < 3
        with pytest.raises(CancelledError), stopping():  # a deletion's wait: a signal changes nothing, the bound ends it
            threading.Timer(0.5, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()
            began = time.monotonic()
            left = wait_gone(kube_client, path, selectors, timeout=3)
            assert [o["metadata"]["name"] for o in left] == ["held"] and time.monotonic() - began >= 3
    finally:
        core.patch_namespaced_config_map("held", namespace, {"metadata": {"finalizers": None}})


def test_a_launcher_killed_before_it_could_delete_leaves_its_job_to_the_runs_garbage_collection(cluster, api_client, namespace):
    """The backstop of a cancel whose deletion never went out: the TrainJob is a dependent of the launcher pod's
    controller (a KFP step's: the run's Argo Workflow; a ConfigMap stands in for it here), so Kubernetes'
    garbage collector deletes it, and what it owns, when the run goes -- not when the pod goes: a retry's pod adopts."""
    core = client.CoreV1Api(api_client)
    run = core.create_namespaced_config_map(namespace, {"metadata": {"name": "workflow-stand-in"}})
    owner_ref = {"apiVersion": "v1", "kind": "ConfigMap", "name": run.metadata.name, "uid": run.metadata.uid, "controller": True}
    step = core.create_namespaced_pod(namespace, {
        "metadata": {"name": "step-pod", "ownerReferences": [owner_ref]},
        "spec": {"nodeSelector": {"kfp-trainer.test/no-node": "x"}, "containers": [{"name": "main", "image": "kfp-trainer.test/unused"}]},
    })  # fmt: skip
    env = {**os.environ, "PYTHONUNBUFFERED": "1", "KFP_POD_NAME": "step-pod", "KFP_POD_UID": step.metadata.uid, "POD_NAMESPACE": namespace}
    argv = launch_cmd(cluster, namespace, "killed-run")[:-1]  # not suspended: the Trainer controller makes its JobSet
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env=env)
    try:
        for line in proc.stdout:  # type: ignore[union-attr]
            if "created TrainJob" in line:
                break
        proc.kill()  # SIGKILL: no handler runs, nothing is deleted
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    [job] = trainjobs(api_client, namespace)
    assert job["metadata"]["ownerReferences"] == [{**{k: owner_ref[k] for k in ("apiVersion", "kind", "name", "uid")},
                                                   "blockOwnerDeletion": False}]  # fmt: skip
    core.delete_namespaced_pod("step-pod", namespace, grace_period_seconds=0)  # the step's pod lost: the job stays
    time.sleep(3)
    assert [j["metadata"]["name"] for j in trainjobs(api_client, namespace)] == [job["metadata"]["name"]]
    core.delete_namespaced_config_map(run.metadata.name, namespace)  # the run's Workflow goes (KFP: its TTL)
    wait_for(lambda: trainjobs(api_client, namespace) == [], timeout=60, what="the TrainJob collected with its run")
    wait_for(lambda: not client.CustomObjectsApi(api_client).list_namespaced_custom_object(
        "jobset.x-k8s.io", "v1alpha2", namespace, "jobsets")["items"], timeout=60, what="its JobSet collected")  # fmt: skip
