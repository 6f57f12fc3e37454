"""The torchtune fine-tune step on the real control plane: its TrainJob, and a retry after a lost node that resumes.

The compiled ``llm_finetune_torchtune`` pipeline's fine-tune task is driven as a KFP backend
runs it (``kfp_driver``: its inputs and TaskConfig; KFP's own executor; the ``pipeline-runner``
service account), twice, as KFP's ``set_retry`` does: the same executor input, a new launcher
pod. The real Trainer webhook and controller take the TrainJob; KWOK plays the pods, scripted
through a namespaced copy of the Qwen runtime: the first try's trainer crashes until its Job
gives up (a lost node), the second's succeeds. KWOK runs no torchtune, so the test writes what
the trainer would have written on the workspace folder mounted at its ``/workspace/output``:
epoch 1's checkpoint and recipe state before the crash, epoch 2's once the resumed job runs.
"""

from __future__ import annotations

import copy
import json
import sys
import threading
import uuid
from pathlib import Path

import pytest
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parent))

import kfp_driver  # noqa: E402
from test_pipeline_trainjobs import REPO, StoredTrainJobs, executor_input, pipeline_module, runner  # noqa: E402, F401
from testcluster import PodScript  # noqa: E402

from kfp_trainer.backends.kubernetes import KubernetesBackend  # noqa: E402

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
TASK = "torchtune-finetune"
RUNTIME = "torchtune-qwen2.5-1.5b"
pytestmark = pytest.mark.timeout(300)


