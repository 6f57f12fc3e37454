"""GRPO for real on the real node: the shipped ``kfp-trainer-trl`` runtime runs TRL's GRPOTrainer in the
trainer image (built here from deploy/Dockerfile.trainer) on 2 nodes x 1 process, with a reward
function of this file shipped as source in the TrainJob's arguments and called in both pods. Kueue
(1 CPU of quota per node on the real node's flavor) preempts the job after its first checkpoint
for a higher-priority one; when Kueue re-admits it, the new pods find the checkpoint on the
workspace claim and resume from it, as SFT and DPO do. Launched by the project's launcher."""

from __future__ import annotations

import io
import json
import threading
import uuid

import images  # hack/k8s/images.py
import pytest
from helpers import get_trainjob, list_trainjobs, wait_for
from kubernetes import client
from realpods import claim_folder, prepare_claim, real_node_queue
from test_realpods_trl import RUNTIME, runtime_with_local_image
from testcluster.kueue import PRIORITY_LABEL

from kfp_trainer import spec
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.components import reward
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.llm.trl_config import trl_settings
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

pytestmark = pytest.mark.timeout(600)
STEPS, SAVE_STEPS = 40, 4


def answer_is_a_number(completions, **kwargs):
    """The user's own reward, run in the trainer pods from this source alone."""
    import socket

    host = socket.gethostname()  # an import inside the function: shipped with it
    return [1.0 if c.strip().isdigit() and host else 0.0 for c in completions]


@pytest.fixture(scope="module")
def trainer_image(real_node):
    return images.import_into("trainer", str(real_node.containerd.socket))[0].ref


def test_grpo_with_a_shipped_reward_runs_on_two_real_nodes_and_resumes_after_a_preemption(
    kueue, api_client, kube_client, namespace, real_node, trainer_image
):
    core = client.CoreV1Api(api_client)
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, "trainingruntimes", runtime_with_local_image(namespace, trainer_image)
    )
    with real_node_queue(api_client, namespace, cpu=2) as (placement, high):  # 1 CPU per node
        prepare_claim(core, namespace, trainer_image, "builtin://datasets/addition", "builtin://models/tiny-char-lm")
        run(api_client, kube_client, core, namespace, trainer_image, placement, high)


def job_inputs(namespace: str, placement: dict, **kw) -> TrainJobInputs:
    given = {"resources_per_node": {"cpu": 1}, **kw}  # 1 CPU of the queue's 2 per node
    return TrainJobInputs(
        run_id=f"run-{uuid.uuid4().hex[:8]}", namespace=namespace, queue_name="real", tolerations=placement["tolerations"],
        volumes=[{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}],
        volume_mounts=[{"name": "workspace", "mountPath": "/workspace"}], **given,
    )  # fmt: skip


def run(api, kube, core, namespace: str, image: str, placement: dict, high: str) -> None:
    settings = trl_settings(method="grpo", rewards=["exact_answer", reward(answer_is_a_number, weight=0.2)], num_generations=4,
                            per_device_train_batch_size=4, max_completion_length=4, learning_rate=0.001, max_steps=STEPS,
                            save_steps=SAVE_STEPS, logging_steps=2, world_size=2)  # fmt: skip
    args = [*settings.to_args(), "--model_name_or_path", "/workspace/model", "--dataset_name", "/workspace/dataset",
            "--output_dir", "/workspace/output"]  # fmt: skip
    inp = job_inputs(namespace, placement, task_name="grpo", runtime=RUNTIME, runtime_kind="TrainingRuntime", args=args, num_nodes=2,
                     num_proc_per_node=1)  # fmt: skip
    out, result = io.StringIO(), {}
    launcher = Launcher(KubernetesBackend(kube, namespace=namespace), LaunchOptions(start_timeout=240, run_timeout=400), out=out)
    thread = threading.Thread(target=lambda: result.update(outcome=launcher.run(prepare(launcher.backend, inp))), daemon=True)
    thread.start()
    name = prepare(launcher.backend, inp).manifest["metadata"]["name"]
    output = claim_folder(core, namespace)
    wait_for(lambda: any((p / "trainer_state.json").is_file() for p in output.glob("checkpoint-*")), 300,
             what=f"a checkpoint in {output}:\n{out.getvalue()[-2000:]}", interval=0.5)  # fmt: skip
    uid = get_trainjob(api, namespace, name)["metadata"]["uid"]
    urgent = job_inputs(namespace, placement, task_name="urgent", runtime="torch-distributed", image=image, num_nodes=1,
                        command=["python", "-c", "import time; time.sleep(3)"], resources_per_node={"cpu": 2},
                        patch={"metadata": {"labels": {PRIORITY_LABEL: high}}})  # fmt: skip
    client.CustomObjectsApi(api).create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, spec.render(urgent))
    wait_for(lambda: "waiting to be re-admitted" in out.getvalue(), 60, what=f"the preemption in the step's log:\n{out.getvalue()[-2000:]}")
    thread.join(480)
    log = out.getvalue()
    assert not thread.is_alive() and result.get("outcome") is not None and result["outcome"].succeeded, log[-3000:]
    assert result["outcome"].preemptions == 1 and "re-admitted after" in log
    assert "resuming from /workspace/output/checkpoint-" in log, log[-3000:]
    assert [j["metadata"]["uid"] for j in list_trainjobs(api, namespace) if j["metadata"]["name"] == name] == [uid]
    series = result["outcome"].metrics
    assert {"rewards/answer_is_a_number/mean", "rewards/exact_answer/mean", "reward"} <= set(series.names()), series.names()
    info = json.loads((output / "training_info.json").read_text())
    assert (info["method"], info["world_size"], info["steps"]) == ("grpo", 2, STEPS) and info["resumed_from_step"] >= SAVE_STEPS
    samples = [json.loads(line) for line in (output / "completions.jsonl").read_text().splitlines()]
    assert samples and all(s["rewards"]["answer_is_a_number"] == float(s["completion"].strip().isdigit()) for s in samples)
    assert (output / "model.safetensors").stat().st_size > 0
