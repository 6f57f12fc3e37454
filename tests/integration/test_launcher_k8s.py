"""The launcher and the Kubernetes backend against a real API server with the Trainer CRDs.

The trainer simulator (tests/integration/simulator.py) plays the Trainer + JobSet
controllers; everything the launcher does goes through the real kube-apiserver.
"""

from __future__ import annotations

import copy
import io
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from kubernetes import client, config
from simulator import Script
from tcp_proxy import TcpProxy

from kfp_trainer import spec
from kfp_trainer.backends.base import JobRef, Phase
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
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.spec import TrainJobInputs

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


def launch(api, inp: TrainJobInputs, sim=None, script: Script | None = None, *, backend=None, **options):
    backend = backend or backend_for(api, inp.namespace)
    out = io.StringIO()
    launcher = Launcher(backend, LaunchOptions(**{"blocker_check_interval": 1.0, **options}), out=out)
    if sim is not None and script is not None:
        manifest, _, _ = launcher.prepare(inp)
        sim.script(manifest["metadata"]["name"], script)
    try:
        return launcher.run(inp), out.getvalue()
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


def wait_for(predicate, timeout: float = 30, what: str = "condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# ----------------------------------------------------------------------------- rendering vs storage


def test_stored_trainjob_equals_the_rendered_manifest(api_client, namespace, trainer_sim):
    backend = backend_for(api_client, namespace)
    launcher = Launcher(backend, out=io.StringIO())
    manifest, api_version, _ = launcher.prepare(inputs(namespace, **FULL))
    assert api_version == "v2.2"
    trainer_sim.script(manifest["metadata"]["name"], Script(outcome="run_forever"))
    submission = backend.submit(manifest)
    try:
        stored = get_trainjob(api_client, namespace, submission.ref.name)
        assert stored["metadata"]["labels"] == manifest["metadata"]["labels"]
        assert stored["metadata"]["annotations"] == manifest["metadata"]["annotations"]
        # The only differences: the CRD's defaults.
        assert stored["spec"] == {**manifest["spec"], "suspend": False, "managedBy": "trainer.kubeflow.org/trainjob-controller"}
    finally:
        backend.delete(submission.ref)


@pytest.mark.parametrize("api_version", ["v2.2", "v2.1"])
def test_strict_field_validation_accepts_every_rendered_manifest(cluster, api_client, namespace, api_version):
    variants = [
        {},
        FULL,
        {**FULL, "active_deadline_seconds": 600, "suspend": True},
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
    custom = client.CustomObjectsApi(api_client)

    def check(crd_version: str) -> None:
        backend = backend_for(api_client, namespace)
        assert backend.detect_api_version() == crd_version
        for i, variant in enumerate(variants):
            variant = dict(variant)
            if crd_version == "v2.1":
                variant.pop("active_deadline_seconds", None)
            m = spec.render(
                inputs(namespace, task=f"v{i}", **variant),
                api_version=crd_version,
                runtime_jobs=["dataset-initializer", "model-initializer", "node", "launcher"],
            )
            custom.create_namespaced_custom_object(
                spec.GROUP, spec.VERSION, namespace, spec.PLURAL, m, field_validation="Strict", dry_run="All"
            )

    if api_version == "v2.2":
        check("v2.2")
    else:
        with cluster.use_trainjob_crd(OLDER / "trainjobs-v2.1.0.yaml"):
            check("v2.1")


def test_strict_validation_rejects_unknown_fields_with_a_clear_error(api_client, namespace):
    backend = backend_for(api_client, namespace)
    m = spec.render(inputs(namespace, patch={"spec": {"trainer": {"numNode": 2}}}))
    with pytest.raises(RejectedError, match="numNode"):
        backend.submit(m)
    assert list_trainjobs(api_client, namespace) == []


def test_forced_v21_manifest_is_rejected_by_a_v23_server(api_client, namespace):
    backend = backend_for(api_client, namespace, api_version="v2.1")
    launcher = Launcher(backend, out=io.StringIO())
    with pytest.raises(RejectedError, match="podTemplateOverrides"):
        launcher.run(inputs(namespace, node_selector={"a": "b"}))
    assert list_trainjobs(api_client, namespace) == []


# ----------------------------------------------------------------------------- runtime check


def test_missing_runtime_lists_the_available_ones_and_creates_nothing(api_client, namespace):
    with pytest.raises(RuntimeNotFoundError) as info:
        launch(api_client, inputs(namespace, runtime="torch-distributd"))
    assert "ClusterTrainingRuntime/torch-distributed" in str(info.value)
    assert "ClusterTrainingRuntime/torchtune-llama3.2-1b" in str(info.value)
    assert list_trainjobs(api_client, namespace) == []


def test_namespaced_runtime_is_found_in_the_job_namespace(api_client, namespace, trainer_sim):
    runtime = {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": "team-torch", "namespace": namespace, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        {
                            "name": "node",
                            "template": {"spec": {"template": {"spec": {"containers": [{"name": "node", "image": "busybox"}]}}}},
                        }
                    ]
                }
            },
        },
    }
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, "trainingruntimes", runtime)
    outcome, _ = launch(api_client, inputs(namespace, runtime="team-torch", runtime_kind="TrainingRuntime"), trainer_sim, Script())
    assert outcome.succeeded and outcome.runtime == "TrainingRuntime/team-torch"


