"""The quick start (docs/guide/quickstart.md, the README's) on the test control plane.

The cluster part, as a user runs it: the install command of the page (``kubectl apply -k deploy/``)
against the real API server and the Trainer's webhooks, into the ``kubeflow`` namespace and its
``pipeline-runner`` service account that a standalone KFP install provides; the page's pipeline
compiled by the page's command with ``KFP_TRAINER_REGISTRY`` set; then its ``train-job`` task run
as a KFP backend runs it (``kfp_driver``: the inputs and the TaskConfig the driver hands the
task; KFP's own executor) under that service account, on the Trainer's ``torch-distributed``
runtime, to the end: the real Trainer and JobSet controllers make the JobSet, Jobs and pods,
whose run KWOK plays (scripted through the task's ``pod_annotations``). KWOK runs no trainer, so
the test writes what the trainer would have written into the folder ``{output_model}`` became.

The liberties taken, as in ``test_pipeline_trainjobs.py``: the workspace's mount path is a folder
of this machine (the step runs here, not in a pod), and the test adds the inputs a test needs
(the namespace, the Kubernetes backend, a start limit, the pod script, clean-up after success).
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
import threading
import uuid
from pathlib import Path

import pytest
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

import kfp_driver  # noqa: E402
from docs_examples import blocks  # noqa: E402  (tests/unit/docs_examples.py)
from helpers import wait_for  # noqa: E402
from k8s_objects import impersonating  # noqa: E402
from test_pipeline_trainjobs import REPO, StoredTrainJobs, executor_input  # noqa: E402
from testcluster import PodScript  # noqa: E402

from kfp_trainer.backends.kubernetes import KubernetesBackend  # noqa: E402

PAGE = REPO / "docs" / "guide" / "quickstart.md"
REGISTRY = "registry.example.com/team"
NAMESPACE, SA = "kubeflow", "pipeline-runner"  # what deploy/rbac.yaml binds: standalone KFP's
GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
TASK = "train-job"
pytestmark = pytest.mark.timeout(300)


def page_command(start: str) -> list[str]:
    """The page's command line that starts with ``start``, as words (its comment left out)."""
    for block in blocks(PAGE, "bash"):
        for line in block.splitlines():
            if line.startswith(start):
                return shlex.split(line, comments=True)
    raise AssertionError(f"{PAGE.name} has no command {start!r}")


@pytest.fixture
def installed(cluster, api_client):
    """The page's install command applied where a standalone KFP runs its steps; removed afterwards."""
    core = client.CoreV1Api(api_client)
    made = []

    def namespace_usable() -> bool:  # absent, or there and not being deleted (a reused cluster's last run)
        try:
            return core.read_namespace(NAMESPACE).metadata.deletion_timestamp is None
        except client.ApiException as e:
            assert e.status == 404, e.body
            return True

    wait_for(namespace_usable, timeout=120, what=f"namespace {NAMESPACE} deleted by an earlier run")
    try:
        core.create_namespace({"metadata": {"name": NAMESPACE, "labels": {"kfp-trainer.test/integration": "true"}}})
        made.append("namespace")
    except client.ApiException as e:
        assert e.status == 409, e.body
    try:
        core.create_namespaced_service_account(NAMESPACE, {"metadata": {"name": SA}})
        made.append("service account")
    except client.ApiException as e:
        assert e.status == 409, e.body
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig)}
    command = page_command("kubectl apply -k deploy/")
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    try:
        yield done.stdout
    finally:
        subprocess.run(["kubectl", "delete", "-k", "deploy/", "--ignore-not-found", "--wait=false"], cwd=REPO, env=env,
                       capture_output=True, text=True, timeout=120)  # fmt: skip
        if "service account" in made:
            core.delete_namespaced_service_account(SA, NAMESPACE)
        if "namespace" in made:
            core.delete_namespace(NAMESPACE, propagation_policy="Background")


