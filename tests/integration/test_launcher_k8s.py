"""The launcher and the Kubernetes backend against the test control plane: a real API
server with the real Trainer and JobSet controllers and webhooks; what the pods do is
scripted on them (``PodScript`` annotations through the launcher's ``pod_annotations``).
"""

from __future__ import annotations

import copy
import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from faults import api_via
from helpers import wait_for
from kubernetes import client
from testcluster import PodScript

from kfp_trainer import spec
from kfp_trainer.backends.kube.client import Client
from kfp_trainer.backends.kube.credentials import Credentials
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import (
    CancelledError,
    CannotStartError,
    InvalidSpecErrors,
    JobFailedError,
    OwnershipError,
    RejectedError,
    RuntimeNotFoundError,
    TimeLimitError,
)
from kfp_trainer.jobstatus import JobRef
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs
from tests.tcp_proxy import TcpProxy

REPO = Path(__file__).resolve().parents[2]
OLDER = REPO.parent / "shared" / "kubeflow-trainer-older"
pytestmark = pytest.mark.timeout(180)

FULL = dict(
    image="ghcr.io/example/trainer:1.0",
    command=["torchrun", "train.py"],
    args=["--epochs", "3"],
    env={"EPOCHS": "3"},
    num_nodes=2,
    num_proc_per_node=2,
    resources_per_node={"limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": 1}},
    dataset_uri="hf://tatsu-lab/alpaca",
    dataset_secret="hf-token",
    model_uri="s3://models/qwen",
    model_secret="s3-creds",
    labels={"team": "nlp"},
    annotations={"example.com/owner": "alice"},
    pod_labels={"example.com/tier": "train"},
    pod_annotations={"example.com/note": "x"},
    volumes=[{"name": "workspace", "persistentVolumeClaim": {"claimName": "ws-pvc"}}],
    volume_mounts=[{"name": "workspace", "mountPath": "/kfp-workspace"}],
    node_selector={"kubernetes.io/os": "linux"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    affinity={
        "nodeAffinity": {
            "preferredDuringSchedulingIgnoredDuringExecution": [
                {"weight": 1, "preference": {"matchExpressions": [{"key": "a", "operator": "In", "values": ["b"]}]}}
            ]
        }
    },
    service_account="default",
    image_pull_secrets=["regcred"],
    queue_name="team-queue",
)


def inputs(namespace: str, task: str = "train", **kw) -> TrainJobInputs:
    return TrainJobInputs(run_id=f"run-{task}-{time.time_ns()}", task_name=task, namespace=namespace, **kw)


def backend_for(api, namespace: str, **kw) -> KubernetesBackend:
    return KubernetesBackend(api, namespace=namespace, watch_timeout=kw.pop("watch_timeout", 5), **kw)


def scripted(inp: TrainJobInputs, script: PodScript | None) -> TrainJobInputs:
    """``inp`` whose trainer pods act out ``script``."""
    if script is None:
        return inp
    return inp.model_copy(update={"pod_annotations": {**inp.pod_annotations, **script.annotations()}})


def launch(api, inp: TrainJobInputs, script: PodScript | None = None, *, backend=None, **options):
    backend = backend or backend_for(api, inp.namespace)
    out = io.StringIO()
    launcher = Launcher(backend, LaunchOptions(**{"blocker_check_interval": 1.0, **options}), out=out)
    try:
        return launcher.run(prepare(launcher.backend, scripted(inp, script))), out.getvalue()
    except Exception as e:
        e.output = out.getvalue()  # type: ignore[attr-defined]
        raise


def get_trainjob(api, namespace: str, name: str) -> dict | None:
    try:
        return client.CustomObjectsApi(api).get_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, name)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def list_trainjobs(api, namespace: str) -> list[dict]:
    return client.CustomObjectsApi(api).list_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL)["items"]


def relayed(out: str) -> list[str]:
    """The log lines the launcher relayed (its own messages left out)."""
    return [line for line in out.splitlines() if not line.startswith("[kfp-trainer]") and not line.startswith("  ")]


