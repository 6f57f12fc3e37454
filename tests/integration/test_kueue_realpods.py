"""Preemption by the real Kueue of a real training process: the SFT trainer runs in the trainer
image on the real node (a Kueue ResourceFlavor of that node, 1 CPU of quota), saves a
checkpoint in the workspace claim, is preempted by a higher-priority job (its pod stopped and
deleted), and when Kueue re-admits the same TrainJob its new pod finds the checkpoint at the
same path and resumes from it."""

from __future__ import annotations

import io
import sys
import threading
import uuid
from pathlib import Path

import pytest
from helpers import get_trainjob, list_trainjobs, wait_for
from kubernetes import client
from realpods import claim_folder, prepare_claim, real_node_queue
from testcluster.kueue import PRIORITY_LABEL

from kfp_trainer import spec
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

import images  # noqa: E402  (hack/k8s/images.py)

pytestmark = pytest.mark.timeout(600)


def test_a_preempted_sft_trainer_resumes_from_its_checkpoint_when_kueue_readmits_it(kueue, api_client, kube_client, namespace, real_node):
    core = client.CoreV1Api(api_client)
    image = images.import_into("trainer", str(real_node.containerd.socket))[0].ref
    with real_node_queue(api_client, namespace, cpu=1) as (placement, high):
        prepare_claim(core, namespace, image, "builtin://datasets/addition", "builtin://models/tiny-char-lm")
        run(api_client, kube_client, core, namespace, image, placement, high)


def job_inputs(namespace: str, image: str, placement: dict, **kw) -> TrainJobInputs:
    return TrainJobInputs(
        run_id=f"run-{uuid.uuid4().hex[:8]}", namespace=namespace, runtime="torch-distributed", image=image, num_nodes=1,
        queue_name="real", resources_per_node={"cpu": 1}, tolerations=placement["tolerations"],
        volumes=[{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}],
        volume_mounts=[{"name": "workspace", "mountPath": "/workspace"}], **kw,
    )  # fmt: skip


def run(api, kube, core, namespace: str, image: str, placement: dict, high: str) -> None:
    args = ["--model-dir", "/workspace/model", "--dataset-dir", "/workspace/dataset", "--output-dir", "/workspace/output",
            "--max-steps", "400", "--checkpoint-steps", "5", "--logging-steps", "5", "--batch-size", "8",
            "--time-budget-seconds", "60"]  # fmt: skip
    inp = job_inputs(namespace, image, placement, task_name="sft", command=["torchrun", "-m", "kfp_trainer.trainers.sft"], args=args,
                     num_proc_per_node=1)  # fmt: skip
    out, result = io.StringIO(), {}
    launcher = Launcher(KubernetesBackend(kube, namespace=namespace), LaunchOptions(start_timeout=240, run_timeout=300), out=out)
    thread = threading.Thread(target=lambda: result.update(outcome=launcher.run(prepare(launcher.backend, inp))), daemon=True)
    thread.start()
    name = prepare(launcher.backend, inp).manifest["metadata"]["name"]
    checkpoints = claim_folder(core, namespace) / ".checkpoints"
    wait_for(lambda: any(checkpoints.glob("step-*")), 240, what=f"a checkpoint in {checkpoints}:\n{out.getvalue()[-2000:]}", interval=0.5)
    uid = get_trainjob(api, namespace, name)["metadata"]["uid"]
    urgent = job_inputs(namespace, image, placement, task_name="urgent", command=["python", "-c", "import time; time.sleep(3)"],
                        patch={"metadata": {"labels": {PRIORITY_LABEL: high}}})  # fmt: skip
    body = spec.render(urgent)
    client.CustomObjectsApi(api).create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, body)
    wait_for(lambda: "waiting to be re-admitted" in out.getvalue(), 60, what=f"the preemption in the step's log:\n{out.getvalue()[-2000:]}")
    thread.join(420)
    log = out.getvalue()
    assert not thread.is_alive() and result.get("outcome") is not None and result["outcome"].succeeded, log[-3000:]
    assert result["outcome"].preemptions == 1 and "re-admitted after" in log
    resumed = [line for line in log.splitlines() if "resuming from the checkpoint at step" in line]
    assert resumed and "/workspace/output/.checkpoints/step-" in resumed[0], log[-3000:]
    assert [j["metadata"]["uid"] for j in list_trainjobs(api, namespace) if j["metadata"]["name"] == name] == [uid]
    assert (claim_folder(core, namespace) / "model.safetensors").stat().st_size > 0
    print(f"{resumed[0].strip()}; times {result['outcome'].times}")
