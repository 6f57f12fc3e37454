"""Faults on the real node while a real trainer runs: the kubelet or containerd restarted, the step's pod lost, the step cut off,
a trainer pod evicted halfway, the node not ready while the job starts.

The trainer is the probe test image (hack/k8s/testimage) printing ``line 1`` ... ``line N`` a
tenth of a second apart in a real container on the real node; the step is ``kfp-trainer launch``
as a process, as KFP runs it in a pod. The daemons are restarted as a service manager restarts
them (SIGTERM, then the same command line: ``RealNode.restart``); the step is cut off from the
API server by a proxy between them that drops its connections and holds new ones unanswered. Each test ends as the fault
tests do: the step's outcome, every trainer line relayed once and in order, one TrainJob for the
task, and nothing left in the namespace once the step deleted its job.
"""

from __future__ import annotations

import io
import json
import signal
import sys
import threading
import time
from pathlib import Path
from urllib.parse import urlparse

import pytest
from faults import Output, kubeconfig_via, list_kind, record, relayed, start_launch, trainjob_name, wait_nothing_left
from helpers import wait_for
from kubernetes import client
from realpods import claim_folder, prepare_claim
from testcluster import realnode

from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs
from tests.tcp_proxy import TcpProxy

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack" / "k8s"))

import images  # noqa: E402  (hack/k8s/images.py)

pytestmark = pytest.mark.timeout(420)
LINES, DELAY = 250, 0.1  # 25 s of training


def launch_probe(cluster, namespace: str, real_node, run_id: str, kubeconfig: str = "") -> Output:
    """``kfp-trainer launch`` of the probe trainer on the real node, the job deleted after success."""
    extra = realnode.pod_spec_for_real_node()
    return Output(start_launch(
        kubeconfig or cluster.kubeconfig, namespace, run_id, "--image", real_node.image("probe"), "--command", json.dumps(["/probe"]),
        "--args", json.dumps(["lines", str(LINES), str(DELAY)]), "--node-selector", json.dumps(extra["nodeSelector"]),
        "--tolerations", json.dumps(extra["tolerations"]), "--num-nodes", "1", "--start-timeout", "180", "--run-timeout", "300",
        "--delete-after-success",
    ))  # fmt: skip


def trainer_lines(text: str) -> list[str]:
    return [line for line in relayed(text) if line.startswith("line ")]


EVERY_LINE = [f"line {i}" for i in range(1, LINES + 1)]


@pytest.mark.parametrize("daemon", ["kubelet", "containerd"])
def test_a_node_daemon_restarted_mid_training_loses_no_line_and_the_step_succeeds(cluster, kube_client, namespace, real_node, daemon):
    out = launch_probe(cluster, namespace, real_node, f"run-{time.time_ns()}")
    out.wait_for("line 40", timeout=240)
    back = real_node.restart(daemon)
    print(f"{daemon} back after {back:.1f} s")
    rc = out.finish(timeout=300)
    assert rc == 0, out.text
    assert trainer_lines(out.text) == EVERY_LINE, out.text  # none lost, none twice, in order: the relay reconnected
    assert "completed" in out.text, out.text
    assert len(list_kind(kube_client, namespace, "TrainJob")) <= 1  # never a second job for the task
    left = wait_nothing_left(kube_client, namespace, within=60)
    record({"fault": f"{daemon} restarted on the real node mid-training", "daemon_back_s": round(back, 1), "cleanup_s": round(left, 1)})