def runtime_with(name: str, namespace: str, restart_policy: str | None = None, backoff_limit: int | None = None) -> dict:
    """A namespaced TrainingRuntime like torch-distributed, with the given pod restart
    policy and Job backoff limit."""
    job_spec: dict = {"template": {"spec": {"containers": [{"name": "node", "image": "pytorch/pytorch"}]}}}
    if restart_policy:
        job_spec["template"]["spec"]["restartPolicy"] = restart_policy
    if backoff_limit is not None:
        job_spec["backoffLimit"] = backoff_limit
    return {
        "apiVersion": f"{spec.GROUP}/{spec.VERSION}",
        "kind": "TrainingRuntime",
        "metadata": {"name": name, "namespace": namespace, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {
                                "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                                "spec": job_spec,
                            },
                        }
                    ]
                }
            },
        },
    }


def set_runtime_script(api, namespace: str, name: str, script: PodScript) -> None:
    """Script the pods of every later TrainJob on runtime ``name`` (inputs stay the same)."""
    co = client.CustomObjectsApi(api)
    rt = co.get_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, "trainingruntimes", name)
    tmpl = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]
    tmpl.setdefault("metadata", {})["annotations"] = script.annotations()
    co.replace_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, "trainingruntimes", name, rt)


# ----------------------------------------------------------------------------- rendering vs storage


def test_stored_trainjob_equals_the_rendered_manifest(kube_client, api_client, namespace):
    backend = backend_for(kube_client, namespace)
    launcher = Launcher(backend, out=io.StringIO())
    full = {k: v for k, v in FULL.items() if k not in ("dataset_uri", "dataset_secret", "model_uri", "model_secret")}
    job = prepare(launcher.backend, scripted(inputs(namespace, **full), PodScript(exit_delay=float("inf"))))
    manifest = job.manifest
    assert job.api_version == "v2.2"
    submission = backend.submit(manifest)
    try:
        stored = get_trainjob(api_client, namespace, submission.ref.name)
        assert stored["metadata"]["labels"] == manifest["metadata"]["labels"]
        assert stored["metadata"]["annotations"] == manifest["metadata"]["annotations"]
        # The only differences: the CRD's defaults, and what the Trainer's defaulting webhook
        # writes back: the time of each runtime patch, quantities as strings.
        patches = stored["spec"].pop("runtimePatches")
        assert [p.pop("time") for p in patches] and patches == manifest["spec"]["runtimePatches"]
        expected = copy.deepcopy({k: v for k, v in manifest["spec"].items() if k != "runtimePatches"})
        expected["trainer"]["resourcesPerNode"]["limits"]["nvidia.com/gpu"] = "1"
        assert stored["spec"] == {**expected, "suspend": False, "managedBy": "trainer.kubeflow.org/trainjob-controller"}
    finally:
        backend.delete(submission.ref)


VARIANTS = [
    {},
    {k: v for k, v in FULL.items() if k not in ("dataset_uri", "dataset_secret", "model_uri", "model_secret")},
    {**FULL, "runtime": "torchtune-qwen2.5-1.5b", "num_nodes": 1, "pod_targets": ["dataset-initializer", "model-initializer"]},
    {"active_deadline_seconds": 600, "suspend": True},
    {
        "runtime": "torchtune-qwen2.5-1.5b",
        "pod_targets": ["dataset-initializer", "model-initializer"],
        "volume_mounts": [{"name": "initializer", "mountPath": "/workspace"}],
        "node_selector": {"a": "b"},
    },
    {
        "runtime": "mlx-distributed",
        "num_proc_per_node": 1,
        "env": [{"name": "T", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}],
    },
    {"patch": {"spec": {"managedBy": "trainer.kubeflow.org/trainjob-controller"}}},
]


