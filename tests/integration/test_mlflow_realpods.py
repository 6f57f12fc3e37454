"""Trainer pods on the real node log into MLflow; KFP's MLflow plugin variables are honoured; credentials stay Secrets.

A real ``mlflow server`` listens on the address this machine has on the real node's pod bridge
(the pods' network reaches nothing else of it). As KFP 2.17's plugin does, the test makes the pipeline run's MLflow run and the
task's nested run, and hands the training step the driver's injection through its
``task_config.env``: ``MLFLOW_TRACKING_URI``, ``MLFLOW_RUN_ID``, ``MLFLOW_EXPERIMENT_ID``, and the
basic-auth credentials as ``secretKeyRef`` of ``kfp-mlflow-credentials`` (the step's own
environment has their values, as the kubelet gives them to its pod). The step runs the SFT
trainer on two real nodes; rank 0 logs its settings, per-step loss and system tags into the
nested run, the launcher the TrainJob and its times. The password is then looked for in the
TrainJob the API server stored, the pods' and the step's logs, the step's outputs and MLflow.
"""

from __future__ import annotations

import io
import json
import sys
import time
import uuid
from contextlib import redirect_stdout
from pathlib import Path

import pytest
from kfp import dsl
from kubernetes import client
from realpods import prepare_claim
from testcluster import realnode
from testcluster.containerd import GATEWAY

from kfp_trainer import steps
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.cancel import stopping
from tests.mlflow_server import MlflowServer, start

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

import images  # noqa: E402  (hack/k8s/images.py)

pytestmark = pytest.mark.timeout(600)
SECRET = "kfp-mlflow-credentials"


@pytest.fixture(scope="module")
def trainer_image(real_node):
    """The trainer image in the real node's containerd (imported unless that digest is there)."""
    return images.import_into("trainer", str(real_node.containerd.socket))[0].ref


@pytest.fixture(scope="module")
def node_mlflow(real_node, tmp_path_factory) -> MlflowServer:
    """``mlflow server`` on the pods' bridge address (the real node's pods reach nothing else of this machine; the test does too)."""
    server = start(tmp_path_factory.mktemp("mlflow-node"), host=GATEWAY)
    yield server
    server.stop()


def artifact(cls: type, path: Path) -> dsl.Artifact:
    a = cls(uri=str(path), name=path.name, metadata={})
    a.path = str(path)
    return a