@pytest.fixture
def compiled(tmp_path) -> str:
    """The page's pipeline, compiled by the page's command with ``KFP_TRAINER_REGISTRY`` set."""
    (tmp_path / "quickstart.py").write_text(blocks(PAGE, "python")[0])
    command = page_command(".venv/bin/python quickstart.py")
    command[0] = sys.executable
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFP_TRAINER_")}
    env.update({"KFP_TRAINER_REGISTRY": REGISTRY, "PYTHONPATH": str(REPO)})
    done = subprocess.run(command, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return (tmp_path / "quickstart.yaml").read_text()


def test_the_quick_starts_install_and_training_step_run_on_the_cluster_as_the_pipeline_service_account(
    installed, compiled, cluster, api_client, kube_client, tmp_path, monkeypatch
):
    from kfp.dsl import executor as kfp_executor

    from kfp_trainer.components import _image, train_job

    co, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    # What `kubectl apply -k deploy/` installed, as the API server and the Trainer's webhooks took it.
    assert "role.rbac.authorization.k8s.io/kfp-trainer-launcher" in installed
    trl = co.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", "kfp-trainer-trl")
    assert trl["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "trl"
    client.RbacAuthorizationV1Api(api_client).read_namespaced_role_binding("kfp-trainer-launcher", NAMESPACE)

    spec, platform = kfp_driver.load(compiled)
    trainer_image = f"{REGISTRY}/kfp-trainer-trainer:{_image.VERSION}"
    executors = spec["deploymentSpec"]["executors"].values()
    assert {e["container"]["image"] for e in executors} == {f"{REGISTRY}/kfp-trainer:{_image.VERSION}", trainer_image}

    # The run's workspace PVC, as the KFP backend makes it from the compiled pipeline's workspace.
    run_id, run_name = str(uuid.uuid4()), f"quickstart-{uuid.uuid4().hex[:6]}"
    workspace_spec = platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]
    pvc_spec = {**workspace_spec["kubernetes"]["pvcSpecPatch"], "resources": {"requests": {"storage": workspace_spec["size"]}}}
    assert pvc_spec["accessModes"] == ["ReadWriteMany"] and "storageClassName" not in pvc_spec  # the default class
    core.create_namespaced_persistent_volume_claim(NAMESPACE, {"metadata": {"name": f"{run_name}-kfp-workspace"}, "spec": pvc_spec})

    declared = spec["root"]["inputDefinitions"]["parameters"]
    defaults = {k: int(v["defaultValue"]) if v["parameterType"] == "NUMBER_INTEGER" else v["defaultValue"] for k, v in declared.items()}
    context = {"{{$.pipeline_job_uuid}}": run_id, "{{$.pipeline_task_name}}": TASK, "{{$.pipeline_task_uuid}}": "4711",
               "{{$.pipeline_job_name}}": run_name}  # fmt: skip
    inputs = kfp_driver.task_inputs(spec, TASK, defaults, context)
    config = kfp_driver.task_config(spec, platform, TASK, inputs, params=defaults, run_name=run_name)
    assert inputs["workspace_path"] == kfp_driver.WORKSPACE_MOUNT and inputs["image"] == trainer_image
    workspace = tmp_path / "kfp-workspace"
    workspace.mkdir()
    inputs = json.loads(json.dumps(inputs).replace(kfp_driver.WORKSPACE_MOUNT, str(workspace)))
    config = json.loads(json.dumps(config).replace(kfp_driver.WORKSPACE_MOUNT, str(workspace)))
    lines = ['{"step": 50, "loss": 1.31}', '{"step": 100, "loss": 0.42}']
    inputs.update({"namespace": NAMESPACE, "backend": "kubernetes", "start_timeout": 120.0, "delete_after_success": True,
                   "pod_annotations": PodScript(lines=lines, line_delay=0.5).annotations()})  # fmt: skip
    artifacts = {"dataset": tmp_path / "dataset", "model": tmp_path / "model"}
    artifacts["dataset"].mkdir()
    (artifacts["dataset"] / "train.jsonl").write_text(json.dumps({"prompt": "12+7=", "completion": "19"}) + "\n")
    artifacts["model"].mkdir()
    (artifacts["model"] / "config.json").write_text("{}")

    # The step acts as the service account the install bound, nothing more.
    runner = impersonating(kube_client, f"system:serviceaccount:{NAMESPACE}:{SA}")
    monkeypatch.setattr(
        "kfp_trainer.backends.select_backend", lambda kind="auto", **kw: KubernetesBackend(runner, namespace=NAMESPACE, watch_timeout=2)
    )
    monkeypatch.setenv("KFP_POD_NAME", f"{run_name}-launcher")
    monkeypatch.setenv("POD_NAMESPACE", NAMESPACE)
    body = executor_input(spec, TASK, inputs, config, tmp_path, run_id, artifacts)
    outputs = {name: Path(a["artifacts"][0]["uri"]) for name, a in body["outputs"]["artifacts"].items()}
    done = threading.Event()
    batch, jobs = client.BatchV1Api(api_client), []

    try:
        with StoredTrainJobs(api_client, NAMESPACE) as stored:

            def trainer() -> None:  # plays the SFT trainer: its model in the folder --output-dir names
                while not stored.added and not done.is_set():
                    done.wait(0.05)
                if stored.added:
                    args = stored.added[0]["spec"]["trainer"]["args"]
                    out = Path(args[args.index("--output-dir") + 1])
                    out.mkdir(parents=True, exist_ok=True)
                    (out / "model.safetensors").write_bytes(b"fine-tuned weights")
                    (out / "config.json").write_text("{}")
                    job_name = f"{stored.added[0]['metadata']['name']}-node-0"

                    def trainer_job():  # the Job the Trainer made from the runtime, while it lives
                        try:
                            return batch.read_namespaced_job(job_name, NAMESPACE)
                        except client.ApiException as e:
                            assert e.status == 404, e.body
                            return None

                    jobs.append(wait_for(trainer_job, timeout=60, what=f"Job {job_name}"))

            thread = threading.Thread(target=trainer, daemon=True)
            thread.start()
            try:
                kfp_executor.Executor(executor_input=body, function_to_execute=train_job.python_func).execute()
            finally:
                done.set()
                thread.join(5)
    finally:
        runner.close()
        core.delete_namespaced_persistent_volume_claim(f"{run_name}-kfp-workspace", NAMESPACE)

    [job] = stored.added
    name = job["metadata"]["name"]
    trainer_spec = job["spec"]["trainer"]
    assert job["spec"]["runtimeRef"]["name"] == "torch-distributed"
    assert trainer_spec["image"] == trainer_image and trainer_spec["command"] == ["torchrun", "-m", "kfp_trainer.trainers.sft"]
    args = trainer_spec["args"]
    staged = str(workspace / ".kfp-trainer")
    assert all(args[args.index(flag) + 1].startswith(staged) for flag in ("--model-dir", "--dataset-dir", "--output-dir"))
    assert args[args.index("--max-steps") + 1] == "100"  # the pipeline parameter's default, resolved by the driver
    assert trainer_spec["resourcesPerNode"]["limits"] == {"cpu": "2", "memory": "8Gi"}  # set on the task, per node
    # The Trainer built the trainer's Job from the runtime with the TrainJob's image and command.
    assert len(jobs) == 1, "the trainer's Job was not seen"
    container = jobs[0].spec.template.spec.containers[0]
    assert container.image == trainer_image and container.args == args
    # The step's outputs: the model the trainer wrote, with its metadata, and the metrics it printed.
    executor_output = json.loads((outputs["output_model"].parent / "executor_output.json").read_text())
    meta = executor_output["artifacts"]["output_model"]["artifacts"][0]["metadata"]
    assert meta["trainjob"] == f"{NAMESPACE}/{name}" and meta["runtime"] == "ClusterTrainingRuntime/torch-distributed"
    assert (outputs["output_model"] / "model.safetensors").read_bytes() == b"fine-tuned weights"
    metrics = executor_output["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert metrics["loss"] == 0.42
    # delete_after_success: nothing of the run is left in the namespace
    assert co.list_namespaced_custom_object(GROUP, VERSION, NAMESPACE, "trainjobs")["items"] == []