def node_script(api, namespace: str, script: PodScript) -> None:
    """Script the trainer pods of the namespaced runtime (its node template's annotations)."""
    co = client.CustomObjectsApi(api)
    rt = co.get_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", RUNTIME)
    node = next(j for j in rt["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")
    node["template"]["spec"]["template"].setdefault("metadata", {})["annotations"] = script.annotations()
    co.replace_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", RUNTIME, rt)


def write_epoch(folder: Path, epoch: int, *, recipe_state: bool, loss: float) -> None:
    """What torchtune's full fine-tune writes at the end of an epoch (the layout, not real weights)."""
    out = folder / f"epoch_{epoch}"
    out.mkdir(parents=True, exist_ok=True)
    (out / "model-00001-of-00001.safetensors").write_bytes(b"weights of epoch %d" % epoch)
    (out / "model.safetensors.index.json").write_text("{}")
    (out / "config.json").write_text(json.dumps({"model_type": "qwen2"}))
    (folder / "logs").mkdir(exist_ok=True)
    with open(folder / "logs" / f"log_{epoch}.txt", "w") as f:
        f.write(f"Step {epoch * 8 + 8} | loss:{loss} lr:3e-3 \n")
    if recipe_state:
        (folder / "recipe_state").mkdir(exist_ok=True)
        (folder / "recipe_state" / "recipe_state.pt").write_bytes(b"PK\x05\x06" + b"\0" * 18)  # a whole (empty) zip archive


def test_a_fine_tune_whose_node_was_lost_resumes_from_the_last_epoch_in_the_retried_steps_trainjob(
    runner, namespace, api_client, tmp_path, monkeypatch  # noqa: F811
):
    from kfp.dsl import executor as kfp_executor

    from kfp_trainer.components import torchtune_finetune

    co, core = client.CustomObjectsApi(api_client), client.CoreV1Api(api_client)
    rt = copy.deepcopy(co.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", RUNTIME))
    rt.update(kind="TrainingRuntime", metadata={"name": RUNTIME, "namespace": namespace, "labels": rt["metadata"]["labels"]})
    co.create_namespaced_custom_object(GROUP, VERSION, namespace, "trainingruntimes", rt)
    node_script(api_client, namespace, PodScript(lines=["1|1|Loss: 11.9", "1|2|Loss: 11.7"], exit_code=137, crash_backoff=0.1))

    module = pipeline_module("llm_finetune_torchtune")
    spec, platform = kfp_driver.load((REPO / "pipelines" / "llm_finetune_torchtune" / "pipeline.yaml").read_text())
    params = {**module.PARAMS, "dataset_uri": "hf://tatsu-lab/alpaca/data", "model_uri": "hf://Qwen/Qwen2.5-1.5B-Instruct",
              "epochs": 2, "learning_rate": 2e-5}  # fmt: skip
    run_id, run_name = str(uuid.uuid4()), f"tt-{uuid.uuid4().hex[:6]}"
    context = {"{{$.pipeline_job_uuid}}": run_id, "{{$.pipeline_task_name}}": TASK, "{{$.pipeline_task_uuid}}": "4711",
               "{{$.pipeline_job_name}}": run_name}  # fmt: skip
    inputs = kfp_driver.task_inputs(spec, TASK, params, context)
    config = kfp_driver.task_config(spec, platform, TASK, inputs, params=params, run_name=run_name)
    workspace = tmp_path / "kfp-workspace"
    workspace.mkdir()
    inputs = json.loads(json.dumps(inputs).replace(kfp_driver.WORKSPACE_MOUNT, str(workspace)))
    config = json.loads(json.dumps(config).replace(kfp_driver.WORKSPACE_MOUNT, str(workspace)))
    inputs.update({"namespace": namespace, "backend": "kubernetes", "runtime_kind": "TrainingRuntime", "start_timeout": 120.0})
    core.create_namespaced_persistent_volume_claim(namespace, {  # the run's workspace, as the KFP backend creates it
        "metadata": {"name": f"{run_name}-kfp-workspace"},
        "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "20Gi"}}, "storageClassName": "standard"},
    })  # fmt: skip
    monkeypatch.setattr(
        "kfp_trainer.backends.select_backend", lambda kind="auto", **kw: KubernetesBackend(runner, namespace=namespace, watch_timeout=2)
    )
    body = executor_input(spec, TASK, inputs, config, tmp_path, run_id, {})
    outputs = {name: Path(a["artifacts"][0]["uri"]) for name, a in body["outputs"]["artifacts"].items()}

    def step(pod: str) -> None:  # one try of the task: a new launcher pod, the same executor input
        monkeypatch.setenv("KFP_POD_NAME", pod)
        monkeypatch.setenv("POD_NAMESPACE", namespace)
        kfp_executor.Executor(executor_input=copy.deepcopy(body), function_to_execute=torchtune_finetune.python_func).execute()

    with StoredTrainJobs(api_client, namespace) as stored:
        with pytest.raises(SystemExit) as first_try:
            step(f"{run_name}-try-1")
        assert first_try.value.code == 1  # the job failed: its node crashed until the Job gave up
        [first] = stored.added
        node = first["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        pod_spec = node["template"]["spec"]["template"]["spec"]
        container = next(c for c in pod_spec["containers"] if c["name"] == "node")
        mount = next(m for m in container["volumeMounts"] if m["mountPath"] == "/workspace/output")
        assert mount["subPath"].startswith(".kfp-trainer/") and mount["subPath"].endswith("/output")
        claims = {v["name"]: v.get("persistentVolumeClaim", {}).get("claimName") for v in pod_spec["volumes"]}
        assert claims[mount["name"]] == claims["kfp-workspace"] == f"{run_name}-kfp-workspace"
        folder = workspace / mount["subPath"]
        write_epoch(folder, 0, recipe_state=True, loss=10.5)  # what the lost node had saved

        node_script(api_client, namespace, PodScript(lines=["2|9|Loss: 10.4", "2|16|Loss: 9.8"]))

        def resumed_trainer() -> None:  # plays the resumed torchtune run: epoch 2's checkpoint once its job exists
            while len(stored.added) < 2 and not done.is_set():
                done.wait(0.05)
            write_epoch(folder, 1, recipe_state=False, loss=9.8)

        done = threading.Event()
        trainer = threading.Thread(target=resumed_trainer, daemon=True)
        trainer.start()
        try:
            step(f"{run_name}-try-2")
        finally:
            done.set()
            trainer.join(5)

    second = stored.added[1]
    # The same job continued: the failed try's TrainJob was replaced (same name and inputs digest), not left behind.
    assert second["metadata"]["name"] == first["metadata"]["name"] and second["metadata"]["uid"] != first["metadata"]["uid"]
    assert first["metadata"]["uid"] in [o["metadata"]["uid"] for o in stored.deleted]
    digest = "kfp-trainer.kubeflow.org/inputs-digest"
    assert second["metadata"]["labels"][digest] == first["metadata"]["labels"][digest]
    args = second["spec"]["trainer"]["args"]
    assert args[:-3] == first["spec"]["trainer"]["args"] and args[-3:] == [
        "resume_from_checkpoint=True",
        "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.safetensors]",
        "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt",
    ]
    # The Trainer merged the mount into the trainer's pods: its own volume at /workspace, the workspace folder below it.
    name = second["metadata"]["name"]
    job = client.BatchV1Api(api_client).read_namespaced_job(f"{name}-node-0", namespace)
    mounts = {m.mount_path: (m.name, m.sub_path) for m in job.spec.template.spec.containers[0].volume_mounts}
    assert mounts["/workspace"] == ("initializer", None) and mounts["/workspace/output"] == (mount["name"], mount["subPath"])
    claims = {v.name: v.persistent_volume_claim.claim_name for v in job.spec.template.spec.volumes if v.persistent_volume_claim}
    assert claims[mount["name"]] == claims["kfp-workspace"] == f"{run_name}-kfp-workspace"

    # The model, its metadata and the report of the retried step.
    meta = json.loads((outputs["output_model"].parent / "executor_output.json").read_text())["artifacts"]["output_model"]["artifacts"][0]
    assert (meta["metadata"]["resumed_from"], meta["metadata"]["epochs"]) == ("epoch_0", 2)
    assert (outputs["output_model"] / "model-00001-of-00001.safetensors").read_bytes() == b"weights of epoch 1"
    report = outputs["report"].read_text()
    assert "from epoch_0 of an earlier try (1 of 2 epochs done)" in report
    assert co.list_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs")["items"][0]["metadata"]["name"] == name