def test_trainer_pods_log_into_the_kfp_plugins_run_and_the_credentials_stay_secret_references(
    kube_client, api_client, namespace, real_node, trainer_image, node_mlflow, tmp_path, monkeypatch
):
    core = client.CoreV1Api(api_client)
    password = "Pw-" + uuid.uuid4().hex
    secret = {"metadata": {"name": SECRET}, "stringData": {"username": "pipeline-runner", "password": password}}
    core.create_namespaced_secret(namespace, secret)
    prepare_claim(core, namespace, trainer_image, "builtin://datasets/addition", "builtin://models/tiny-char-lm")
    # what KFP's API server and driver make before the task starts
    mlflow = node_mlflow.client()
    experiment_id = mlflow.experiment_id(f"kfp-{namespace}")
    parent = mlflow.create_run(experiment_id, name="llm-finetune", tags={"kfp.pipeline_run_id": "kfp-run-1"})["run_id"]
    nested = mlflow.create_run(experiment_id, name="train-job", tags={"mlflow.parentRunId": parent})["run_id"]
    task_config = {"env": [
        {"name": "MLFLOW_RUN_ID", "value": nested}, {"name": "MLFLOW_TRACKING_URI", "value": node_mlflow.url},
        {"name": "MLFLOW_EXPERIMENT_ID", "value": experiment_id},
        {"name": "MLFLOW_TRACKING_USERNAME", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "username"}}},
        {"name": "MLFLOW_TRACKING_PASSWORD", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "password"}}},
    ]}  # fmt: skip
    for key in ("MLFLOW_TRACKING_URI", "MLFLOW_RUN_ID", "MLFLOW_EXPERIMENT_ID", "MLFLOW_EXPERIMENT_NAME", "MLFLOW_TRACKING_TOKEN"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "pipeline-runner")  # the launcher pod's env, resolved by the kubelet
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    placement = realnode.pod_spec_for_real_node()
    args = ["--model-dir", "/workspace/model", "--dataset-dir", "/workspace/dataset", "--output-dir", "/workspace/output",
            "--max-steps", "12", "--logging-steps", "3", "--batch-size", "8", "--time-budget-seconds", "120"]  # fmt: skip
    artifacts = steps.StepArtifacts(
        output_model=artifact(dsl.Model, tmp_path / "model"), metrics=artifact(dsl.Metrics, tmp_path / "metrics"),
        report=artifact(dsl.HTML, tmp_path / "report"), trainjob_path=str(tmp_path / "trainjob"),
    )  # fmt: skip
    options = steps.StepOptions(backend="kubernetes", start_timeout=180, run_timeout=240, task_config=task_config)
    backend = KubernetesBackend(kube_client, namespace=namespace)
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: backend)
    out = io.StringIO()
    with redirect_stdout(out), stopping() as stop:
        outcome = steps.run_train_job(
            {"run_id": f"run-{time.time_ns()}", "task_name": "train-job", "namespace": namespace, "runtime": "torch-distributed",
             "image": trainer_image, "command": ["torchrun", "-m", "kfp_trainer.trainers.sft"], "args": args, "num_nodes": 2,
             "num_proc_per_node": "1", "node_selector": placement["nodeSelector"], "tolerations": placement["tolerations"],
             "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}],
             "volume_mounts": [{"name": "workspace", "mountPath": "/workspace"}]},
            artifacts, options, stop=stop,
        )  # fmt: skip
    log = out.getvalue()
    assert outcome.succeeded, log[-3000:]
    assert f"logging into the task's run {nested}" in log and "warning" not in log.lower(), log[-3000:]
    # the nested run got it all: no run of the step's own
    runs = {r["info"]["run_id"]: r for r in mlflow.search_runs([experiment_id], "", max_results=10)}
    assert set(runs) == {parent, nested}
    run = runs[nested]
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    job = client.CustomObjectsApi(api_client).get_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", namespace, "trainjobs", outcome.ref.name)
    assert run["info"]["status"] == "FINISHED" and tags["kfp_trainer.trainjob_uid"] == job["metadata"]["uid"]
    assert tags["kfp_trainer.trainer"] == "kfp_trainer.trainers.sft" and tags["kfp_trainer.world_size"] == "2"
    assert tags["kfp_trainer.host"].startswith(outcome.ref.name)  # rank 0's pod, on the real node
    assert params["max_steps"] == "12" and params["logging_steps"] == "3"
    losses = node_mlflow.metric_history(nested, "loss")
    assert sorted({m["step"] for m in losses}) == [3, 6, 9, 12], losses
    assert "report.html" in node_mlflow.artifacts(nested)
    # the credentials: Secret references in the TrainJob, their value nowhere
    env = {e["name"]: e for e in job["spec"]["trainer"]["env"]}
    reference = {"secretKeyRef": {"name": SECRET, "key": "password"}}
    assert env["MLFLOW_TRACKING_PASSWORD"] == {"name": "MLFLOW_TRACKING_PASSWORD", "valueFrom": reference}
    assert env["MLFLOW_RUN_ID"] == {"name": "MLFLOW_RUN_ID", "value": nested}
    pods = core.list_namespaced_pod(namespace, label_selector=f"jobset.sigs.k8s.io/jobset-name={outcome.ref.name}").items
    pod_logs = [core.read_namespaced_pod_log(p.metadata.name, namespace) for p in pods]
    assert len(pods) == 2 and any('"loss"' in text for text in pod_logs)
    texts = [json.dumps(job), log, *pod_logs, json.dumps(runs), node_mlflow.log()]
    assert all(password not in text for text in texts)
    for folder in (tmp_path, node_mlflow.root / "artifacts"):
        for path in folder.rglob("*"):
            if path.is_file():
                assert password.encode() not in path.read_bytes(), f"the credential is in {path}"
