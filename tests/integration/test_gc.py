"""``kfp-trainer gc`` on the real API server: what it lists, why, and what ``--yes`` deletes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest
from k8s_objects import backend, dead_launcher, inert, manifest, set_condition, trainjobs
from kubernetes import client

from kfp_trainer import spec
from kfp_trainer.backends import owner
from kfp_trainer.gc import Collector

pytestmark = pytest.mark.timeout(180)


def launcher_pod(api, namespace: str, name: str, phase: str | None = None) -> dict:
    core = client.CoreV1Api(api)
    pod = core.create_namespaced_pod(
        namespace, {"metadata": {"name": name}, "spec": {"containers": [{"name": "main", "image": "busybox"}]}}
    )
    if phase:
        core.patch_namespaced_pod_status(name, namespace, {"status": {"phase": phase}})
    return {"pod": f"{namespace}/{name}", "uid": pod.metadata.uid}


def gc_cli(cluster, *args: str) -> str:
    done = subprocess.run(
        [sys.executable, "-m", "kfp_trainer.cli", "gc", "--kubeconfig", cluster.kubeconfig, *args],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    return done.stdout


def test_gc_lists_jobs_whose_launcher_is_gone_and_deletes_only_those_with_yes(kube_client, cluster, api_client, namespace):
    kube = backend(kube_client, namespace)
    jobs = {
        "pod-missing": kube.submit(manifest(namespace, {"pod": f"{namespace}/launcher-gone", "uid": "0000"}, task="a")),
        "pod-running": kube.submit(manifest(namespace, launcher_pod(api_client, namespace, "launcher-running"), task="b")),
        # A pod of that name exists, but not the one recorded: the launcher's pod was replaced.
        "pod-replaced": kube.submit(
            manifest(namespace, {**launcher_pod(api_client, namespace, "launcher-again"), "uid": "an-older-pod"}, task="c")
        ),
        "finished-job": kube.submit(manifest(namespace, dead_launcher(), task="d")),
        "process-alive": kube.submit(manifest(namespace, owner.current(), task="e")),
        "process-gone": kube.submit(manifest(namespace, dead_launcher(), task="f")),
    }
    set_condition(api_client, namespace, jobs["finished-job"].ref.name, "Complete", "AllJobsCompleted")
    unmanaged = inert(spec.render(spec.TrainJobInputs(run_id="x", task_name="g", namespace=namespace)))
    unmanaged["metadata"]["labels"].pop("app.kubernetes.io/managed-by")
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, unmanaged)
    garbage = {jobs[k].ref.name for k in ("pod-missing", "pod-replaced", "process-gone")}

    listed = gc_cli(cluster, "-n", namespace)

    assert f"6 TrainJob(s) created by kfp-trainer in namespace {namespace}; 3 to collect" in listed
    shown = {line.split()[1] for line in listed.splitlines()[2:] if line.startswith(namespace)}
    assert shown == garbage
    assert f"task gone: launcher pod {namespace}/launcher-gone no longer runs" in listed
    assert "dry run: nothing deleted" in listed
    assert len(trainjobs(api_client, namespace)) == 7

    deleted = gc_cli(cluster, "-n", namespace, "--yes")

    for name in garbage:
        assert f"deleted TrainJob {namespace}/{name}" in deleted
    left = {j["metadata"]["name"] for j in trainjobs(api_client, namespace)}
    kept = {jobs[k].ref.name for k in ("pod-running", "finished-job", "process-alive")} | {unmanaged["metadata"]["name"]}
    assert left == kept


def test_gc_collects_by_age_and_by_run_gone(kube_client, api_client, namespace, workflows):
    kube = backend(kube_client, namespace)
    here = owner.current()
    live_run = kube.submit(manifest(namespace, here, run="run-live", task="a"))
    ended_run = kube.submit(manifest(namespace, here, run="run-ended", task="a"))
    deleted_run = kube.submit(manifest(namespace, here, run="run-deleted", task="a"))
    for run, phase in (("run-live", "Running"), ("run-ended", "Failed")):
        wf = {
            "apiVersion": "argoproj.io/v1alpha1",
            "kind": "Workflow",
            "metadata": {"name": f"wf-{run}", "labels": {"pipeline/runid": run}},
        }
        workflows.create_namespaced_custom_object("argoproj.io", "v1alpha1", namespace, "workflows", wf)
        workflows.patch_namespaced_custom_object_status(
            "argoproj.io", "v1alpha1", namespace, "workflows", f"wf-{run}", {"status": {"phase": phase}}
        )

    found = {c.name: c for c in (Collector(kube_client).inspect(j) for j in trainjobs(api_client, namespace))}
    assert found[live_run.ref.name].why == []
    assert found[ended_run.ref.name].why == ["run ended: Workflow wf-run-ended is Failed"]
    assert found[deleted_run.ref.name].why == [f"run gone: no Workflow labelled pipeline/runid=run-deleted in {namespace}"]

    later = Collector(kube_client, older_than=24 * 3600, now=time.time() + 2 * 86400)
    assert all("older than 1d" in later.inspect(j).why for j in trainjobs(api_client, namespace))
