"""Faults: a launcher that disappears for good, and a run that is deleted, while their TrainJob
runs on the real controllers. ``kfp-trainer gc`` finds the job, and ``--yes`` leaves nothing."""

from __future__ import annotations

import pytest
from helpers import wait_for
from kubernetes import client
from test_gc import gc_cli
from testcluster import PodScript

from kfp_trainer import spec
from kfp_trainer.backends import owner
from kfp_trainer.backends.kubernetes import KubernetesBackend

pytestmark = pytest.mark.timeout(180)
RUNNING = PodScript(lines=["training"], exit_delay=float("inf"))


def running_job(api_client, kube_client, namespace: str, identity: dict, run: str) -> str:
    """A TrainJob on the real controllers, its pods running, naming ``identity`` as its launcher."""
    inputs = spec.TrainJobInputs(run_id=run, task_name="train", namespace=namespace, pod_annotations=RUNNING.annotations())
    manifest = owner.annotate(spec.render(inputs), identity)
    ref = KubernetesBackend(kube_client, namespace=namespace).submit(manifest).ref
    core = client.CoreV1Api(api_client)
    wait_for(
        lambda: [
            p
            for p in core.list_namespaced_pod(namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={ref.name}").items
            if p.status.phase == "Running"
        ],
        60,
        what="the trainer pod running",
    )
    return ref.name


def test_gc_collects_the_job_of_a_launcher_pod_that_is_gone(cluster, api_client, kube_client, checked):
    core = client.CoreV1Api(api_client)
    pod = core.create_namespaced_pod(
        checked,
        {"metadata": {"name": "launcher"}, "spec": {"restartPolicy": "Always", "containers": [{"name": "main", "image": "busybox"}]}},
    )
    name = running_job(api_client, kube_client, checked, {"pod": f"{checked}/launcher", "uid": pod.metadata.uid}, "run-pod")
    assert "0 to collect" in gc_cli(cluster, "-n", checked)  # its launcher runs
    core.delete_namespaced_pod("launcher", checked, grace_period_seconds=0)
    wait_for(lambda: not core.list_namespaced_pod(checked, field_selector="metadata.name=launcher").items, what="the launcher pod gone")

    listed = gc_cli(cluster, "-n", checked)
    assert "1 to collect" in listed and f"task gone: launcher pod {checked}/launcher no longer runs" in listed
    deleted = gc_cli(cluster, "-n", checked, "--yes")
    assert f"deleted TrainJob {checked}/{name}" in deleted
    # (the namespace check then waits for the JobSet, Jobs and pods to go after it)


def test_gc_collects_the_job_of_a_run_that_was_deleted(cluster, api_client, kube_client, checked, workflows):
    wf = {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "metadata": {"name": "wf-run", "labels": {"pipeline/runid": "run-wf"}}}
    workflows.create_namespaced_custom_object("argoproj.io", "v1alpha1", checked, "workflows", wf)
    workflows.patch_namespaced_custom_object_status(
        "argoproj.io", "v1alpha1", checked, "workflows", "wf-run", {"status": {"phase": "Running"}}
    )
    name = running_job(api_client, kube_client, checked, owner.current(), "run-wf")  # its launcher (this process) still runs
    assert "0 to collect" in gc_cli(cluster, "-n", checked)
    workflows.delete_namespaced_custom_object("argoproj.io", "v1alpha1", checked, "workflows", "wf-run")  # the run is deleted in KFP

    listed = gc_cli(cluster, "-n", checked)
    assert f"run gone: no Workflow labelled pipeline/runid=run-wf in {checked}" in listed
    deleted = gc_cli(cluster, "-n", checked, "--yes")
    assert f"deleted TrainJob {checked}/{name}" in deleted
