"""``register_model`` against a real MLflow server: one version per step with its lineage, the alias only past the gate."""

import json
import os
import tempfile
import uuid
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl, local

from kfp_trainer.components import register_model
from kfp_trainer.errors import EXIT_INFRA, InfraError, InvalidSpecErrors, UserError
from kfp_trainer.steps.registry import run_register_model
from kfp_trainer.tracking.registry import alias_version


def model_artifact(path: Path, uri: str = "", **metadata: Any) -> Any:
    path.mkdir(parents=True, exist_ok=True)
    (path / "model.safetensors").write_bytes(b"weights")
    (path / "config.json").write_text("{}")
    a = dsl.Model(uri=str(path), name="approved_model", metadata=metadata)
    a.path = str(path)
    if uri:
        a.uri = uri  # where KFP stored it (its path is then KFP's mount of that bucket)
    return a


def metrics_artifact(**values: float) -> Any:
    return dsl.Metrics(uri="/tmp/metrics", name="metrics", metadata=dict(values))


def version_tags(server: Any, name: str, version: str) -> dict[str, str]:
    answer = server.client().call("GET", "model-versions/get", query={"name": name, "version": version})["model_version"]
    return {t["key"]: t["value"] for t in answer.get("tags") or []} | {"_source": answer["source"], "_run_id": answer.get("run_id", "")}


@pytest.fixture
def env(mlflow_server) -> dict[str, str]:
    return {"MLFLOW_TRACKING_URI": mlflow_server.url}


LINEAGE = {"trainjob": "team-a/train-abc", "base_model": "builtin://models/tiny-char-lm", "dataset": "builtin://datasets/addition",
           "method": "sft", "weights": "full", "format": "safetensors"}  # fmt: skip


def test_a_local_model_is_uploaded_registered_with_its_lineage_and_gets_the_alias(tmp_path, mlflow_server, env):
    name = f"m-{uuid.uuid4().hex[:6]}"
    model = model_artifact(tmp_path / "model", **LINEAGE)
    done = run_register_model(model=model, model_name=name, metrics=metrics_artifact(exact_match=0.93, loss=0.41), run_id="kfp-run-1",
                              task_name="register-model", kfp_ui_url="https://kfp.example.com", env=env)  # fmt: skip
    assert (done.uri, done.alias, done.reused) == (f"models:/{name}/1", "champion", False)
    tags = version_tags(mlflow_server, name, "1")
    assert tags["_source"].startswith("mlflow-artifacts:/") and tags["_source"].endswith("/model") and tags["_run_id"]
    assert mlflow_server.artifacts(tags["_run_id"], "model") == ["model/config.json", "model/model.safetensors"]
    assert (tags["kfp.pipeline_run_id"], tags["kfp.pipeline_run_url"]) == ("kfp-run-1", "https://kfp.example.com/#/runs/details/kfp-run-1")
    assert (tags["kfp_trainer.trainjob"], tags["kfp_trainer.base_model"], tags["kfp_trainer.dataset"], tags["kfp_trainer.method"]) == (
        "team-a/train-abc", "builtin://models/tiny-char-lm", "builtin://datasets/addition", "sft")
    assert (tags["metric.exact_match"], tags["metric.loss"], tags["kfp_trainer.gate"]) == ("0.93", "0.41", "passed")
    assert alias_version(mlflow_server.client(), name, "champion") == "1"


def test_a_retried_step_hands_back_its_version_and_another_step_makes_the_next(tmp_path, mlflow_server, env):
    name = f"m-{uuid.uuid4().hex[:6]}"
    model = model_artifact(tmp_path / "model", **LINEAGE)
    first = run_register_model(model=model, model_name=name, run_id="r1", task_name="register-model", env=env)
    again = run_register_model(model=model, model_name=name, run_id="r1", task_name="register-model", env=env)
    assert (first.version, again.version, again.reused) == ("1", "1", True)
    answer = mlflow_server.client().call("GET", "model-versions/search", query={"filter": f"name='{name}'"})
    assert [v["version"] for v in answer["model_versions"]] == ["1"]
    loop = run_register_model(model=model, model_name=name, run_id="r1", task_name="register-model", task_id="iteration-2", env=env)
    assert loop.version == "2" and not loop.reused  # a ParallelFor iteration is another step


