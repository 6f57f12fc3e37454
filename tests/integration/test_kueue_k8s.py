"""TrainJobs queued by the real Kueue v0.17.0 (its manager: controllers, scheduler and webhooks,
built from the Go module) in the test cluster: admission after a wait, a queue that can never
admit the job, preemption by a higher-priority job and re-admission, and cancels while queued
and while preempted. The pods are KWOK's, scripted (hack/k8s/podscript.py).
"""

from __future__ import annotations

import io
import os
import signal
import subprocess
import sys
import threading
import time
import uuid
from dataclasses import dataclass

import pytest
from helpers import get_trainjob, list_trainjobs, pods, wait_for
from kubernetes import client
from test_progress_queues_k8s import Step, exit_trainer
from testcluster import PodScript, queues
from testcluster.kueue import MANAGED_NAMESPACES, PRIORITY_LABEL

from kfp_trainer import spec
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import CancelledError, CannotStartError, TimeLimitError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

pytestmark = pytest.mark.timeout(300)
GPUS = 8  # the ClusterQueue's GPU quota: one KWOK GPU node's worth
LONG = PodScript(lines=["epoch 1 loss=0.9"], exit_delay=float("inf"))  # runs until told to exit
SHORT = PodScript(lines=["epoch 1 loss=0.5", "epoch 2 loss=0.25"])


@dataclass(frozen=True)
class Queue:
    local: str
    cluster: str
    flavor: str


@pytest.fixture
def queue(kueue, api_client, namespace):
    """A LocalQueue ``team-gpu`` in the test's namespace, on a ClusterQueue of its own with
    8 GPUs in a flavor of the KWOK GPU nodes (preemption within it: LowerPriority)."""
    client.CoreV1Api(api_client).patch_namespace(namespace, {"metadata": {"labels": MANAGED_NAMESPACES}})  # Kueue's to manage
    tag = namespace.rsplit("-", 1)[-1]
    q = Queue("team-gpu", f"cq-{tag}", f"gpu-{tag}")
    queues.resource_flavor(api_client, q.flavor)
    queues.cluster_queue(api_client, q.cluster, q.flavor, {"cpu": 64, "memory": "512Gi", "nvidia.com/gpu": GPUS})
    queues.local_queue(api_client, namespace, q.local, q.cluster)
    queues.wait_active(api_client, q.cluster)
    yield q
    for job in list_trainjobs(api_client, namespace):  # the namespace goes too; free the ClusterQueue first
        client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
            spec.GROUP, spec.VERSION, namespace, spec.PLURAL, job["metadata"]["name"]
        )
    queues.delete(api_client, "localqueues", q.local, namespace)
    queues.delete(api_client, "clusterqueues", q.cluster)
    queues.delete(api_client, "resourceflavors", q.flavor)


@pytest.fixture
def priorities(kueue, api_client):
    """WorkloadPriorityClasses ``low`` (100) and ``high`` (1000), named for this test."""
    tag = uuid.uuid4().hex[:6]
    names = {"low": f"low-{tag}", "high": f"high-{tag}"}
    queues.priority_class(api_client, names["low"], 100)
    queues.priority_class(api_client, names["high"], 1000)
    yield names
    for name in names.values():
        queues.delete(api_client, "workloadpriorityclasses", name)


def submit(api, namespace: str, queue: str, script: PodScript, *, gpus: int = GPUS, priority: str = "", task: str = "other") -> dict:
    """A TrainJob of another user in ``queue`` (rendered as the launcher renders one), created."""
    patch = {"metadata": {"labels": {PRIORITY_LABEL: priority}}} if priority else {}
    inputs = TrainJobInputs(run_id=f"run-{uuid.uuid4().hex[:8]}", task_name=task, namespace=namespace, queue_name=queue,
                            suspend=True, resources_per_node={"gpu": gpus}, pod_annotations=script.annotations(), patch=patch)  # fmt: skip
    body = spec.render(inputs)
    return client.CustomObjectsApi(api).create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, body)


