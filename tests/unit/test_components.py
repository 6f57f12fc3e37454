"""Components and the pure helpers under them, called directly (``.python_func``), no pipeline."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl

from kfp_trainer import steps
from kfp_trainer.backends.base import Submission
from kfp_trainer.components import (
    COMPONENTS,
    dataset_initializer,
    evaluate_model,
    model_initializer,
    train_job,
    trainjob_component,
)
from kfp_trainer.errors import UserError, ValidationError
from kfp_trainer.jobstatus import JobRef, JobStatus, Phase
from kfp_trainer.staging import choose_shared_root, placeholders_used, plan_paths, substitute
from kfp_trainer.storage import StorageError, fetch, redact, scheme_of
from kfp_trainer.taskconfig import merge_task_config, task_config_dict
from tests.fakes import FakeBackend, FakeJob


def artifact(cls: type, path: Path, metadata: dict | None = None) -> Any:
    a = cls(uri=str(path), name=path.name, metadata=dict(metadata or {}))
    a.path = str(path)
    return a


# --------------------------------------------------------------------------- import guard


def test_component_modules_import_only_stdlib_and_kfp_at_top_level():
    code = (
        "import sys, kfp_trainer.components as c, kfp_trainer.compile;"
        "heavy = [m for m in ('torch', 'transformers', 'kfp_trainer.launcher', 'kfp_trainer.backends', 'huggingface_hub', 'boto3')"
        " if m in sys.modules]; print(heavy)"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert out == "[]"


def test_every_component_runs_in_the_projects_own_published_image_and_installs_nothing():
    from kfp_trainer.components import _image

    for name, component in COMPONENTS.items():
        container = component.component_spec.implementation.container
        assert container.image in (_image.DEFAULT_IMAGE, _image.DEFAULT_TRAINER_IMAGE), name
        assert container.image.startswith("ghcr.io/kfp-trainer/") and container.image.endswith(":" + _image.VERSION), name
        assert "pip install" not in " ".join(container.command or []), name


# --------------------------------------------------------------------------- TaskConfig merge


def test_task_config_fields_fold_into_trainjob_inputs_and_explicit_inputs_win():
    tc = dsl.TaskConfig(
        resources={"limits": {"cpu": "4", "nvidia.com/gpu": "1"}},
        env=[{"name": "A", "value": "task"}, {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "t"}}}],
        node_selector={"pool": "gpu", "zone": "a"},
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
        affinity={"nodeAffinity": {"x": 1}},
        volumes=[{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "ws"}}],
        volume_mounts=[{"name": "kfp-workspace", "mountPath": "/kfp-workspace"}],
    )
    given = {
        "env": {"A": "mine", "B": "2"},
        "node_selector": {"zone": "b"},
        "tolerations": [{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}, {"key": "spot", "operator": "Exists"}],
        "volumes": [{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
        "volume_mounts": [{"name": "data", "mountPath": "/data"}],
        "num_nodes": None,
    }
    out = merge_task_config(given, tc)
    assert out["resources_per_node"] == {"limits": {"cpu": "4", "nvidia.com/gpu": "1"}}
    assert [e["name"] for e in out["env"]] == ["HF_TOKEN", "A", "B"]
    assert {"name": "A", "value": "mine"} in out["env"]
    assert out["node_selector"] == {"pool": "gpu", "zone": "b"}
    assert len(out["tolerations"]) == 2
    assert out["affinity"] == {"nodeAffinity": {"x": 1}}
    assert [v["name"] for v in out["volumes"]] == ["kfp-workspace", "data"]
    assert [m["mountPath"] for m in out["volume_mounts"]] == ["/kfp-workspace", "/data"]
    assert given["env"] == {"A": "mine", "B": "2"}  # inputs untouched


def test_explicit_resources_and_affinity_are_not_overridden_and_empty_config_changes_nothing():
    given = {"resources_per_node": {"limits": {"cpu": "1"}}, "affinity": {"podAntiAffinity": {}}}
    out = merge_task_config(given, {"resources": {"limits": {"cpu": "8"}}, "affinity": {"nodeAffinity": {}}})
    assert out == given
    assert merge_task_config({"env": {"A": "1"}}, dsl.TaskConfig()) == {"env": {"A": "1"}}
    assert task_config_dict(None) == {}
    assert task_config_dict({"volumeMounts": [{"name": "v"}], "resources": None}) == {"volume_mounts": [{"name": "v"}]}


# --------------------------------------------------------------------------- staging


def test_local_placeholders_are_the_artifact_paths_and_nothing_is_copied():
    plan = plan_paths(
        {"command": ["python", "train.py"], "args": ["--data={dataset}", "{model}", "{output_model}"], "env": {"OUT": "{output_model}"}},
        local=True, artifacts={"dataset": "/a/ds", "model": "/a/m"}, output_model="/a/out", shared_root=None, key="k",
    )
    assert plan.values["args"] == ["--data=/a/ds", "/a/m", "/a/out"] and plan.values["env"] == {"OUT": "/a/out"}
    assert plan.stage_in == [] and plan.stage_out is None


def test_cluster_placeholders_go_through_the_shared_volume_both_ways():
    plan = plan_paths(
        {"args": ["{dataset}", "{model}", "{output_model}"]},
        local=False, artifacts={"dataset": "/minio/ds", "model": "/minio/m"}, output_model="/minio/out",
        shared_root="/kfp-workspace", key="train-x", shared_artifacts={"model": "/kfp-workspace/models/base"},
    )
    base = "/kfp-workspace/.kfp-trainer/train-x"
    assert plan.values["args"] == [f"{base}/dataset", "/kfp-workspace/models/base", f"{base}/output-model"]
    assert plan.stage_in == [("/minio/ds", f"{base}/dataset")]
    assert plan.stage_out == (f"{base}/output-model", "/minio/out")


def test_cluster_without_a_shared_volume_is_refused_with_what_to_do():
    with pytest.raises(ValidationError, match="WORKSPACE_PATH_PLACEHOLDER"):
        plan_paths({"args": ["{output_model}"]}, local=False, artifacts={}, output_model="/o", shared_root=None, key="k")
    with pytest.raises(ValidationError, match="dataset input connected"):
        plan_paths({"args": ["{dataset}"]}, local=True, artifacts={}, output_model="/o", shared_root=None, key="k")
    # no placeholders: nothing to carry, nothing needed
    assert plan_paths({"args": ["x"]}, local=False, artifacts={}, output_model="/o", shared_root=None, key="k").stage_out is None


def test_placeholders_in_env_lists_and_shared_root_choice():
    assert placeholders_used({"env": [{"name": "M", "value": "{model}/w"}, {"name": "S", "valueFrom": {}}]}) == {"model"}
    assert substitute({"env": [{"name": "M", "value": "{model}/w"}]}, {"model": "/m"})["env"] == [{"name": "M", "value": "/m/w"}]
    mounts = [{"name": "ro", "mountPath": "/ro", "readOnly": True}, {"name": "data", "mountPath": "/data/"}]
    vols = [{"name": "ro", "persistentVolumeClaim": {}}, {"name": "data", "persistentVolumeClaim": {"claimName": "d"}}]
    assert choose_shared_root("", mounts, vols) == "/data"
    assert choose_shared_root("/kfp-workspace", [{"name": "s", "mountPath": "/x"}], [{"name": "s", "secret": {}}]) is None


# --------------------------------------------------------------------------- storage


def test_fetch_local_paths_and_builtin_data(tmp_path):
    src = tmp_path / "src"
    (src / "sub").mkdir(parents=True)
    (src / "sub" / "a.txt").write_text("hello")
    info = fetch(f"file://{src}", tmp_path / "out1")
    assert info == {"source_uri": f"file://{src}", "scheme": "file", "files": 1, "bytes": 5}
    assert (tmp_path / "out1" / "sub" / "a.txt").read_text() == "hello"
    assert fetch(str(src / "sub" / "a.txt"), tmp_path / "out2")["files"] == 1
    assert fetch("builtin://datasets/addition", tmp_path / "ds", kind="dataset")["files"] >= 2
    with pytest.raises(StorageError, match="is a dataset, not a model"):
        fetch("builtin://datasets/addition", tmp_path / "x", kind="model")
    with pytest.raises(StorageError, match="no such file"):
        fetch(str(tmp_path / "missing"), tmp_path / "y")
    with pytest.raises(StorageError, match="unsupported scheme 'gs'"):
        fetch("gs://b/k", tmp_path / "z")


def test_hf_fails_fast_and_clearly_when_offline(tmp_path):
    env = {"HF_ENDPOINT": "http://127.0.0.1:9", "HF_TOKEN": "hf_secret_value"}
    try:
        with pytest.raises(StorageError) as err:
            fetch("hf://org/model", tmp_path / "m", kind="model", env=env, timeout=2)
    except ImportError:  # pragma: no cover
        pytest.skip("huggingface_hub missing")
    assert "hf_secret_value" not in str(err.value)
    assert "offline" in str(err.value) or "huggingface_hub" in str(err.value)
    with pytest.raises(StorageError, match="HF_HUB_OFFLINE"):
        fetch("hf://org/model", tmp_path / "m", kind="model", env={"HF_HUB_OFFLINE": "1"})


def test_uris_are_redacted_and_schemes_recognised():
    assert redact("s3://AKIA:topsecret@bucket/p") == "s3://***@bucket/p"
    assert scheme_of("/kfp-workspace/data") == "file" and scheme_of("HF://a/b") == "hf"


# --------------------------------------------------------------------------- steps helpers


def test_identity_placeholders_left_unresolved_fall_back_to_env_then_artifact_uri():
    uri = "minio://mlpipeline/v2/artifacts/llm-finetune/0b6a3c1e-1111-4222-8333-444455556666/train-job/output_model"
    assert steps.resolve_identity("{{$.pipeline_job_uuid}}", "{{$.pipeline_task_name}}", "p", output_uri=uri, env={}) == (
        "0b6a3c1e-1111-4222-8333-444455556666", "train-job", "p")
    assert steps.resolve_identity("{{$.pipeline_job_uuid}}", "t", "{{$.pipeline_job_name}}", env={"KFP_RUN_ID": "r9"})[0] == "r9"
    assert steps.resolve_identity("r1", "t1", "p1", env={}) == ("r1", "t1", "p1")
    with pytest.raises(ValidationError, match="PIPELINE_JOB_ID_PLACEHOLDER"):
        steps.resolve_identity("{{$.pipeline_job_uuid}}", "t", "", output_uri="/tmp/x", env={})


def test_gate_compares_in_the_right_direction():
    assert steps.compare({"loss": 0.5}, {"loss": 1.0}, "loss", 0.1)[0] is True
    assert steps.compare({"loss": 0.95}, {"loss": 1.0}, "loss", 0.1)[0] is False
    assert steps.compare({"exact_match": 0.9}, {"exact_match": 0.2}, "exact_match", 0.5)[0] is True
    assert steps.compare({"exact_match": 0.3}, None, "exact_match", 0.5)[0] is True
    assert steps.compare({}, {"exact_match": 0.2}, "exact_match", 0.0)[0] is False


# --------------------------------------------------------------------------- components via python_func


def test_dataset_and_model_initializers_fill_artifacts_with_metadata(tmp_path):
    ds = artifact(dsl.Dataset, tmp_path / "ds")
    dataset_initializer.python_func(dataset=ds, uri="builtin://datasets/addition")
    assert (tmp_path / "ds" / "train.jsonl").is_file()
    assert ds.metadata["source_uri"] == "builtin://datasets/addition" and ds.metadata["splits"] == "test,train"
    src = tmp_path / "my-model"
    src.mkdir()
    (src / "config.json").write_text("{}")
    (src / "model.safetensors").write_bytes(b"\0" * 8)
    model = artifact(dsl.Model, tmp_path / "m")
    model_initializer.python_func(model=model, uri=f"file://{src}")
    assert model.metadata["weights"] == "full" and model.metadata["format"] == "safetensors" and model.metadata["files"] == 2


def test_initializer_errors_exit_with_the_user_error_code(tmp_path, capsys):
    ds = artifact(dsl.Dataset, tmp_path / "ds")
    with pytest.raises(SystemExit) as err:
        dataset_initializer.python_func(dataset=ds, uri="builtin://datasets/nope")
    assert err.value.code == 2 and "unknown builtin" in capsys.readouterr().err


def test_evaluate_model_logs_metrics_and_gives_a_bool_verdict(tmp_path, monkeypatch):
    import kfp_trainer.trainers.evaluate as ev

    scores = {"loss": 0.2, "perplexity": 1.22, "exact_match": 0.9, "examples": 10}
    monkeypatch.setattr(ev, "evaluate", lambda m, d, split, max_examples: scores)
    metrics = artifact(dsl.Metrics, tmp_path / "metrics")
    base = artifact(dsl.Metrics, tmp_path / "base", metadata={"exact_match": 0.1, "loss": 2.0})
    passed = evaluate_model.python_func(
        model=artifact(dsl.Model, tmp_path / "m"), dataset=artifact(dsl.Dataset, tmp_path / "d"), metrics=metrics,
        baseline=base, min_improvement=0.5,
    )
    assert passed is True
    assert metrics.metadata["exact_match"] == 0.9 and metrics.metadata["gate_passed"] == 1.0
    worse = evaluate_model.python_func(
        model=artifact(dsl.Model, tmp_path / "m"), dataset=artifact(dsl.Dataset, tmp_path / "d"),
        metrics=artifact(dsl.Metrics, tmp_path / "m2"), baseline=base, gate_metric="loss", min_improvement=5.0,
    )
    assert worse is False


class FakeCluster(FakeBackend):
    """Plays a cluster in which the trainer writes its model where --out points (the shared volume)."""

    def __init__(self) -> None:
        done = {"jobsStatus": [{"name": "node", "succeeded": 2, "active": 0, "ready": 0, "failed": 0, "suspended": 0}]}
        lines = [json.dumps({"step": step, "loss": loss}) for step, loss in ((1, 2.0), (2, 1.0), (3, 1.5))]
        script = [JobStatus(Phase.RUNNING), JobStatus(Phase.SUCCEEDED, reason="AllJobsCompleted", raw=done)]
        super().__init__(script, namespace="team-a", nodes=2, lines=lines, hold_logs=False)
        self.manifests = self.submitted

    def create(self, manifest: dict) -> None:
        args = manifest["spec"]["trainer"]["args"]
        data, out = Path(args[args.index("--data") + 1]), Path(args[args.index("--out") + 1])
        out.mkdir(parents=True, exist_ok=True)
        (out / "model.safetensors").write_text("weights trained on " + ",".join(sorted(p.name for p in data.iterdir())))


def test_train_job_on_a_cluster_carries_artifacts_through_the_workspace_and_fills_every_output(tmp_path, monkeypatch):
    fake = FakeCluster()
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: fake)
    (tmp_path / "minio-ds").mkdir()
    (tmp_path / "minio-ds" / "train.jsonl").write_text("{}\n")
    workspace = tmp_path / "kfp-workspace"
    workspace.mkdir()
    ds = artifact(dsl.Dataset, tmp_path / "minio-ds")
    out = artifact(dsl.Model, tmp_path / "minio-out")
    metrics, report = artifact(dsl.Metrics, tmp_path / "metrics"), artifact(dsl.HTML, tmp_path / "report.html")
    handle = tmp_path / "trainjob.txt"
    task_config = dsl.TaskConfig(
        resources={"limits": {"nvidia.com/gpu": "1"}},
        env=[{"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "hf", "key": "token"}}}],
        volumes=[{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "run-ws"}}],
        volume_mounts=[{"name": "kfp-workspace", "mountPath": str(workspace)}],
        tolerations=[{"key": "gpu", "operator": "Exists", "effect": "NoSchedule"}],
    )
    train_job.python_func(
        output_model=out, metrics=metrics, report=report, trainjob=str(handle), image="trainer:1",
        command=["python", "train.py"], args=["--data", "{dataset}", "--out", "{output_model}", "--steps", 5.0],
        num_nodes=2, dataset=ds, run_id="run-1", task_name="train", pipeline_name="p", backend="kubernetes",
        workspace_path=str(workspace), task_config=task_config, delete_after_success=True,
    )
    manifest = fake.manifests[0]
    trainer = manifest["spec"]["trainer"]
    assert trainer["resourcesPerNode"] == {"limits": {"nvidia.com/gpu": "1"}}
    assert trainer["env"][0]["valueFrom"]["secretKeyRef"]["name"] == "hf"
    assert trainer["args"][-1] == "5"  # KFP's 5.0 for an int parameter
    staged = trainer["args"][1]
    assert staged.startswith(f"{workspace}/.kfp-trainer/train-") and staged.endswith("/dataset")
    node = manifest["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
    pod = node["template"]["spec"]["template"]["spec"]
    assert pod["volumes"][0]["persistentVolumeClaim"]["claimName"] == "run-ws"
    assert pod["containers"][0]["volumeMounts"][0]["mountPath"] == str(workspace)
    assert pod["tolerations"][0]["key"] == "gpu"
    # the model came back from the shared volume into the output artifact
    assert (tmp_path / "minio-out" / "model.safetensors").read_text() == "weights trained on train.jsonl"
    assert out.metadata["trainjob"] == f"team-a/{manifest['metadata']['name']}" and out.metadata["format"] == "safetensors"
    assert out.metadata["weights"] == "full" and out.metadata["runtime"] == "ClusterTrainingRuntime/torch-distributed"
    assert {k: v for k, v in metrics.metadata.items() if not k.endswith("_seconds")} == {"loss": 1.5, "best_loss": 1.0}
    assert {"queued_seconds", "starting_seconds", "running_seconds"} <= set(metrics.metadata)
    page = Path(report.path).read_text()
    assert "<svg" in page and "team-a/" in page
    assert handle.read_text() == f"team-a/{manifest['metadata']['name']}"
    assert fake.deleted and fake.deleted[0].name == manifest["metadata"]["name"]


def test_train_job_refuses_before_submitting_when_the_model_cannot_come_back(tmp_path, monkeypatch, capsys):
    fake = FakeCluster()
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: fake)
    with pytest.raises(SystemExit) as err:
        train_job.python_func(
            output_model=artifact(dsl.Model, tmp_path / "o"), metrics=artifact(dsl.Metrics, tmp_path / "m"),
            report=artifact(dsl.HTML, tmp_path / "r"), trainjob=str(tmp_path / "t"), args=["--out", "{output_model}"],
            run_id="r", task_name="t", task_config=dsl.TaskConfig(),
        )
    assert err.value.code == 2 and "workspace_path" in capsys.readouterr().err
    assert fake.manifests == []


def test_train_job_reports_every_invalid_input_before_submitting(tmp_path, monkeypatch, capsys):
    fake = FakeCluster()
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: fake)
    with pytest.raises(SystemExit):
        train_job.python_func(
            output_model=artifact(dsl.Model, tmp_path / "o"), metrics=artifact(dsl.Metrics, tmp_path / "m"),
            report=artifact(dsl.HTML, tmp_path / "r"), trainjob=str(tmp_path / "t"), num_nodes=-3,
            env={"PET_NNODES": "2"}, run_id="r", task_name="t",
        )
    err = capsys.readouterr().err
    assert "num_nodes" in err and "PET_NNODES" in err
    assert fake.manifests == []


def test_empty_output_model_is_an_error_when_the_trainer_was_told_to_write_one(tmp_path, monkeypatch):
    fake = FakeCluster()
    ref = JobRef("team-a", "j")
    fake.submit = lambda manifest, runtime=None, stop=None: (  # type: ignore[method-assign]
        fake.manifests.append(manifest), Submission(FakeJob(fake, ref), False)
    )[1]
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: fake)
    ws = tmp_path / "ws"
    with pytest.raises(SystemExit):
        train_job.python_func(
            output_model=artifact(dsl.Model, tmp_path / "o"), metrics=artifact(dsl.Metrics, tmp_path / "m"),
            report=artifact(dsl.HTML, tmp_path / "r"), trainjob=str(tmp_path / "t"), args=["--out", "{output_model}"],
            run_id="r", task_name="t", volumes=[{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}],
            volume_mounts=[{"name": "d", "mountPath": str(ws)}],
        )
    with pytest.raises(UserError, match="wrote nothing"):
        steps.run_train_job(
            {"args": ["--out", "{output_model}"], "run_id": "r", "task_name": "t",
             "volumes": [{"name": "d", "persistentVolumeClaim": {"claimName": "d"}}],
             "volume_mounts": [{"name": "d", "mountPath": str(ws)}]},
            steps.StepArtifacts(output_model=artifact(dsl.Model, tmp_path / "o2"), metrics=artifact(dsl.Metrics, tmp_path / "m2"),
                                report=artifact(dsl.HTML, tmp_path / "r2"), trainjob_path=str(tmp_path / "t2")),
            steps.StepOptions(backend="kubernetes", start_timeout=0),
        )  # fmt: skip


# --------------------------------------------------------------------------- trainjob_component


def test_trainjob_component_wraps_a_function_and_ships_its_source():
    def fit(output_dir: str, dataset_dir: str, epochs: int = 2, lr: float = 0.1):
        """Fits something."""
        import json
        print(json.dumps({"epoch": epochs, "loss": lr}))

    comp = trainjob_component(fit, num_nodes=3)
    inputs = comp.component_spec.inputs
    assert {"epochs", "lr", "dataset", "num_nodes", "runtime", "image", "backend", "workspace_path"} <= set(inputs)
    assert "output_dir" not in inputs and "model" not in inputs
    assert inputs["num_nodes"].default == 3 and inputs["epochs"].default == 2
    assert set(comp.component_spec.outputs) == {"output_model", "metrics", "report", "trainjob"}
    assert "def fit(output_dir" in " ".join(comp.component_spec.implementation.container.command)
    assert comp.component_spec.description.startswith("Fits something.")


def test_trainjob_component_rejects_unsupported_parameters():
    def bad(x: object):
        pass

    with pytest.raises(TypeError, match="annotate it with str"):
        trainjob_component(bad)

    def taken(num_nodes: int):
        pass

    with pytest.raises(TypeError, match="taken by the component"):
        trainjob_component(taken)


def test_train_job_takes_every_trainjob_input():
    from kfp_trainer.spec import TrainJobInputs

    inputs = set(train_job.component_spec.inputs)
    internal = {"resume_args"}  # set by typed trainers that continue an earlier try, not by users
    assert set(TrainJobInputs.model_fields) - internal <= inputs, sorted(set(TrainJobInputs.model_fields) - internal - inputs)


def test_inputs_are_staged_once_so_a_retry_never_pulls_files_from_under_a_running_trainer(tmp_path):
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.jsonl").write_text("v1")
    dst = tmp_path / "ws" / ".kfp-trainer" / "k" / "dataset"
    assert steps.stage(src, dst) is True
    (src / "train.jsonl").write_text("v2")
    assert steps.stage(src, dst) is False
    assert (dst / "train.jsonl").read_text() == "v1"
    (dst.with_name("dataset.staged")).unlink()  # an interrupted earlier copy is redone
    assert steps.stage(src, dst) is True and (dst / "train.jsonl").read_text() == "v2"
    assert sorted(p.name for p in dst.parent.iterdir()) == ["dataset", "dataset.staged"]


def test_identical_loop_iterations_get_their_own_trainjob_and_a_retry_adopts_its_own(tmp_path, monkeypatch):
    fake = FakeCluster()
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: fake)
    workspace = tmp_path / "kfp-workspace"
    workspace.mkdir()
    (tmp_path / "ds").mkdir()
    (tmp_path / "ds" / "train.jsonl").write_text("{}\n")
    run = "0b6a3c1e-1111-4222-8333-444455556666"

    def step(iteration: str, task_id: str) -> tuple[str, str]:
        # on a backend the output URI holds the run, the task and a folder per execution
        root = f"minio://mlpipeline/v2/artifacts/hparam-sweep/{run}/train-job/{iteration}"
        out = artifact(dsl.Model, tmp_path / iteration / task_id / "out")
        out.uri = f"{root}/output_model"
        train_job.python_func(
            output_model=out, metrics=artifact(dsl.Metrics, tmp_path / iteration / task_id / "m"),
            report=artifact(dsl.HTML, tmp_path / iteration / task_id / "r"), trainjob=str(tmp_path / iteration / task_id / "t"),
            command=["python", "train.py"], args=["--data", "{dataset}", "--out", "{output_model}", "--lr", "0.1"],
            dataset=artifact(dsl.Dataset, tmp_path / "ds"), backend="kubernetes", workspace_path=str(workspace),
            volumes=[{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "ws"}}],
            volume_mounts=[{"name": "kfp-workspace", "mountPath": str(workspace)}],
            run_id=run, task_name="train-job", task_id=task_id,
        )
        manifest = fake.manifests[-1]
        return manifest["metadata"]["name"], manifest["spec"]["trainer"]["args"][3]

    first, second = step("7d5a4c1e-0000-4000-8000-000000000001", "101"), step("7d5a4c1e-0000-4000-8000-000000000002", "102")
    assert first[0] != second[0] and first[1] != second[1]  # own TrainJob, own output folder on the workspace
    assert step("7d5a4c1e-0000-4000-8000-000000000001", "101")[0] == first[0]  # a retry of the first: same name (adopts)
    # kfp.components' own loader leaves task_id unresolved: the output URI's execution folder tells them apart
    unresolved = "{{$.pipeline_task_uuid}}"
    a, b = step("7d5a4c1e-0000-4000-8000-00000000000a", unresolved), step("7d5a4c1e-0000-4000-8000-00000000000b", unresolved)
    assert a[0] != b[0] and a[0] not in (first[0], second[0])
