"""Rendering: both Trainer API versions, every input lands where the Trainer API expects it."""

from __future__ import annotations

import copy

import pytest

from kfp_trainer import build_trainjob
from kfp_trainer.spec import LABEL_RUN, LABEL_TASK, MANAGER, TrainJobInputs, deep_merge, render

FULL = dict(
    run_id="6f1c0d5e-1111-4000-8000-000000000001",
    task_name="train-job",
    pipeline_name="llm-finetune",
    namespace="team-a",
    runtime="torch-distributed",
    image="ghcr.io/example/trainer:1.0",
    command=["torchrun", "train.py"],
    args=["--epochs", "3"],
    env={"EPOCHS": "3"},
    num_nodes=2,
    num_proc_per_node=4,
    resources_per_node={"limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": 1}},
    dataset_uri="hf://tatsu-lab/alpaca",
    dataset_secret="hf-token",
    model_uri="s3://models/qwen",
    model_secret="s3-creds",
    model_env={"REGION": "eu-west-1"},
    labels={"team": "nlp"},
    annotations={"example.com/owner": "alice"},
    pod_labels={"sidecar.istio.io/inject": "false"},
    pod_annotations={"example.com/note": "x"},
    volumes=[{"name": "workspace", "persistentVolumeClaim": {"claimName": "ws-pvc"}}],
    volume_mounts=[{"name": "workspace", "mountPath": "/kfp-workspace"}],
    node_selector={"accelerator": "a100"},
    tolerations=[{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}],
    affinity={"nodeAffinity": {"requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": []}}},
    service_account="trainer-sa",
    image_pull_secrets=["regcred"],
    active_deadline_seconds=3600,
    queue_name="team-a-queue",
)


def _pod_patch(manifest: dict, job: str = "node") -> dict:
    patch = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]
    for rj in patch["spec"]["replicatedJobs"]:
        if rj["name"] == job:
            return rj["template"]["spec"]["template"]
    raise AssertionError(f"no patch for {job}")


