"""The project's images (built here by buildah from deploy/Dockerfile.*, hack/k8s/images.py) in real
pods on the test cluster's real node: the ``train_job`` step itself runs in a pod of the component
image with the pod's service account (bound only by deploy/rbac.yaml) and in-cluster configuration,
and launches a TrainJob whose trainer pods run the trainer image on the same node; the initializer
steps serve the samples' builtin model and data sets from the component image, which has no torch."""

from __future__ import annotations

import json
import sys
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from kubernetes import client
from realpods import on_real_node, wait_phase
from test_rbac import SA, apply_rbac
from testcluster import realnode

from tests.our_warnings import ours

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

import images  # noqa: E402  (hack/k8s/images.py)

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"


@pytest.fixture(scope="module")
def image_refs(real_node):
    """Both images imported into the real node's containerd (skipped when that digest is there)."""
    socket = str(real_node.containerd.socket)
    refs = {}
    for name in images.IMAGES:
        started = time.monotonic()
        image, imported = images.import_into(name, socket)
        print(f"{image.ref}: {'imported' if imported else 'already there'} in {time.monotonic() - started:.1f} s")
        refs[name] = image.ref
    return refs


@pytest.fixture
def launcher_account(cluster, api_client, namespace):
    """The ``pipeline-runner`` service account in ``namespace`` with deploy/rbac.yaml's rights and no others."""
    cleanup = apply_rbac(api_client, namespace)
    yield SA
    for delete, name in cleanup:
        delete(name)


def component_container(name: str) -> dict:
    """The container of a compiled component (components/<name>/component.yaml): command and args."""
    spec = yaml.safe_load((REPO / "components" / name / "component.yaml").read_text())
    (executor,) = spec["deploymentSpec"]["executors"].values()
    return executor["container"]


def executor_input(params: dict, outputs: list[str], parameters: list[str], root: str = "/tmp/kfp-outputs") -> str:
    """What KFP's launcher gives the step's container: parameters and where to write its outputs."""
    types = {"output_model": "system.Model", "metrics": "system.Metrics", "report": "system.HTML", "model": "system.Model",
             "dataset": "system.Dataset"}
    return json.dumps({
        "inputs": {"parameterValues": params},
        "outputs": {
            "artifacts": {n: {"artifacts": [{"name": n, "type": {"schemaTitle": types[n]}, "uri": f"{root}/{n}", "metadata": {}}]}
                          for n in outputs},
            "parameters": {n: {"outputFile": f"{root}/{n}"} for n in parameters},
            "outputFile": f"{root}/executor_output.json",
        },
    })