@pytest.mark.parametrize("api_version", ["v2.2", "v2.1"])
def test_the_schema_and_the_trainer_webhooks_accept_every_rendered_manifest(kube_client, cluster, api_client, namespace, api_version):
    """Server-side dry runs go through the CRD schema (strict field validation) and the
    real Trainer webhooks (defaulting and validation against the named runtime)."""
    custom = client.CustomObjectsApi(api_client)

    def check(crd_version: str) -> None:
        backend = backend_for(kube_client, namespace)
        assert backend.detect_api_version() == crd_version
        for i, variant in enumerate(VARIANTS):
            variant = dict(variant)
            if crd_version == "v2.1":
                variant.pop("active_deadline_seconds", None)
            runtime = variant.get("runtime", "torch-distributed")
            jobs = backend.resolve_runtime(inputs(namespace, runtime=runtime)).job_names
            m = spec.render(inputs(namespace, task=f"v{i}", **variant), api_version=crd_version, runtime_jobs=jobs)
            custom.create_namespaced_custom_object(
                spec.GROUP, spec.VERSION, namespace, spec.PLURAL, m, field_validation="Strict", dry_run="All"
            )

    if api_version == "v2.2":
        check("v2.2")
    else:
        with cluster.use_trainjob_crd(OLDER / "trainjobs-v2.1.0.yaml"):
            check("v2.1")


@pytest.mark.trainer_versions
def test_strict_validation_rejects_unknown_fields_with_a_clear_error(kube_client, api_client, namespace):
    backend = backend_for(kube_client, namespace)
    m = spec.render(inputs(namespace, patch={"spec": {"trainer": {"numNode": 2}}}))
    with pytest.raises(RejectedError, match="numNode"):
        backend.submit(m)
    assert list_trainjobs(api_client, namespace) == []


def test_forced_v21_manifest_is_rejected_by_a_v23_server(kube_client, api_client, namespace):
    backend = backend_for(kube_client, namespace, api_version="v2.1")
    launcher = Launcher(backend, out=io.StringIO())
    with pytest.raises(RejectedError, match="podTemplateOverrides"):
        launcher.run(prepare(launcher.backend, inputs(namespace, node_selector={"a": "b"})))
    assert list_trainjobs(api_client, namespace) == []


# ----------------------------------------------------------------------------- runtime check


@pytest.mark.trainer_versions
def test_missing_runtime_lists_the_available_ones_and_creates_nothing(kube_client, api_client, namespace):
    with pytest.raises(RuntimeNotFoundError) as info:
        launch(kube_client, inputs(namespace, runtime="torch-distributd"))
    assert "ClusterTrainingRuntime/torch-distributed" in str(info.value)
    assert "ClusterTrainingRuntime/torchtune-llama3.2-1b" in str(info.value)
    assert list_trainjobs(api_client, namespace) == []


@pytest.mark.trainer_versions
def test_namespaced_runtime_is_found_in_the_job_namespace(kube_client, api_client, namespace):
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, "trainingruntimes", runtime_with("team-torch", namespace)
    )
    outcome, _ = launch(kube_client, inputs(namespace, runtime="team-torch", runtime_kind="TrainingRuntime"))
    assert outcome.succeeded and outcome.runtime == "TrainingRuntime/team-torch"


def test_bad_input_fails_before_any_api_call(namespace):
    dead = Client(Credentials("https://127.0.0.1:9"))  # nothing listens there
    with pytest.raises(InvalidSpecErrors, match="num_nodes"):
        launch(dead, inputs(namespace, num_nodes=0))


# ----------------------------------------------------------------------------- outcomes


@pytest.mark.trainer_versions
def test_success_streams_logs_and_parses_metrics(kube_client, api_client, namespace):
    lines = [f'{{"step": {i}, "loss": {1.0 / i:.3f}}}' for i in range(1, 9)] + ["done"]
    outcome, out = launch(kube_client, inputs(namespace), PodScript(lines=lines))
    assert outcome.succeeded and outcome.reason == "AllJobsCompleted"
    assert relayed(out) == lines
    assert outcome.metrics.final() == {"loss": 0.125} and outcome.metrics.best() == {"loss": 0.125}
    assert len(outcome.metrics.series("loss")) == 8
    assert get_trainjob(api_client, namespace, outcome.ref.name) is not None  # kept by default