def test_bad_input_fails_before_any_api_call(namespace):
    dead = client.ApiClient(client.Configuration(host="https://127.0.0.1:9"))  # nothing listens there
    with pytest.raises(InvalidSpecErrors, match="num_nodes"):
        launch(dead, inputs(namespace, num_nodes=0))


# ----------------------------------------------------------------------------- outcomes


def test_success_streams_logs_and_parses_metrics(api_client, namespace, trainer_sim):
    lines = [f'{{"step": {i}, "loss": {1.0 / i:.3f}}}' for i in range(1, 9)] + ["done"]
    outcome, out = launch(api_client, inputs(namespace), trainer_sim, Script.success(lines, line_delay=0.05))
    assert outcome.succeeded and outcome.reason == "AllJobsCompleted"
    body = [line for line in out.splitlines() if not line.startswith("[kfp-trainer]") and not line.startswith("  ")]
    assert body == lines
    assert outcome.metrics.final() == {"loss": 0.125} and outcome.metrics.best() == {"loss": 0.125}
    assert len(outcome.metrics.series("loss")) == 8
    assert get_trainjob(api_client, namespace, outcome.ref.name) is not None  # kept by default


def test_all_nodes_logs_are_prefixed(api_client, namespace, trainer_sim):
    outcome, out = launch(api_client, inputs(namespace, num_nodes=2), trainer_sim, Script.success(["a", "b"]), logs="all")
    assert outcome.succeeded
    for node in (0, 1):
        assert [line for line in out.splitlines() if line.startswith(f"[node-{node}] ")] == [f"[node-{node}] a", f"[node-{node}] b"]


def test_logs_survive_container_restarts_without_loss_or_repeats(api_client, namespace, trainer_sim):
    lines = [f"line {i}" for i in range(6)]
    outcome, out = launch(
        api_client, inputs(namespace), trainer_sim, Script.restarting(lines, restarts=[2, 4], line_delay=0.8, restart_delay=1.0)
    )
    assert outcome.succeeded
    body = [line for line in out.splitlines() if line.startswith("line ")]
    assert body == lines[:2] + lines[:4] + lines


def test_failure_carries_reason_failed_pod_and_log_tail(api_client, namespace, trainer_sim):
    script = Script.failure(
        ["loading shards", "RuntimeError: CUDA error: out of memory"],
        reason="FailedJobs",
        message="jobset failed due to failed job node",
        exit_code=137,
    )
    with pytest.raises(JobFailedError) as info:
        launch(api_client, inputs(namespace), trainer_sim, script)
    message = str(info.value)
    assert "FailedJobs" in message and "jobset failed due to failed job node" in message
    assert "RuntimeError: CUDA error: out of memory" in message.split("Last 40 log lines", 1)[1]
    assert "exit 137" in message and "-node-0-0-" in message
    assert "kubectl get trainjob" in message


