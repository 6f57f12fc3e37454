"""The SFT trainer for real on the real node: a TrainJob of 2 nodes x 1 process on the
``torch-distributed`` runtime runs ``torchrun -m kfp_trainer.trainers.sft`` in the trainer image
(built here from deploy/Dockerfile.trainer), the ranks meet through the JobSet's headless
Service (``<job>-node-0-0.<job>``, resolved by the node's CoreDNS), train the tiny builtin model
on the builtin dataset prepared into a ReadWriteMany workspace claim, and rank 0 writes the
model there. Launched by the project's launcher, which relays rank 0's log."""

from __future__ import annotations

import io
import json
import sys
import time
from pathlib import Path

import pytest
from kubernetes import client
from realpods import claim_folder, on_real_node, prepare_claim, wait_phase
from testcluster import realnode

from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

import images  # noqa: E402  (hack/k8s/images.py)

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def trainer_image(real_node):
    """The trainer image in the real node's containerd (imported unless that digest is there)."""
    return images.import_into("trainer", str(real_node.containerd.socket))[0].ref


def test_sft_trains_on_two_real_nodes_with_torchrun_and_writes_the_model_to_the_workspace(
    kube_client, api_client, namespace, real_node, trainer_image
):
    core = client.CoreV1Api(api_client)
    t0 = time.monotonic()
    prepare_claim(core, namespace, trainer_image, "builtin://datasets/addition", "builtin://models/tiny-char-lm")
    prepared = time.monotonic() - t0
    placement = realnode.pod_spec_for_real_node()
    args = ["--model-dir", "/workspace/model", "--dataset-dir", "/workspace/dataset", "--output-dir", "/workspace/output"]
    args += ["--max-steps", "12", "--logging-steps", "3", "--batch-size", "8", "--time-budget-seconds", "120"]
    inp = TrainJobInputs(
        run_id=f"run-{time.time_ns()}",
        task_name="sft",
        namespace=namespace,
        runtime="torch-distributed",
        image=trainer_image,
        command=["torchrun", "-m", "kfp_trainer.trainers.sft"],
        args=args,
        num_nodes=2,
        num_proc_per_node=1,
        volumes=[{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}],
        volume_mounts=[{"name": "workspace", "mountPath": "/workspace"}],
        node_selector=placement["nodeSelector"],
        tolerations=placement["tolerations"],
    )
    out = io.StringIO()
    t1 = time.monotonic()
    backend = KubernetesBackend(kube_client, namespace=namespace)
    outcome = Launcher(backend, LaunchOptions(start_timeout=180, run_timeout=240), out=out).run(prepare(backend, inp))
    trained = time.monotonic() - t1
    log = out.getvalue()
    print(f"workspace prepared in {prepared:.1f} s, TrainJob launched to Succeeded in {trained:.1f} s")
    assert outcome.succeeded, log[-3000:]
    summary = [json.loads(line[line.index("{") :]) for line in log.splitlines() if '"train_steps"' in line]
    assert summary and summary[-1]["world_size"] == 2 and summary[-1]["train_steps"] == 12, log[-3000:]
    # Rank 0 saved the model into the claim (a host directory of the cluster).
    output = claim_folder(core, namespace)
    assert (output / "model.safetensors").stat().st_size > 0
    info = json.loads((output / "training_info.json").read_text())
    assert info["world_size"] == 2, info
    # The evaluation (what evaluate_model runs) reads that model from the claim in a pod of its own, as UID 1000.
    metrics = evaluate_in_pod(core, namespace, trainer_image)
    assert metrics["examples"] == 40 and 0.0 <= metrics["exact_match"] <= 1.0 and metrics["loss"] > 0, metrics