def test_all_nodes_logs_are_prefixed(kube_client, api_client, namespace):
    outcome, out = launch(kube_client, inputs(namespace, num_nodes=2), PodScript(lines=["a", "b"]), logs="all")
    assert outcome.succeeded
    for node in (0, 1):
        assert [line for line in out.splitlines() if line.startswith(f"[node-{node}] ")] == [f"[node-{node}] a", f"[node-{node}] b"]


def test_logs_survive_container_restarts_without_loss_or_repeats(kube_client, api_client, namespace):
    lines = [f"line {i}" for i in range(6)]
    script = PodScript(lines=lines, line_delay=0.8, crashes=2, crash_after=[2, 4], crash_backoff=1.0)
    outcome, out = launch(kube_client, inputs(namespace), script)
    assert outcome.succeeded
    body = [line for line in out.splitlines() if line.startswith("line ")]
    assert body == lines[:2] + lines[:4] + lines


@pytest.mark.trainer_versions
def test_failure_carries_reason_failed_pod_and_log_tail(kube_client, api_client, namespace):
    """A runtime whose pods are not restarted (restartPolicy Never, backoffLimit 0): the
    failed pod stays, with its exit code and log, when the Job fails."""
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, "trainingruntimes", runtime_with("no-retry", namespace, "Never", 0)
    )
    script = PodScript(lines=["loading shards", "RuntimeError: CUDA error: out of memory"], exit_code=137)
    with pytest.raises(JobFailedError) as info:
        launch(kube_client, inputs(namespace, runtime="no-retry", runtime_kind="TrainingRuntime"), script)
    message = str(info.value)
    assert "FailedJobs" in message and "jobset failed due to one or more job failures" in message
    assert "RuntimeError: CUDA error: out of memory" in message.split("Last 40 log lines", 1)[1]
    assert "exit 137" in message and "-node-0-0-" in message
    assert "kubectl get trainjob" in message


def test_deadline_exceeded_is_reported(kube_client, api_client, namespace):
    script = PodScript(lines=["step 1"], exit_delay=float("inf"))
    with pytest.raises(JobFailedError, match="DeadlineExceeded: TrainJob exceeded its active deadline"):
        launch(kube_client, inputs(namespace, active_deadline_seconds=3), script)


# ----------------------------------------------------------------------------- adopt / replace / conflicts


@pytest.mark.trainer_versions
def test_retry_adopts_the_running_job_without_a_duplicate(kube_client, api_client, namespace):
    inp = scripted(inputs(namespace), PodScript(lines=[f"line {i}" for i in range(20)], line_delay=0.1))
    backend = backend_for(kube_client, namespace)
    manifest = prepare(backend, inp).manifest
    first = backend.submit(manifest)  # the first try dies right after creating its job
    outcome, out = launch(kube_client, inp)  # the retry
    assert outcome.adopted and outcome.ref.uid == first.ref.uid and outcome.succeeded
    assert "adopted existing TrainJob" in out
    assert len(list_trainjobs(api_client, namespace)) == 1


@pytest.mark.trainer_versions
def test_retry_replaces_its_own_failed_job(kube_client, api_client, namespace):
    # The same inputs twice; the runtime (scripted by the test) fails the first time only.
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, "trainingruntimes", runtime_with("flaky", namespace, "Never", 0)
    )
    inp = inputs(namespace, runtime="flaky", runtime_kind="TrainingRuntime")
    set_runtime_script(api_client, namespace, "flaky", PodScript(lines=["boom"], exit_code=1))
    with pytest.raises(JobFailedError):
        launch(kube_client, inp)
    first_uid = list_trainjobs(api_client, namespace)[0]["metadata"]["uid"]
    set_runtime_script(api_client, namespace, "flaky", PodScript(lines=["fine"]))
    outcome, out = launch(kube_client, inp)
    assert outcome.replaced and outcome.succeeded and outcome.ref.uid != first_uid
    assert "replaced failed TrainJob" in out
    assert [j["metadata"]["uid"] for j in list_trainjobs(api_client, namespace)] == [outcome.ref.uid]