def test_the_alias_moves_only_when_the_gate_passed(tmp_path, mlflow_server, env):
    name = f"m-{uuid.uuid4().hex[:6]}"
    model = model_artifact(tmp_path / "model", **LINEAGE)
    run_register_model(model=model, model_name=name, run_id="r1", task_name="register-model", env=env)
    failed = run_register_model(model=model, model_name=name, run_id="r2", task_name="register-model", gate_passed=False, env=env)
    assert failed.version == "2" and failed.alias == ""
    assert alias_version(mlflow_server.client(), name, "champion") == "1"
    assert version_tags(mlflow_server, name, "2")["kfp_trainer.gate"] == "failed"
    run_register_model(model=model, model_name=name, run_id="r3", task_name="register-model", env=env)
    assert alias_version(mlflow_server.client(), name, "champion") == "3"


def test_a_remote_model_is_registered_where_it_is_and_linked_to_the_run_that_trained_it(tmp_path, mlflow_server, env):
    name = f"m-{uuid.uuid4().hex[:6]}"
    client = mlflow_server.client()
    training = client.create_run(client.experiment_id("training"), name="train-job", tags={})
    uri = "minio://mlpipeline/v2/artifacts/llm-finetune/6f1c0d5e-0000-4000-8000-000000000001/promote-model/approved_model"
    model = model_artifact(tmp_path / "model", uri=uri, mlflow_run_id=training["run_id"], mlflow_tracking_uri=mlflow_server.url, **LINEAGE)
    done = run_register_model(model=model, model_name=name, run_id="r1", task_name="register-model", alias="", env=env)
    tags = version_tags(mlflow_server, name, done.version)
    assert (tags["_source"], tags["_run_id"], tags["kfp_trainer.model_uri"]) == (uri, training["run_id"], uri)
    assert mlflow_server.artifacts(training["run_id"]) == []  # nothing uploaded
    assert alias_version(client, name, "champion") == ""


def test_registering_without_a_server_or_with_bad_inputs_fails_clearly(tmp_path):
    model = model_artifact(tmp_path / "model")
    with pytest.raises(UserError, match="no MLflow server"):
        run_register_model(model=model, model_name="m", run_id="r", task_name="t", env={})
    with pytest.raises(InvalidSpecErrors) as bad:
        run_register_model(model=model, model_name="a/b", alias="v2", run_id="r", task_name="t", env={"MLFLOW_TRACKING_URI": "http://m"})
    assert [e.field for e in bad.value.errors] == ["model_name", "alias"]
    with pytest.raises(InfraError) as down:
        run_register_model(model=model, model_name="m", run_id="r", task_name="t", env={"MLFLOW_TRACKING_URI": "http://127.0.0.1:9"})
    assert down.value.exit_code == EXIT_INFRA and "did not answer" in str(down.value) and "not registered" in str(down.value)


def test_the_component_under_kfp_local_returns_the_versions_uri(tmp_path, monkeypatch, mlflow_server):
    name = f"m-{uuid.uuid4().hex[:6]}"
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "root"),
               workspace_root=tempfile.mkdtemp(prefix="ws-", dir=tmp_path))  # fmt: skip

    @dsl.component(base_image="python:3.11")
    def make_model(model: dsl.Output[dsl.Model]):
        import os

        os.makedirs(model.path, exist_ok=True)
        with open(os.path.join(model.path, "weights.bin"), "wb") as f:
            f.write(b"w")
        model.metadata.update({"trainjob": "local/train-x", "method": "sft"})

    @dsl.pipeline(name="registry-local")
    def registry_local():
        made = make_model()
        register_model(model=made.outputs["model"], model_name=name)

    registry_local()
    [output] = (tmp_path / "root").glob("*/register-model/executor_output.json")
    assert json.loads(output.read_text())["parameterValues"]["Output"] == f"models:/{name}/1"
    assert alias_version(mlflow_server.client(), name, "champion") == "1"
    assert version_tags(mlflow_server, name, "1")["kfp_trainer.trainjob"] == "local/train-x"
    assert os.environ["MLFLOW_TRACKING_URI"] == mlflow_server.url