def evaluate_in_pod(core, ns: str, image: str) -> dict:
    """``python -m kfp_trainer.trainers.evaluate`` on the trained model and the dataset's test split, in the trainer image."""
    command = ["python", "-m", "kfp_trainer.trainers.evaluate", "--model-dir", "/workspace/output", "--dataset-dir",
               "/workspace/dataset", "--max-examples", "40"]  # fmt: skip
    spec = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "securityContext": {"runAsUser": 1000, "runAsNonRoot": True},
        "containers": [{"name": "evaluate", "image": image, "imagePullPolicy": "Never", "command": command,
                        "volumeMounts": [{"name": "workspace", "mountPath": "/workspace", "readOnly": True}]}],
        "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}],
    }  # fmt: skip
    core.create_namespaced_pod(ns, {"metadata": {"name": "evaluate"}, "spec": on_real_node(spec)})
    wait_phase(core, ns, "evaluate", timeout=180)
    last = core.read_namespaced_pod_log("evaluate", ns).strip().splitlines()[-1]
    return json.loads(last)


def test_a_cancel_sends_sigterm_to_torchrun_and_the_pods_are_gone_within_the_grace_period(
    cluster, api_client, namespace, real_node, trainer_image
):
    """SIGTERM to the launcher (a KFP cancel): the TrainJob is deleted, the kubelet sends SIGTERM
    to torchrun (PID 1 of each trainer container), which stops its workers and exits; every pod
    is gone within 10 s of the grace period's end."""
    from faults import Output, start_launch

    core = client.CoreV1Api(api_client)
    prepare_claim(core, namespace, trainer_image, "builtin://datasets/addition", "builtin://models/tiny-char-lm")
    placement = realnode.pod_spec_for_real_node()
    grace = 20
    args = ["--model-dir", "/workspace/model", "--dataset-dir", "/workspace/dataset", "--output-dir", "/workspace/output"]
    args += ["--max-steps", "100000", "--logging-steps", "2", "--batch-size", "8", "--time-budget-seconds", "600"]
    argv = [
        "--image", trainer_image, "--command", json.dumps(["torchrun", "-m", "kfp_trainer.trainers.sft"]), "--args", json.dumps(args),
        "--num-nodes", "2", "--num-proc-per-node", "1", "--termination-grace-period-seconds", str(grace),
        "--volumes", json.dumps([{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}]),
        "--volume-mounts", json.dumps([{"name": "workspace", "mountPath": "/workspace"}]),
        "--node-selector", json.dumps(placement["nodeSelector"]), "--tolerations", json.dumps(placement["tolerations"]),
    ]  # fmt: skip
    out = Output(start_launch(cluster.kubeconfig, namespace, f"run-{time.time_ns()}", *argv))
    out.wait_for('"step": 4', timeout=180)  # rank 0 trains (the launcher relays its log)
    pods = core.list_namespaced_pod(namespace, label_selector="jobset.sigs.k8s.io/jobset-name").items
    assert len(pods) == 2
    logs = {p.metadata.name: [] for p in pods}

    def follow(name: str) -> None:
        stream = core.read_namespaced_pod_log(name, namespace, follow=True, _preload_content=False)
        for line in stream.stream():
            logs[name].append(line.decode(errors="replace"))

    import threading

    followers = [threading.Thread(target=follow, args=(n,), daemon=True) for n in logs]
    for t in followers:
        t.start()
    time.sleep(1)
    cancelled = time.monotonic()
    out.proc.send_signal(15)
    rc = out.finish(timeout=grace + 30)
    gone = None
    while time.monotonic() - cancelled < grace + 10:
        if not core.list_namespaced_pod(namespace, label_selector="jobset.sigs.k8s.io/jobset-name").items:
            gone = time.monotonic() - cancelled
            break
        time.sleep(0.2)
    for t in followers:
        t.join(5)
    print(f"cancelled: launcher exited {rc}, trainer pods gone {gone} s after SIGTERM")
    assert rc == 130, out.text[-3000:]
    assert gone is not None, "trainer pods still there 10 s after the grace period"
    for name, lines in logs.items():
        text = "".join(lines)
        assert "SignalException: Process 1 got signal: 15" in text, (name, text[-2000:])  # torchrun is PID 1
