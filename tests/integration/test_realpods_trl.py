"""TRL for real on the real node: the ``kfp-trainer-trl`` runtime shipped in ``deploy/`` (its
torchrun command, the Trainer's torch policy) runs ``kfp_trainer.trainers.trl_train`` in the
trainer image (built here from deploy/Dockerfile.trainer) on 2 nodes x 1 process: TRL's
SFTTrainer on the tiny builtin model and the builtin preference set (its chosen answers), the
ranks meeting through the JobSet's headless Service, rank 0 writing the model to a
ReadWriteMany claim. Launched by the project's launcher."""

from __future__ import annotations

import copy
import io
import json
import sys
import time
from pathlib import Path

import pytest
import yaml
from kubernetes import client
from realpods import claim_folder, prepare_claim
from testcluster import realnode

from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

import images  # noqa: E402  (hack/k8s/images.py)

GROUP, VERSION, RUNTIME = "trainer.kubeflow.org", "v1alpha1", "kfp-trainer-trl"
pytestmark = pytest.mark.timeout(420)


@pytest.fixture(scope="module")
def trainer_image(real_node):
    return images.import_into("trainer", str(real_node.containerd.socket))[0].ref


def runtime_with_local_image(namespace: str, image: str) -> dict:
    """deploy/trl-runtime.yaml as a TrainingRuntime of ``namespace`` whose trainer image is the one built here."""
    deployed = yaml.safe_load((REPO / "deploy" / "trl-runtime.yaml").read_text())
    rt = copy.deepcopy(deployed)
    rt.update(kind="TrainingRuntime", metadata={"name": RUNTIME, "namespace": namespace, "labels": deployed["metadata"]["labels"]})
    node = rt["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
    node["containers"][0].update(image=image, imagePullPolicy="Never")
    return rt


def test_trl_sft_runs_on_two_real_nodes_on_the_shipped_runtime(kube_client, api_client, namespace, real_node, trainer_image):
    core = client.CoreV1Api(api_client)
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainingruntimes", runtime_with_local_image(namespace, trainer_image)
    )
    prepare_claim(core, namespace, trainer_image, "builtin://datasets/addition-preference", "builtin://models/tiny-char-lm")
    placement = realnode.pod_spec_for_real_node()
    args = ["sft", "--model_name_or_path", "/workspace/model", "--dataset_name", "/workspace/dataset", "--output_dir",
            "/workspace/output", "--max_steps", "6", "--per_device_train_batch_size", "8", "--learning_rate", "0.003",
            "--logging_steps", "2"]  # fmt: skip
    inp = TrainJobInputs(
        run_id=f"run-{time.time_ns()}",
        task_name="trl-sft",
        namespace=namespace,
        runtime=RUNTIME,
        runtime_kind="TrainingRuntime",
        args=args,
        num_nodes=2,
        num_proc_per_node=1,
        volumes=[{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}],
        volume_mounts=[{"name": "workspace", "mountPath": "/workspace"}],
        node_selector=placement["nodeSelector"],
        tolerations=placement["tolerations"],
    )
    out = io.StringIO()
    backend = KubernetesBackend(kube_client, namespace=namespace)
    outcome = Launcher(backend, LaunchOptions(start_timeout=180, run_timeout=300), out=out).run(prepare(backend, inp))
    log = out.getvalue()
    assert outcome.succeeded, log[-4000:]
    output = claim_folder(core, namespace)
    info = json.loads((output / "training_info.json").read_text())
    assert (info["method"], info["framework"], info["steps"], info["world_size"]) == ("sft", "trl", 6, 2), info
    assert (output / "model.safetensors").stat().st_size > 0