def run_step_pod(cluster, core, namespace: str, name: str, image: str, container: dict, params: dict, account: str,
                 timeout: float = 420, outputs: tuple[str, ...] = ("output_model", "metrics", "report"),
                 parameters: tuple[str, ...] = ("trainjob",), host_outputs: Path | None = None) -> str:
    """Runs a compiled step (``container``: command and args) in a pod of ``image`` on the real node, as KFP
    would: the executor input in its args, the service account's token, in-cluster configuration. Its log.

    ``host_outputs``: a directory of this machine mounted where the step writes its outputs."""
    server = urlparse(cluster.api_client().configuration.host)
    args = [a.replace("{{$}}", executor_input(params, list(outputs), list(parameters))) for a in container["args"]]
    pod = {
        "apiVersion": "v1", "kind": "Pod", "metadata": {"name": name},
        "spec": on_real_node({
            "restartPolicy": "Never", "serviceAccountName": account, "terminationGracePeriodSeconds": 5,
            # the API server listens on the machine's loopback (no Service network here): the pod shares the host's
            "hostNetwork": True,
            "securityContext": {"runAsNonRoot": True},
            "containers": [{
                "name": "main", "image": image, "imagePullPolicy": "Never", "command": container["command"], "args": args,
                "env": [{"name": "KUBERNETES_SERVICE_HOST", "value": server.hostname},
                        {"name": "KUBERNETES_SERVICE_PORT", "value": str(server.port)},
                        {"name": "KFP_POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}}],
            }],
        }),
    }
    if host_outputs is not None:
        pod["spec"]["volumes"] = [{"name": "outputs", "hostPath": {"path": str(host_outputs), "type": "Directory"}}]
        pod["spec"]["containers"][0]["volumeMounts"] = [{"name": "outputs", "mountPath": "/tmp/kfp-outputs"}]
    core.create_namespaced_pod(namespace, pod)
    try:
        done = wait_phase(core, namespace, name, timeout=timeout)
    finally:
        log = core.read_namespaced_pod_log(name, namespace)
        print(log[-3000:])
    assert done.spec.node_name == realnode.NODE_NAME
    return log


def step_params(namespace: str, image: str, **extra) -> dict:
    """The train_job inputs KFP's driver would resolve, with the trainer nodes placed on the real node."""
    placement = realnode.pod_spec_for_real_node()
    return {
        "namespace": namespace, "backend": "kubernetes", "image": image, "node_selector": placement["nodeSelector"],
        "tolerations": placement["tolerations"], "run_id": str(uuid.uuid4()), "task_name": "train-job", "task_id": "1",
        "pipeline_name": "real-pods", "start_timeout": 300.0, "delete_after_success": True, **extra,
    }


def trainer_pod_events(core, namespace: str, image: str) -> list[str]:
    """The trainer pods that started from ``image`` (the kubelet's events)."""
    events = core.list_namespaced_event(namespace).items
    return sorted({e.involved_object.name for e in events if e.reason == "Pulled" and image in (e.message or "")})


def test_the_train_job_step_runs_in_a_component_image_pod_and_its_trainjob_runs_the_trainer_image(
    cluster, api_client, namespace, real_node, image_refs, launcher_account
):
    core = client.CoreV1Api(api_client)
    script = "import os, torch, kfp_trainer.trainers.sft; print('trainer ran', os.getuid(), torch.__version__.split('+')[0])"
    params = step_params(namespace, image_refs["trainer"], num_nodes=1, command=["python", "-c", script])
    log = run_step_pod(cluster, core, namespace, "train-job-step", image_refs["component"], component_container("train_job"),
                       params, launcher_account)
    assert "trainer ran 1000 2." in log, log[-3000:]
    assert len(trainer_pod_events(core, namespace, image_refs["trainer"])) == 1
    # delete_after_success: the step removed its TrainJob once it succeeded
    jobs = client.CustomObjectsApi(api_client).list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"]
    assert jobs == []


def test_the_digits_classifier_trains_on_two_real_trainer_nodes(cluster, api_client, namespace, real_node, image_refs, launcher_account,
                                                                 tmp_path):
    core = client.CoreV1Api(api_client)
    command = ("python -m kfp_trainer.trainers.digits prepare --output-dir /tmp/digits && "
               "torchrun -m kfp_trainer.trainers.digits train --dataset-dir /tmp/digits --output-dir /tmp/model --epochs 8")
    params = step_params(namespace, image_refs["trainer"], num_nodes=2, num_proc_per_node="1", command=["sh", "-c", command])
    outputs = tmp_path / "outputs"
    outputs.mkdir(mode=0o777)
    outputs.chmod(0o777)  # the step runs as UID 1000
    log = run_step_pod(cluster, core, namespace, "digits-step", image_refs["component"], component_container("train_job"),
                       params, launcher_account, host_outputs=outputs)
    epochs = [json.loads(line[line.index("{"):]) for line in log.splitlines() if '"val_accuracy"' in line]
    assert [e["epoch"] for e in epochs] == list(range(1, 9)), log[-3000:]
    assert epochs[-1]["val_accuracy"] > 0.8 and epochs[-1]["loss"] < epochs[0]["loss"]
    assert len(trainer_pod_events(core, namespace, image_refs["trainer"])) == 2  # both nodes ran the trainer image
    # What the user sees of it in KFP: the step's log, its metrics and its report.
    assert ours(log) == [], "a warning of ours in the step's log"
    told = [line for line in log.splitlines() if line.endswith(("waiting for the trainer to start", "trainer is running"))]
    assert [line.rsplit(" ", 1)[-1] for line in told] in (["start", "running"], ["running"]), log[-3000:]  # never backwards
    assert "completed on 2 nodes (AllJobsCompleted)" in log, log[-3000:]
    (metrics,) = json.loads((outputs / "executor_output.json").read_text())["artifacts"]["metrics"]["artifacts"]
    names = {name.removeprefix("best_") for name in metrics["metadata"] if not name.endswith("_seconds")}
    printed = {"features", "seed", "train_examples", "validation_examples", "test_examples"}  # the prepare command's JSON line
    assert names == {"loss", "val_loss", "val_accuracy"} | printed, metrics  # what the trainer printed, no library line's pairs
    report = (outputs / "report").read_text()
    assert "Pending" not in report.split("trainer started", 1)[1], "the report's timeline went back to Pending"


def test_a_trainjob_component_function_runs_in_real_trainer_pods(cluster, api_client, namespace, real_node, image_refs,
                                                                 launcher_account, tmp_path):
    from kfp import compiler

    from kfp_trainer.components import trainjob_component

    def fit(epochs: int = 2):
        """Prints a loss per epoch from a real trainer pod."""
        import json
        import os

        import torch

        for epoch in range(epochs):
            print(json.dumps({"epoch": epoch, "loss": 1.0 / (epoch + 1)}), flush=True)
        print("function ran", os.getuid(), torch.__version__.split("+")[0], os.environ.get("WORLD_SIZE"), flush=True)

    component = trainjob_component(fit, num_nodes=1, num_proc_per_node=1, image=image_refs["trainer"])
    compiler.Compiler().compile(component, str(tmp_path / "fit.yaml"))
    (executor,) = yaml.safe_load((tmp_path / "fit.yaml").read_text())["deploymentSpec"]["executors"].values()
    placement = realnode.pod_spec_for_real_node()
    params = {"epochs": 3, "backend": "kubernetes", "run_id": str(uuid.uuid4()), "task_name": "fit", "task_id": "1",
              "start_timeout": 300.0, "task_config": placement}
    core = client.CoreV1Api(api_client)
    log = run_step_pod(cluster, core, namespace, "fit-step", image_refs["component"], executor["container"], params, launcher_account)
    assert '{"epoch": 2, "loss": 0.3333333333333333}' in log and "function ran 1000 2." in log, log[-3000:]
    assert len(trainer_pod_events(core, namespace, image_refs["trainer"])) == 1


def test_the_initializer_steps_serve_the_samples_builtins_from_the_component_image_as_local_mode_writes_them(
    cluster, api_client, namespace, real_node, image_refs, launcher_account, tmp_path
):
    from safetensors.numpy import load_file

    from kfp_trainer.data.files import read_rows
    from kfp_trainer.trainers import builtin

    core = client.CoreV1Api(api_client)
    served = {}
    for step, output, uri in (("model_initializer", "model", "builtin://models/tiny-char-lm"),
                              ("dataset_initializer", "dataset", "builtin://datasets/instruct-sums")):
        outputs = tmp_path / step
        outputs.mkdir(mode=0o777)
        outputs.chmod(0o777)  # the step runs as UID 1000
        log = run_step_pod(cluster, core, namespace, step.replace("_", "-"), image_refs["component"], component_container(step),
                           {"uri": uri}, launcher_account, timeout=180, outputs=(output,), parameters=(), host_outputs=outputs)
        assert "fetched" in log, log
        (artifact,) = json.loads((outputs / "executor_output.json").read_text())["artifacts"][output]["artifacts"]
        assert artifact["metadata"]["source_uri"] == uri
        served[uri] = outputs / output
    # the same files local mode writes (this machine's torch and transformers are the versions the image's build used)
    local = {uri: builtin.materialize(uri, tmp_path / "local" / uri.rsplit("/", 1)[1]) for uri in served}
    model, local_model = served["builtin://models/tiny-char-lm"], local["builtin://models/tiny-char-lm"]
    for name in ("config.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"):
        assert json.loads((model / name).read_text()) == json.loads((local_model / name).read_text()), name
    weights, local_weights = load_file(model / "model.safetensors"), load_file(local_model / "model.safetensors")
    assert weights.keys() == local_weights.keys() and all((weights[k] == local_weights[k]).all() for k in weights)
    data, local_data = served["builtin://datasets/instruct-sums"], local["builtin://datasets/instruct-sums"]
    assert read_rows(data / "data" / "train.parquet") == read_rows(local_data / "data" / "train.parquet")
    assert (data / "test.jsonl").read_text() == (local_data / "test.jsonl").read_text()