def test_the_steps_pod_lost_mid_training_and_kfps_retry_adopts_the_running_job_and_relays_its_whole_log(
    cluster, kube_client, namespace, real_node
):
    run_id = f"run-{time.time_ns()}"
    first = launch_probe(cluster, namespace, real_node, run_id)
    first.wait_for("line 60", timeout=240)
    name = trainjob_name(first.text)
    first.proc.send_signal(signal.SIGKILL)  # the step's pod is gone: no handler runs, the job runs on
    first.finish(timeout=30)
    [job] = list_kind(kube_client, namespace, "TrainJob")
    assert job["metadata"]["name"] == name
    retry = launch_probe(cluster, namespace, real_node, run_id)  # KFP's retry: the same run and task, a new pod
    rc = retry.finish(timeout=300)
    assert rc == 0, retry.text
    assert f"adopted existing TrainJob {namespace}/{name}" in retry.text, retry.text
    assert trainer_lines(retry.text) == EVERY_LINE, retry.text  # the retry's log has the trainer's whole log, once
    assert "created TrainJob" not in retry.text
    left = wait_nothing_left(kube_client, namespace, within=60)
    record({"fault": "the step's pod lost mid-training, KFP's retry adopts", "cleanup_s": round(left, 1)})


def test_a_step_cut_off_from_the_api_server_for_60_s_follows_on_and_ends_with_the_jobs_real_outcome(
    cluster, kube_client, namespace, real_node, tmp_path
):
    """The trainer ends while the step cannot reach the API server; once it can, the step relays the rest and succeeds."""
    server = urlparse(cluster.server)
    with TcpProxy(server.hostname, server.port) as proxy:
        out = launch_probe(cluster, namespace, real_node, f"run-{time.time_ns()}", kubeconfig_via(cluster.kubeconfig, proxy.port,
                           tmp_path / "kubeconfig"))  # fmt: skip
        out.wait_for("line 20", timeout=240)
        cut = time.monotonic()
        proxy.hang()
        proxy.sever()  # its open watches and log stream drop; new connections get no answer
        trainer_done = wait_trainjob_finished(kube_client, namespace, timeout=120)
        time.sleep(max(0.0, 60 - (time.monotonic() - cut)))
        proxy.answer()
        rc = out.finish(timeout=240)
    assert trainer_done - cut < 60, "the trainer was to end while the step was cut off"
    assert rc == 0, out.text
    assert trainer_lines(out.text) == EVERY_LINE, out.text  # what it missed while cut off, relayed once it could
    left = wait_nothing_left(kube_client, namespace, within=60)
    record({"fault": "the step cut off from the API server for 60 s", "cleanup_s": round(left, 1)})


