"""The TRL runtime and the TRL fine-tune step on the real control plane.

``deploy/trl-runtime.yaml`` is applied as an admin applies it: the real API server and the
Trainer's webhooks take the ClusterTrainingRuntime. Then the compiled ``llm_preference``
pipeline's DPO task is driven as a KFP backend runs it (``kfp_driver``: its inputs and
TaskConfig; KFP's own executor; the ``pipeline-runner`` service account) against a namespaced
copy of that runtime whose pods KWOK plays (scripted through its node template's
annotations). KWOK runs no TRL, so the test writes what the trainer would have written into the
output folder the TrainJob's arguments name on the pipeline workspace.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
import uuid
from pathlib import Path

import pytest
import yaml
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kfp_driver  # noqa: E402
from test_pipeline_trainjobs import REPO, StoredTrainJobs, executor_input, pipeline_module, runner  # noqa: E402, F401
from testcluster import PodScript  # noqa: E402

from kfp_trainer.backends.kubernetes import KubernetesBackend  # noqa: E402

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
TASK = "trl-finetune-2"  # the DPO step
RUNTIME = "kfp-trainer-trl"
pytestmark = pytest.mark.timeout(300)


def test_the_deploy_files_runtime_passes_the_trainer_webhooks_and_the_dpo_steps_trainjob_runs_on_it(
    runner, namespace, api_client, tmp_path, monkeypatch  # noqa: F811
):
    from kfp.dsl import executor as kfp_executor

    from kfp_trainer.components import trl_finetune

    co = client.CustomObjectsApi(api_client)
    deployed = yaml.safe_load((REPO / "deploy" / "trl-runtime.yaml").read_text())
    try:
        co.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", deployed)
    except client.ApiException as e:
        assert e.status == 409, e.body  # another test of this session applied it already
    stored_rt = co.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", RUNTIME)
    assert stored_rt["metadata"]["labels"]["trainer.kubeflow.org/framework"] == "trl"
    # The same runtime, namespaced, with its trainer pods scripted to print what the trainer prints and succeed.
    rt = copy.deepcopy(deployed)
    rt.update(kind="TrainingRuntime", metadata={"name": RUNTIME, "namespace": namespace, "labels": deployed["metadata"]["labels"]})
    node = rt["spec"]["template"]["spec"]["replicatedJobs"][0]
    lines = ['{"step": 10, "loss": 0.69, "rewards/margins": 0.01}', '{"step": 20, "loss": 0.65, "rewards/margins": 0.04}']
    node["template"]["spec"]["template"]["metadata"] = {"annotations": PodScript(lines=lines, line_delay=1.0).annotations()}
    co.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", rt)

    module = pipeline_module("llm_preference")
    spec, platform = kfp_driver.load((REPO / "pipelines" / "llm_preference" / "pipeline.yaml").read_text())
    params = dict(module.PARAMS)
    run_id, run_name = str(uuid.uuid4()), f"trl-{uuid.uuid4().hex[:6]}"
    context = {"{{$.pipeline_job_uuid}}": run_id, "{{$.pipeline_task_name}}": TASK, "{{$.pipeline_task_uuid}}": "4711",
               "{{$.pipeline_job_name}}": run_name}  # fmt: skip
    inputs = kfp_driver.task_inputs(spec, TASK, params, context)
    config = kfp_driver.task_config(spec, platform, TASK, inputs, params=params, run_name=run_name)
    workspace = tmp_path / "kfp-workspace"
    workspace.mkdir()
    inputs = json.loads(json.dumps(inputs).replace(kfp_driver.WORKSPACE_MOUNT, str(workspace)))
    config = json.loads(json.dumps(config).replace(kfp_driver.WORKSPACE_MOUNT, str(workspace)))
    inputs.update({"namespace": namespace, "backend": "kubernetes", "runtime_kind": "TrainingRuntime", "start_timeout": 120.0})
    client.CoreV1Api(api_client).create_namespaced_persistent_volume_claim(namespace, {  # the run's workspace, as KFP creates it
        "metadata": {"name": f"{run_name}-kfp-workspace"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "10Gi"}}, "storageClassName": "standard"},
    })  # fmt: skip
    artifacts = {"model": tmp_path / "sft-model", "dataset": tmp_path / "dataset"}
    (artifacts["model"]).mkdir()
    (artifacts["model"] / "config.json").write_text("{}")
    (artifacts["dataset"]).mkdir()
    (artifacts["dataset"] / "train.jsonl").write_text(json.dumps({"prompt": "1+1=", "chosen": "2", "rejected": "3"}) + "\n")
    monkeypatch.setattr(
        "kfp_trainer.backends.select_backend", lambda kind="auto", **kw: KubernetesBackend(runner, namespace=namespace, watch_timeout=2)
    )
    monkeypatch.setenv("KFP_POD_NAME", f"{run_name}-launcher")
    monkeypatch.setenv("POD_NAMESPACE", namespace)
    body = executor_input(spec, TASK, inputs, config, tmp_path, run_id, artifacts)
    outputs = {name: Path(a["artifacts"][0]["uri"]) for name, a in body["outputs"]["artifacts"].items()}

    with StoredTrainJobs(api_client, namespace) as stored:

        def trainer() -> None:  # plays trl_train: once the job exists, its model in the folder --output_dir names
            while not stored.added and not done.is_set():
                done.wait(0.05)
            if stored.added:
                args = stored.added[0]["spec"]["trainer"]["args"]
                out = Path(args[args.index("--output_dir") + 1])
                (out / "adapter").mkdir(parents=True, exist_ok=True)
                (out / "model.safetensors").write_bytes(b"merged weights")
                (out / "adapter" / "adapter_config.json").write_text("{}")
                info = {"method": "dpo", "weights": "adapter", "merged_model": True, "steps": 20, "train_loss": 0.66}
                (out / "training_info.json").write_text(json.dumps(info))

        done = threading.Event()
        thread = threading.Thread(target=trainer, daemon=True)
        thread.start()
        try:
            kfp_executor.Executor(executor_input=copy.deepcopy(body), function_to_execute=trl_finetune.python_func).execute()
        finally:
            done.set()
            thread.join(5)

    [job] = stored.added
    trainer_spec = job["spec"]["trainer"]
    assert job["spec"]["runtimeRef"] == {"apiGroup": GROUP, "kind": "TrainingRuntime", "name": RUNTIME}
    assert "command" not in trainer_spec  # the runtime's torchrun command runs the arguments
    args = trainer_spec["args"]
    assert args[:3] == ["dpo", "--learning_rate", "0.002"] and args[args.index("--beta") + 1] == "0.1"
    assert args[args.index("--lora_target_modules") + 1] == "all-linear" and "--use_peft" in args
    shared = str(workspace / ".kfp-trainer")
    assert all(args[args.index(flag) + 1].startswith(shared) for flag in ("--model_name_or_path", "--dataset_name", "--output_dir"))
    # The Trainer built the trainer's Job from the runtime: its image and torchrun command, the TrainJob's arguments.
    name = job["metadata"]["name"]
    container = client.BatchV1Api(api_client).read_namespaced_job(f"{name}-node-0", namespace).spec.template.spec.containers[0]
    assert container.command == ["torchrun", "-m", "kfp_trainer.trainers.trl_train"] and container.args == args
    assert container.image == deployed["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"][
        "containers"][0]["image"]  # fmt: skip
    env = {e.name for e in container.env or []}
    assert {"PET_NNODES", "PET_MASTER_ADDR"} <= env  # the torch policy's torchrun environment
    # The model, its metadata and the metrics the trainer printed.
    executor_output = json.loads((outputs["output_model"].parent / "executor_output.json").read_text())
    meta = executor_output["artifacts"]["output_model"]["artifacts"][0]["metadata"]
    assert (meta["method"], meta["trainer"], meta["weights"], meta["merged_model"]) == ("dpo", "trl", "adapter", True)
    assert meta["runtime"] == f"TrainingRuntime/{RUNTIME}" and meta["trainjob"] == f"{namespace}/{name}"
    assert (outputs["output_model"] / "model.safetensors").read_bytes() == b"merged weights"
    metrics = executor_output["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert metrics["rewards/margins"] == 0.04 and metrics["loss"] == 0.65