def running_pod(api, namespace: str, name: str, timeout: float = 60):
    return wait_for(lambda: next(iter(pods(api, namespace, name, phase="Running")), None), timeout, what=f"a running pod of {name}")


def workloads_of(api, namespace: str, job: str) -> list[dict]:
    return [w for w in queues.workloads(api, namespace) if w["metadata"]["name"].startswith(f"trainjob-{job}-")]


def nothing_left(api, namespace: str, name: str) -> None:
    """The TrainJob, its Workload and its pods are gone."""
    assert get_trainjob(api, namespace, name) is None
    wait_for(lambda: not workloads_of(api, namespace, name), 30, what=f"the Workload of {name} deleted")
    wait_for(lambda: not pods(api, namespace, name), 30, what=f"the pods of {name} deleted")


def test_a_job_waits_for_admission_is_told_why_then_runs_and_succeeds(kube_client, api_client, namespace, queue, tmp_path, monkeypatch):
    holder = submit(api_client, namespace, queue.local, LONG)  # takes the queue's 8 GPUs
    holder_pod = running_pod(api_client, namespace, holder["metadata"]["name"])
    step = Step(kube_client, namespace, tmp_path, monkeypatch, queue_name=queue.local, resources_per_node={"gpu": GPUS},
                start_timeout=5.0, pod_annotations=SHORT.annotations())  # fmt: skip
    name = step.name()
    step.says(f"TrainJob is queued in LocalQueue {queue.local}")
    # Kueue's own reason, from its scheduler's event on the job's Workload.
    step.says(f"queue {queue.local}: Pending: couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu "
              f"in flavor {queue.flavor}, 8 more needed")  # fmt: skip
    (workload,) = workloads_of(api_client, namespace, name)
    reserved = next(c for c in workload["status"]["conditions"] if c["type"] == "QuotaReserved")
    assert reserved["status"] == "False" and "insufficient unused quota" in reserved["message"]
    time.sleep(6)  # queued longer than start_timeout: not a failure
    exit_trainer(api_client, namespace, holder_pod)  # the holder finishes; Kueue admits the step's job
    page = step.finish(timeout=120)
    text = step.out.getvalue()
    assert "admitted after" in text and "epoch 2 loss=0.25" in text
    assert step.metrics["queued_seconds"] >= 6.0 > 5.0 and "preempted_seconds" not in step.metrics
    assert [j["metadata"]["name"] for j in list_trainjobs(api_client, namespace) if j["metadata"]["name"] == name] == [name]
    assert f"<td>Kueue LocalQueue</td><td>{queue.local}</td>" in page and f"queued in LocalQueue {queue.local}" in page


def test_queue_timeout_still_bounds_the_wait_and_leaves_nothing(kube_client, api_client, namespace, queue):
    submit(api_client, namespace, queue.local, LONG)
    out = io.StringIO()
    inp = TrainJobInputs(run_id=f"run-{uuid.uuid4().hex[:8]}", task_name="train", namespace=namespace, queue_name=queue.local,
                         resources_per_node={"gpu": GPUS})  # fmt: skip
    launcher = Launcher(KubernetesBackend(kube_client, namespace=namespace, watch_timeout=5),
                        LaunchOptions(queue_timeout=4, blocker_check_interval=1.0), out=out)  # fmt: skip
    with pytest.raises(TimeLimitError, match=f"waited in queue {queue.local} longer than queue_timeout=4s") as info:
        launcher.run(prepare(launcher.backend, inp))
    assert info.value.reason == "QueueTimeout" and "insufficient unused quota" in out.getvalue()
    nothing_left(api_client, namespace, prepare(launcher.backend, inp).manifest["metadata"]["name"])