def test_deadline_exceeded_is_reported(api_client, namespace, trainer_sim):
    script = Script.failure(["step 1"], reason="DeadlineExceeded", message="TrainJob exceeded its activeDeadlineSeconds")
    with pytest.raises(JobFailedError, match="DeadlineExceeded: TrainJob exceeded its activeDeadlineSeconds"):
        launch(api_client, inputs(namespace, active_deadline_seconds=5), trainer_sim, script)


# ----------------------------------------------------------------------------- adopt / replace / conflicts


def test_retry_adopts_the_running_job_without_a_duplicate(api_client, namespace, trainer_sim):
    inp = inputs(namespace)
    backend = backend_for(api_client, namespace)
    launcher = Launcher(backend, out=io.StringIO())
    manifest, _, _ = launcher.prepare(inp)
    trainer_sim.script(manifest["metadata"]["name"], Script.success([f"line {i}" for i in range(20)], line_delay=0.1))
    first = backend.submit(manifest)  # the first try dies right after creating its job
    outcome, out = launch(api_client, inp)  # the retry
    assert outcome.adopted and outcome.ref.uid == first.ref.uid and outcome.succeeded
    assert "adopted existing TrainJob" in out
    assert len(list_trainjobs(api_client, namespace)) == 1


def test_retry_replaces_its_own_failed_job(api_client, namespace, trainer_sim):
    inp = inputs(namespace)
    with pytest.raises(JobFailedError):
        launch(api_client, inp, trainer_sim, Script.failure(["boom"]))
    first_uid = list_trainjobs(api_client, namespace)[0]["metadata"]["uid"]
    outcome, out = launch(api_client, inp, trainer_sim, Script())
    assert outcome.replaced and outcome.succeeded and outcome.ref.uid != first_uid
    assert "replaced failed TrainJob" in out
    assert [j["metadata"]["uid"] for j in list_trainjobs(api_client, namespace)] == [outcome.ref.uid]


def test_a_job_of_another_task_is_not_adopted(api_client, namespace):
    inp = inputs(namespace, name="shared-name")
    other = spec.render(inputs(namespace, task="someone-else", name="shared-name"))
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, other)
    with pytest.raises(OwnershipError, match="was not created by this task"):
        launch(api_client, inp)
    assert len(list_trainjobs(api_client, namespace)) == 1


# ----------------------------------------------------------------------------- watch robustness


def test_watch_relists_on_410_gone(api_client, namespace, trainer_sim):
    backend = backend_for(api_client, namespace)
    manifest = spec.render(inputs(namespace))
    trainer_sim.script(manifest["metadata"]["name"], Script.success(["x"], start_delay=1.0))
    ref = backend.submit(manifest).ref
    # resourceVersion "1" is older than anything the watch cache holds: the server answers 410.
    seen = []
    for status in backend.watch(ref, resource_version="1"):
        if status is not None:
            seen.append(status.phase)
            if status.phase.finished:
                break
    assert seen[-1] is Phase.SUCCEEDED


def test_launcher_survives_forced_disconnects(cluster, namespace, trainer_sim):
    server = urlparse(cluster.server)
    proxy = TcpProxy(server.hostname, server.port)
    configuration = client.Configuration()
    config.load_kube_config(config_file=cluster.kubeconfig, client_configuration=configuration)
    configuration.host = f"https://127.0.0.1:{proxy.port}"
    api = client.ApiClient(configuration)
    lines = [f"line {i:02d}" for i in range(40)]
    inp = inputs(namespace)
    cutter_stop = threading.Event()

    def cutter():
        while not cutter_stop.wait(1.0):
            proxy.sever()

    threading.Thread(target=cutter, daemon=True).start()
    try:
        outcome, out = launch(api, inp, trainer_sim, Script.success(lines, line_delay=0.1))
    finally:
        cutter_stop.set()
        proxy.close()
    assert outcome.succeeded
    assert proxy.severed >= 3
    assert [line for line in out.splitlines() if line.startswith("line ")] == lines


# ----------------------------------------------------------------------------- cannot start, limits, cancel