def test_v22_puts_trainer_initializer_and_pod_settings_where_the_api_expects_them():
    m = build_trainjob(**FULL)
    assert m["apiVersion"] == "trainer.kubeflow.org/v1alpha1" and m["kind"] == "TrainJob"
    assert m["metadata"]["namespace"] == "team-a"
    assert m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "team-a-queue"
    spec = m["spec"]
    assert spec["runtimeRef"] == {"apiGroup": "trainer.kubeflow.org", "kind": "ClusterTrainingRuntime", "name": "torch-distributed"}
    assert spec["trainer"] == {
        "image": "ghcr.io/example/trainer:1.0",
        "command": ["torchrun", "train.py"],
        "args": ["--epochs", "3"],
        "env": [{"name": "EPOCHS", "value": "3"}],
        "numNodes": 2,
        "numProcPerNode": 4,
        "resourcesPerNode": {"limits": {"cpu": "4", "memory": "16Gi", "nvidia.com/gpu": "1"}},
    }
    assert spec["initializer"]["dataset"] == {"storageUri": "hf://tatsu-lab/alpaca", "secretRef": {"name": "hf-token"}}
    assert spec["initializer"]["model"] == {
        "storageUri": "s3://models/qwen",
        "env": [{"name": "REGION", "value": "eu-west-1"}],
        "secretRef": {"name": "s3-creds"},
    }
    assert spec["activeDeadlineSeconds"] == 3600
    assert "podTemplateOverrides" not in spec and "labels" not in spec
    (patch,) = spec["runtimePatches"]
    assert patch["manager"] == MANAGER
    jobset_meta = patch["trainingRuntimeSpec"]["template"]["metadata"]
    assert jobset_meta["labels"]["team"] == "nlp" and jobset_meta["labels"][LABEL_RUN] == FULL["run_id"]
    assert jobset_meta["annotations"] == {"example.com/owner": "alice"}
    pod = _pod_patch(m)
    assert pod["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    assert pod["metadata"]["labels"][LABEL_TASK] == "train-job"
    assert pod["metadata"]["annotations"] == {"example.com/note": "x"}
    assert pod["spec"] == {
        "serviceAccountName": "trainer-sa",
        "volumes": FULL["volumes"],
        "containers": [{"name": "node", "volumeMounts": FULL["volume_mounts"]}],
        "imagePullSecrets": [{"name": "regcred"}],
        "nodeSelector": {"accelerator": "a100"},
        "affinity": FULL["affinity"],
        "tolerations": FULL["tolerations"],
    }
    # The webhook rejects env patches on the node container: env only in trainer.env.
    assert all("env" not in c for c in pod["spec"]["containers"])


def test_v21_uses_pod_template_overrides_and_top_level_labels():
    inputs = {k: v for k, v in FULL.items() if k != "active_deadline_seconds"}
    m = build_trainjob(api_version="v2.1", **inputs)
    spec = m["spec"]
    assert "runtimePatches" not in spec and "activeDeadlineSeconds" not in spec
    assert spec["labels"]["team"] == "nlp" and spec["annotations"] == {"example.com/owner": "alice"}
    (override,) = spec["podTemplateOverrides"]
    assert override["targetJobs"] == [{"name": "node"}]
    assert override["metadata"]["labels"]["sidecar.istio.io/inject"] == "false"
    assert override["spec"]["nodeSelector"] == {"accelerator": "a100"}
    assert override["spec"]["containers"] == [{"name": "node", "volumeMounts": FULL["volume_mounts"]}]
    assert spec["trainer"] == build_trainjob(**FULL)["spec"]["trainer"]


def test_v21_accepts_auto_proc_per_node_but_v22_does_not():
    m = build_trainjob(api_version="v2.1", run_id="r", task_name="t", num_proc_per_node="auto")
    assert m["spec"]["trainer"]["numProcPerNode"] == "auto"
    with pytest.raises(ValueError, match="v2.2\\+ takes integers only"):
        build_trainjob(api_version="v2.2", run_id="r", task_name="t", num_proc_per_node="auto")


def test_pod_targets_follow_the_runtime_jobs():
    inputs = TrainJobInputs(
        run_id="r",
        task_name="t",
        node_selector={"a": "b"},
        pod_targets=["dataset-initializer"],
        volume_mounts=[{"name": "initializer", "mountPath": "/workspace"}],
    )
    m = render(inputs, runtime_jobs=["dataset-initializer", "model-initializer", "node"])
    jobs = [rj["name"] for rj in m["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
    assert jobs == ["node", "dataset-initializer"]
    assert _pod_patch(m, "dataset-initializer")["spec"]["containers"][0]["name"] == "dataset-initializer"
    mpi = render(TrainJobInputs(run_id="r", task_name="t"), runtime_jobs=["launcher", "node"])
    jobs = [rj["name"] for rj in mpi["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
    assert jobs == ["node", "launcher"]
    missing = render(TrainJobInputs(run_id="r", task_name="t", pod_targets=["dataset-initializer"]), runtime_jobs=["node"])
    jobs = [rj["name"] for rj in missing["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"]]
    assert jobs == ["node"]


def test_minimal_inputs_render_a_minimal_job():
    m = build_trainjob(run_id="r", task_name="t")
    assert set(m["spec"]) == {"runtimeRef", "runtimePatches"}
    assert "namespace" not in m["metadata"]


def test_env_as_list_keeps_secret_references():
    ref = {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}
    m = build_trainjob(run_id="r", task_name="t", env=[ref, {"name": "A", "value": "1"}])
    assert m["spec"]["trainer"]["env"] == [ref, {"name": "A", "value": "1"}]


def test_patch_deep_merges_and_can_delete():
    m = build_trainjob(run_id="r", task_name="t", num_nodes=2, patch={"spec": {"trainer": {"numNodes": 3}, "suspend": True}})
    assert m["spec"]["trainer"]["numNodes"] == 3 and m["spec"]["suspend"] is True
    m = build_trainjob(run_id="r", task_name="t", labels={"a": "b"}, patch={"spec": {"runtimePatches": None}})
    assert "runtimePatches" not in m["spec"]


def test_deep_merge_does_not_mutate_inputs():
    base = {"a": {"b": [1]}}
    snapshot = copy.deepcopy(base)
    merged = deep_merge(base, {"a": {"c": 1}})
    assert base == snapshot and merged == {"a": {"b": [1], "c": 1}}


def test_rendered_manifest_maps_onto_the_upstream_generated_models():
    models = pytest.importorskip("kubeflow_trainer_api.models")
    m = build_trainjob(**FULL)
    round_trip = models.TrainerV1alpha1TrainJob.from_dict(copy.deepcopy(m)).to_dict()

    def prune(x):
        if isinstance(x, dict):
            return {k: prune(v) for k, v in x.items() if v is not None}
        if isinstance(x, list):
            return [prune(v) for v in x]
        return x

    assert prune(round_trip) == m


def test_same_inputs_same_name_and_different_inputs_different_name():
    a = build_trainjob(run_id="r", task_name="t", env={"LR": "0.1"})["metadata"]["name"]
    b = build_trainjob(run_id="r", task_name="t", env={"LR": "0.1"})["metadata"]["name"]
    c = build_trainjob(run_id="r", task_name="t", env={"LR": "0.2"})["metadata"]["name"]
    assert a == b != c


def test_suspend_and_queue_label():
    m = build_trainjob(run_id="r", task_name="t", suspend=True, queue_name="q1")
    assert m["spec"]["suspend"] is True
    assert m["metadata"]["labels"]["kueue.x-k8s.io/queue-name"] == "q1"
    assert "kueue.x-k8s.io/priority-class" not in m["metadata"]["labels"]


def test_priority_class_is_the_kueue_priority_label_and_keeps_names_of_jobs_without_one():
    m = build_trainjob(run_id="r", task_name="t", queue_name="q1", priority_class="high")
    assert m["metadata"]["labels"]["kueue.x-k8s.io/priority-class"] == "high"
    plain = build_trainjob(run_id="r", task_name="t", queue_name="q1")
    assert plain["metadata"]["name"] != m["metadata"]["name"]  # another job: it takes part in the inputs digest
    assert plain["metadata"]["name"] == build_trainjob(run_id="r", task_name="t", queue_name="q1", priority_class="")["metadata"]["name"]