def test_more_than_the_queue_can_ever_give_fails_in_seconds_with_kueues_reason(kube_client, api_client, namespace, queue):
    out = io.StringIO()
    inp = TrainJobInputs(run_id=f"run-{uuid.uuid4().hex[:8]}", task_name="train", namespace=namespace, queue_name=queue.local,
                         num_nodes=2, resources_per_node={"gpu": GPUS})  # fmt: skip  # 16 GPUs; the queue has 8
    launcher = Launcher(KubernetesBackend(kube_client, namespace=namespace, watch_timeout=5),
                        LaunchOptions(queue_timeout=600, start_timeout=600, blocker_check_interval=1.0), out=out)  # fmt: skip
    began = time.monotonic()
    with pytest.raises(CannotStartError) as info:
        launcher.run(prepare(launcher.backend, inp))
    assert time.monotonic() - began < 60  # the fatal-blocker grace, not a time limit
    assert info.value.reason == "InsufficientQuota"
    message = str(info.value)
    assert "cannot start: InsufficientQuota: Workload" in message and "more than its ClusterQueue can ever admit" in message
    assert f"insufficient quota for nvidia.com/gpu in flavor {queue.flavor}" in message and "> maximum capacity (8)" in message
    nothing_left(api_client, namespace, prepare(launcher.backend, inp).manifest["metadata"]["name"])


def test_a_preempted_job_waits_is_readmitted_and_succeeds_as_the_same_trainjob(
    kube_client, api_client, namespace, queue, priorities, tmp_path, monkeypatch
):
    step = Step(kube_client, namespace, tmp_path, monkeypatch, queue_name=queue.local, resources_per_node={"gpu": GPUS},
                run_timeout=25.0, pod_annotations=LONG.annotations())  # fmt: skip
    name = step.name()
    running_pod(api_client, namespace, name)
    step.says("trainer is running")
    uid = get_trainjob(api_client, namespace, name)["metadata"]["uid"]
    urgent = submit(api_client, namespace, queue.local, LONG, priority=priorities["high"], task="urgent")
    urgent_name = urgent["metadata"]["name"]
    step.says(f"preempted or evicted by Kueue; waiting to be re-admitted to LocalQueue {queue.local}")
    preempted_at = time.monotonic()
    step.says(f"queue {queue.local}: Preempted: preempted by TrainJob {urgent_name} in ClusterQueue {queue.cluster} "
              "(prioritization in the ClusterQueue); waiting to be re-admitted")  # fmt: skip
    assert get_trainjob(api_client, namespace, name)["spec"]["suspend"] is True
    wait_for(lambda: not pods(api_client, namespace, name), 30, what="the preempted job's pods deleted")
    time.sleep(max(0.0, preempted_at + 30 - time.monotonic()))  # suspended longer than run_timeout: not running time
    exit_trainer(api_client, namespace, running_pod(api_client, namespace, urgent_name))
    step.says("re-admitted after")
    exit_trainer(api_client, namespace, running_pod(api_client, namespace, name, timeout=90))  # the new pods run; then finish
    page = step.finish(timeout=120)
    jobs = [j for j in list_trainjobs(api_client, namespace) if j["metadata"]["name"] == name]
    assert [j["metadata"]["uid"] for j in jobs] == [uid]  # one TrainJob, resumed
    assert step.metrics["preempted_seconds"] >= 30 and step.metrics["running_seconds"] < 25
    text = step.out.getvalue()
    assert "preempted 1x:" in text and text.count("epoch 1 loss=0.9") >= 2  # the trainer ran again
    assert "<td>Preempted</td><td>1 time(s)" in page
    for event in ("suspended while running: preempted or evicted by Kueue", "re-admitted after"):
        assert event in page.split("<h2>Timeline</h2>")[1]