def test_a_job_of_another_task_is_not_adopted(kube_client, api_client, namespace):
    inp = inputs(namespace, name="shared-name")
    other = spec.render(inputs(namespace, task="someone-else", name="shared-name"))
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, other)
    with pytest.raises(OwnershipError, match="was not created by this task"):
        launch(kube_client, inp)
    assert len(list_trainjobs(api_client, namespace)) == 1


# ----------------------------------------------------------------------------- watch robustness


def test_launcher_survives_forced_disconnects(cluster, namespace):
    server = urlparse(cluster.server)
    proxy = TcpProxy(server.hostname, server.port)
    api = api_via(cluster.kubeconfig, proxy.port)
    lines = [f"line {i:02d}" for i in range(40)]
    cutter_stop = threading.Event()

    def cutter():
        while not cutter_stop.wait(1.0):
            proxy.sever()

    threading.Thread(target=cutter, daemon=True).start()
    try:
        outcome, out = launch(api, inputs(namespace), PodScript(lines=lines, line_delay=0.1))
    finally:
        cutter_stop.set()
        proxy.close()
    assert outcome.succeeded
    assert proxy.severed >= 3
    assert [line for line in out.splitlines() if line.startswith("line ")] == lines


# ----------------------------------------------------------------------------- cannot start, limits, cancel


def test_never_starting_job_is_reported_within_its_grace_and_deleted(kube_client, api_client, namespace):
    # No JobSet may be created in this namespace: the Trainer controller reports that on the TrainJob.
    client.CoreV1Api(api_client).create_namespaced_resource_quota(
        namespace, {"metadata": {"name": "no-jobsets"}, "spec": {"hard": {"count/jobsets.jobset.x-k8s.io": "0"}}}
    )
    started = time.monotonic()
    with pytest.raises(CannotStartError, match="TrainJobResourcesCreationFailed") as info:
        launch(kube_client, inputs(namespace), fatal_blocker_grace=3)
    assert time.monotonic() - started < 30
    assert "exceeded quota: no-jobsets" in str(info.value)
    wait_for(lambda: list_trainjobs(api_client, namespace) == [], what="TrainJob deleted")


def test_unschedulable_pods_are_reported_after_the_blocker_grace(kube_client, api_client, namespace):
    with pytest.raises(CannotStartError, match="Unschedulable") as info:
        launch(kube_client, inputs(namespace, node_selector={"kfp-trainer.test/nowhere": "true"}), blocker_grace=4)
    assert "node(s) didn't match" in str(info.value)
    wait_for(lambda: list_trainjobs(api_client, namespace) == [], what="TrainJob deleted")


def test_slow_scheduling_within_the_grace_still_succeeds(kube_client, api_client, namespace):
    label = f"kfp-trainer.test/{namespace}"
    backend = backend_for(kube_client, namespace, watch_timeout=1)
    inp = scripted(inputs(namespace, node_selector={label: "yes"}), PodScript(lines=["ok"]))
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=1.0, blocker_grace=60), out=io.StringIO())
    core = client.CoreV1Api(api_client)
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(outcome=launcher.run(prepare(launcher.backend, inp))), daemon=True)
    thread.start()
    try:
        # Once the launcher said the pod cannot be scheduled, a node gets the label.
        wait_for(lambda: "not starting yet: Unschedulable" in launcher.out.getvalue(), 30, what="unschedulable reported")  # type: ignore[attr-defined]
        core.patch_node("kwok-cpu-0", {"metadata": {"labels": {label: "yes"}}})
        thread.join(90)
    finally:
        core.patch_node("kwok-cpu-0", {"metadata": {"labels": {label: None}}})
    assert result["outcome"].succeeded
    assert relayed(launcher.out.getvalue()) == ["ok"]  # type: ignore[attr-defined]