def wait_trainjob_finished(api, namespace: str, timeout: float) -> float:
    """When the namespace's TrainJob reads Complete (seen through the test's own connection)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job in list_kind(api, namespace, "TrainJob"):
            if any(c.get("type") == "Complete" and c.get("status") == "True" for c in (job.get("status") or {}).get("conditions") or []):
                return time.monotonic()
        time.sleep(0.5)
    raise AssertionError(f"the TrainJob did not complete within {timeout} s")


def test_a_trainer_pod_evicted_halfway_is_replaced_the_step_says_so_and_the_trainer_resumes_from_its_checkpoint(
    api_client, kube_client, namespace, real_node
):
    """``kubectl drain``'s way: the Eviction API on the running trainer pod, once it saved a checkpoint."""
    core = client.CoreV1Api(api_client)
    image = images.import_into("trainer", str(real_node.containerd.socket))[0].ref
    prepare_claim(core, namespace, image, "builtin://datasets/addition", "builtin://models/tiny-char-lm")
    placement = realnode.pod_spec_for_real_node()
    args = ["--model-dir", "/workspace/model", "--dataset-dir", "/workspace/dataset", "--output-dir", "/workspace/output",
            "--max-steps", "400", "--checkpoint-steps", "5", "--logging-steps", "5", "--batch-size", "8",
            "--time-budget-seconds", "40"]  # fmt: skip
    inp = TrainJobInputs(
        run_id=f"run-{time.time_ns()}", task_name="sft", namespace=namespace, runtime="torch-distributed", image=image,
        command=["torchrun", "-m", "kfp_trainer.trainers.sft"], args=args, num_nodes=1, num_proc_per_node=1,
        volumes=[{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}],
        volume_mounts=[{"name": "workspace", "mountPath": "/workspace"}],
        node_selector=placement["nodeSelector"], tolerations=placement["tolerations"],
    )  # fmt: skip
    backend = KubernetesBackend(kube_client, namespace=namespace)
    out, result = io.StringIO(), {}
    launcher = Launcher(backend, LaunchOptions(start_timeout=180, run_timeout=300), out=out)
    prepared = prepare(backend, inp)
    thread = threading.Thread(target=lambda: result.update(outcome=launcher.run(prepared)), daemon=True)
    thread.start()
    checkpoints = claim_folder(core, namespace) / ".checkpoints"
    wait_for(lambda: any(checkpoints.glob("step-*")), 240, what=f"a checkpoint in {checkpoints}:\n{out.getvalue()[-2000:]}", interval=0.5)
    [victim] = core.list_namespaced_pod(namespace, label_selector="jobset.sigs.k8s.io/replicatedjob-name=node").items
    evicted = time.monotonic()
    name = victim.metadata.name
    core.create_namespaced_pod_eviction(name, namespace, {"metadata": {"name": name, "namespace": namespace}})
    said = wait_for(lambda: next((line for line in out.getvalue().splitlines() if "ended before its job" in line), None), 60,
                    what=f"the step saying the pod was replaced:\n{out.getvalue()[-2000:]}")  # fmt: skip
    told = time.monotonic() - evicted
    thread.join(300)
    log = out.getvalue()
    assert not thread.is_alive() and result.get("outcome") is not None and result["outcome"].succeeded, log[-3000:]
    assert f"pod {victim.metadata.name} ended before its job (EvictionByEvictionAPI" in said, said
    assert "takes its place, the 2nd pod of node-0" in said, said
    resumed = [line for line in log.splitlines() if "resuming from the checkpoint at step" in line]
    assert resumed and "/workspace/output/.checkpoints/step-" in resumed[0], log[-3000:]
    assert log.count("ended before its job") == 1, log[-3000:]
    assert len(list_kind(kube_client, namespace, "TrainJob")) == 1
    assert (claim_folder(core, namespace) / "model.safetensors").stat().st_size > 0
    print(f"{said.strip()} ({told:.1f} s after the eviction); {resumed[0].strip()}")
    record({"fault": "a trainer pod evicted halfway", "said_after_s": round(told, 1)})


def test_the_node_not_ready_while_the_job_starts_is_named_within_seconds_and_the_job_runs_once_it_is_back(
    cluster, kube_client, api_client, namespace, real_node
):
    """containerd stopped: the kubelet reports the node not ready; the job's pod, bound to it, cannot start until it is back."""
    core = client.CoreV1Api(api_client)
    down = 45.0
    restarted: dict[str, float] = {}
    restarter = threading.Thread(target=lambda: restarted.update(back=real_node.restart("containerd", down=down)), daemon=True)
    restarter.start()
    out = launch_probe(cluster, namespace, real_node, f"run-{time.time_ns()}")
    not_ready = wait_for(lambda: _ready(core) is False or None, down, what="the node not ready while containerd is down", interval=0.2)
    seen_not_ready = time.monotonic()
    line = out.wait_for("not starting yet", timeout=30)
    named = time.monotonic() - seen_not_ready
    restarter.join(120)
    rc = out.finish(timeout=300)
    assert not_ready is True
    assert rc == 0, out.text
    blocker = next(x for x in out.text.splitlines() if "not starting yet" in x)
    assert "NodeNotReady" in blocker and f"node {realnode.NODE_NAME}, which is not ready" in blocker, out.text
    assert named < 10, f"named {named:.1f} s after the node turned not ready: {line}"
    assert trainer_lines(out.text) == EVERY_LINE, out.text
    left = wait_nothing_left(kube_client, namespace, within=60)
    print(f"{blocker.strip()} ({named:.1f} s after the node turned not ready; containerd back after {restarted.get('back', 0):.1f} s)")
    record({"fault": "the node not ready while the job starts", "named_after_s": round(named, 1), "cleanup_s": round(left, 1)})


def _ready(core: client.CoreV1Api) -> bool | None:
    """The real node's Ready condition: True, False, or None (Unknown)."""
    for condition in core.read_node(realnode.NODE_NAME).status.conditions or []:
        if condition.type == "Ready":
            return {"True": True, "False": False}.get(condition.status)
    return None