def launch_cli(cluster, namespace: str, queue: str, script: PodScript) -> subprocess.Popen:
    import json

    args = ["--runtime", "torch-distributed", "--run-id", f"run-{uuid.uuid4().hex[:8]}", "--task-name", "train",
            "--namespace", namespace, "--queue-name", queue, "--resources-per-node", json.dumps({"gpu": GPUS}),
            "--pod-annotations", json.dumps(script.annotations())]  # fmt: skip
    return subprocess.Popen(
        [sys.executable, "-m", "kfp_trainer.cli", "launch", "--kubeconfig", cluster.kubeconfig, *args],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )  # fmt: skip


def cancel_when(proc: subprocess.Popen, text: str, timeout: float = 90) -> str:
    """SIGTERM the step once its output has ``text``; its whole output."""
    seen: list[str] = []
    found = threading.Event()

    def read() -> None:
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if text in line:
                found.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert found.wait(timeout), f"{text!r} not in the step's output:\n{''.join(seen)}"
        proc.send_signal(signal.SIGTERM)
        proc.wait(60)
        reader.join(10)
    finally:
        if proc.poll() is None:
            proc.kill()
    return "".join(seen)


def job_named_in(output: str, namespace: str) -> str:
    return output.split(f"TrainJob {namespace}/")[1].split()[0].rstrip(":")


def test_a_cancel_while_queued_deletes_the_job_and_its_workload(cluster, api_client, namespace, queue):
    submit(api_client, namespace, queue.local, LONG)
    proc = launch_cli(cluster, namespace, queue.local, SHORT)
    output = cancel_when(proc, f"queue {queue.local}: Pending: ")
    assert proc.returncode == CancelledError.exit_code, output
    name = job_named_in(output, namespace)
    assert f"deleting TrainJob {namespace}/{name}" in output
    nothing_left(api_client, namespace, name)


def test_a_cancel_while_preempted_deletes_the_job_and_its_workload(cluster, api_client, namespace, queue, priorities):
    proc = launch_cli(cluster, namespace, queue.local, LONG)
    try:
        name = wait_for(lambda: next((j["metadata"]["name"] for j in list_trainjobs(api_client, namespace)), None), 60, what="the job")
        running_pod(api_client, namespace, name)
        submit(api_client, namespace, queue.local, LONG, priority=priorities["high"], task="urgent")
    except BaseException:
        proc.kill()
        raise
    output = cancel_when(proc, "waiting to be re-admitted")
    assert proc.returncode == CancelledError.exit_code, output
    assert f"deleting TrainJob {namespace}/{name}" in output
    nothing_left(api_client, namespace, name)


def test_kueue_drops_a_v23_pod_patch_field_at_admission_and_the_step_fails_fast_with_the_trainers_refusal(
    kube_client, api_client, namespace, queue
):
    """Kueue v0.17.0 is built with the Trainer v2.2 TrainJob API: when it admits a job it writes the
    TrainJob back without ``terminationGracePeriodSeconds`` (v2.3) in our runtime patch, and the
    Trainer's JobSet update is then refused (its pod template is immutable). Upstream behaviour,
    reported within seconds instead of a job that never starts."""
    out = io.StringIO()
    inp = TrainJobInputs(run_id=f"run-{uuid.uuid4().hex[:8]}", task_name="train", namespace=namespace, queue_name=queue.local,
                         termination_grace_period_seconds=45, pod_annotations=SHORT.annotations())  # fmt: skip
    launcher = Launcher(KubernetesBackend(kube_client, namespace=namespace, watch_timeout=5),
                        LaunchOptions(blocker_check_interval=1.0, fatal_blocker_grace=5), out=out)  # fmt: skip
    began = time.monotonic()
    with pytest.raises(CannotStartError, match="TrainJobResourcesCreationFailed") as info:
        launcher.run(prepare(launcher.backend, inp))
    assert time.monotonic() - began < 90 and "field is immutable" in str(info.value)
    assert "admitted after" in out.getvalue()
    nothing_left(api_client, namespace, prepare(launcher.backend, inp).manifest["metadata"]["name"])