def test_start_timeout_deletes_the_job(kube_client, api_client, namespace):
    with pytest.raises(TimeLimitError, match="did not start within start_timeout=3s"):
        launch(kube_client, inputs(namespace, node_selector={"kfp-trainer.test/nowhere": "true"}), start_timeout=3, blocker_grace=600)
    wait_for(lambda: list_trainjobs(api_client, namespace) == [], what="TrainJob deleted")


def test_run_timeout_deletes_the_job(kube_client, api_client, namespace):
    with pytest.raises(TimeLimitError, match="ran longer than run_timeout=3s"):
        launch(kube_client, inputs(namespace), PodScript(exit_delay=float("inf")), run_timeout=3)
    wait_for(lambda: list_trainjobs(api_client, namespace) == [], what="TrainJob deleted")


@pytest.mark.trainer_versions
def test_delete_after_success_removes_the_job_and_its_pods(kube_client, api_client, namespace):
    outcome, _ = launch(kube_client, inputs(namespace), delete_after_success=True)
    assert outcome.succeeded and get_trainjob(api_client, namespace, outcome.ref.name) is None
    wait_for(lambda: not client.CoreV1Api(api_client).list_namespaced_pod(namespace).items, what="pods deleted")


def test_sigterm_cancels_and_deletes_the_job(cluster, api_client, namespace):
    annotations = PodScript(lines=["training..."], exit_delay=float("inf")).annotations()
    run_id = f"cancel-{time.time_ns()}"
    args = ["--runtime", "torch-distributed", "--run-id", run_id, "--task-name", "train", "--namespace", namespace]
    args += ["--pod-annotations", json.dumps(annotations)]
    name = spec.render(
        TrainJobInputs(runtime="torch-distributed", run_id=run_id, task_name="train", namespace=namespace, pod_annotations=annotations)
    )["metadata"]["name"]
    proc = subprocess.Popen(
        [sys.executable, "-m", "kfp_trainer.cli", "launch", "--kubeconfig", cluster.kubeconfig, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    try:
        seen = []
        for line in proc.stdout:  # type: ignore[union-attr]
            seen.append(line)
            if "training..." in line:
                break
        proc.send_signal(signal.SIGTERM)
        rest, _ = proc.communicate(timeout=60)
    finally:
        if proc.poll() is None:
            proc.kill()
    output = "".join(seen) + rest
    assert proc.returncode == CancelledError.exit_code, output
    assert f"deleting TrainJob {namespace}/{name}" in output
    assert get_trainjob(api_client, namespace, name) is None
    # The JobSet, its Jobs and their pods are garbage-collected after it.
    batch = client.BatchV1Api(api_client)
    wait_for(lambda: not batch.list_namespaced_job(namespace).items, what="owned Jobs garbage-collected")
    wait_for(lambda: not client.CoreV1Api(api_client).list_namespaced_pod(namespace).items, what="pods garbage-collected")


def test_suspended_job_is_reported_and_waits(kube_client, api_client, namespace):
    backend = backend_for(kube_client, namespace)
    inp = scripted(inputs(namespace, suspend=True), PodScript(lines=["resumed"]))
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=1.0), out=io.StringIO())
    manifest = prepare(launcher.backend, inp).manifest
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(outcome=launcher.run(prepare(launcher.backend, inp))), daemon=True)
    thread.start()
    custom = client.CustomObjectsApi(api_client)
    wait_for(lambda: "suspended" in launcher.out.getvalue(), what="suspension reported")  # type: ignore[attr-defined]
    assert not client.CoreV1Api(api_client).list_namespaced_pod(namespace).items
    patch = copy.deepcopy({"spec": {"suspend": False}})
    custom.patch_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, manifest["metadata"]["name"], patch)
    thread.join(60)
    assert result["outcome"].succeeded
    assert JobRef(namespace, manifest["metadata"]["name"]).name == result["outcome"].ref.name
    assert relayed(launcher.out.getvalue())[-1:] == ["resumed"]  # type: ignore[attr-defined]