def test_never_starting_job_is_reported_within_its_grace_and_deleted(api_client, namespace, trainer_sim):
    started = time.monotonic()
    with pytest.raises(CannotStartError, match="TrainJobResourcesCreationFailed") as info:
        launch(
            api_client,
            inputs(namespace),
            trainer_sim,
            Script.never_starting("failed to build JobSet: quota exceeded"),
            fatal_blocker_grace=3,
        )
    assert time.monotonic() - started < 30
    assert "quota exceeded" in str(info.value)
    wait_for(lambda: list_trainjobs(api_client, namespace) == [], what="TrainJob deleted")


def test_unschedulable_pods_are_reported_after_the_blocker_grace(api_client, namespace, trainer_sim):
    with pytest.raises(CannotStartError, match="Unschedulable") as info:
        launch(api_client, inputs(namespace), trainer_sim, Script.unschedulable_forever(), blocker_grace=4)
    assert "node(s) didn't match" in str(info.value) or "nodes are available" in str(info.value)
    wait_for(lambda: list_trainjobs(api_client, namespace) == [], what="TrainJob deleted")


def test_slow_scheduling_within_the_grace_still_succeeds(api_client, namespace, trainer_sim):
    backend = backend_for(api_client, namespace, watch_timeout=1)
    script = Script.slow_scheduling(5, lines=["ok"])
    outcome, out = launch(api_client, inputs(namespace), trainer_sim, script, backend=backend, blocker_grace=60)
    assert outcome.succeeded and "not starting yet: Unschedulable" in out


def test_start_timeout_deletes_the_job(api_client, namespace, trainer_sim):
    with pytest.raises(TimeLimitError, match="did not start within start_timeout=3s"):
        launch(api_client, inputs(namespace), trainer_sim, Script.unschedulable_forever(), start_timeout=3, blocker_grace=600)
    wait_for(lambda: list_trainjobs(api_client, namespace) == [], what="TrainJob deleted")


def test_run_timeout_deletes_the_job(api_client, namespace, trainer_sim):
    with pytest.raises(TimeLimitError, match="ran longer than run_timeout=3s"):
        launch(api_client, inputs(namespace), trainer_sim, Script(outcome="run_forever"), run_timeout=3)
    wait_for(lambda: list_trainjobs(api_client, namespace) == [], what="TrainJob deleted")


def test_delete_after_success_removes_the_job_and_its_pods(api_client, namespace, trainer_sim):
    outcome, _ = launch(api_client, inputs(namespace), trainer_sim, Script(), delete_after_success=True)
    assert outcome.succeeded and get_trainjob(api_client, namespace, outcome.ref.name) is None


def test_sigterm_cancels_and_deletes_the_job(cluster, api_client, namespace, trainer_sim):
    args = ["--runtime", "torch-distributed", "--run-id", f"cancel-{time.time_ns()}", "--task-name", "train", "--namespace", namespace]
    name = spec.render(TrainJobInputs(runtime="torch-distributed", run_id=args[3], task_name="train", namespace=namespace))["metadata"][
        "name"
    ]
    trainer_sim.script(name, Script(lines=["training..."], outcome="run_forever"))
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
    # The Jobs the TrainJob owned are garbage-collected after it.
    batch = client.BatchV1Api(api_client)
    wait_for(lambda: not batch.list_namespaced_job(namespace).items, what="owned Jobs garbage-collected")


def test_suspended_job_is_reported_and_waits(api_client, namespace, trainer_sim):
    backend = backend_for(api_client, namespace)
    inp = inputs(namespace, suspend=True)
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=1.0), out=io.StringIO())
    manifest, _, _ = launcher.prepare(inp)
    trainer_sim.script(manifest["metadata"]["name"], Script.success(["resumed"]))
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(outcome=launcher.run(inp)), daemon=True)
    thread.start()
    custom = client.CustomObjectsApi(api_client)
    wait_for(lambda: "suspended" in launcher.out.getvalue(), what="suspension reported")  # type: ignore[attr-defined]
    patch = copy.deepcopy({"spec": {"suspend": False}})
    custom.patch_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, manifest["metadata"]["name"], patch)
    thread.join(60)
    assert result["outcome"].succeeded
    assert JobRef(namespace, manifest["metadata"]["name"]).name == result["outcome"].ref.name
