"""A launcher step tracked in a real MLflow server (``mlflow server``, SQLite, artifacts on disk).

The trainer logs its params, per-epoch metrics and system tags from rank 0; the launcher adds
the TrainJob, times, final metrics and the report; the run ends FINISHED, FAILED or KILLED; a
retried step continues its run; KFP's plugin variables (as its driver sets them) are honoured;
an unreachable server is one warning; credentials never land in a TrainJob, a log or an artifact.
"""

from __future__ import annotations

import importlib.util
import io
import json
import os
import signal
import tempfile
import threading
import time
import uuid
from contextlib import redirect_stdout
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl, local

from kfp_trainer import steps
from kfp_trainer.cancel import stopping
from kfp_trainer.components import train_job
from kfp_trainer.errors import CancelledError, JobFailedError
from kfp_trainer.jobstatus import JobStatus, Phase
from kfp_trainer.trainers import digits
from tests.fakes import FakeBackend

REPO = Path(__file__).resolve().parents[2]


def load_pipeline_module(name: str) -> Any:
    spec = importlib.util.spec_from_file_location(f"{name}_pipeline", REPO / "pipelines" / name / "pipeline.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def artifact(cls: type, path: Path, metadata: dict | None = None) -> Any:
    a = cls(uri=str(path), name=path.name, metadata=dict(metadata or {}))
    a.path = str(path)
    return a


def tags_of(run: dict) -> dict[str, str]:
    return {t["key"]: t["value"] for t in run["data"].get("tags") or []}


def params_of(run: dict) -> dict[str, str]:
    return {p["key"]: p["value"] for p in run["data"].get("params") or []}


def metrics_of(run: dict) -> dict[str, float]:
    return {m["key"]: m["value"] for m in run["data"].get("metrics") or []}


@pytest.fixture
def experiment(monkeypatch, mlflow_server) -> str:
    """A fresh experiment on the test server, named in the step's environment."""
    name = f"exp-{uuid.uuid4().hex[:8]}"
    for key in [k for k in os.environ if k.startswith("MLFLOW_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", name)
    return name


def run_step(tmp: Path, backend: Any, *, run_id: str = "run-1", task_config: Any = None, **inputs: Any) -> tuple[Any, str]:
    """``run_train_job`` on ``backend`` with a stop token, as the component runs it; (outcome or the error raised, the log)."""
    out = io.StringIO()
    tmp.mkdir(parents=True, exist_ok=True)
    artifacts = steps.StepArtifacts(
        output_model=artifact(dsl.Model, tmp / "model"), metrics=artifact(dsl.Metrics, tmp / "metrics"),
        report=artifact(dsl.HTML, tmp / "report"), trainjob_path=str(tmp / "trainjob"),
    )  # fmt: skip
    options = steps.StepOptions(backend="kubernetes", start_timeout=0, run_timeout=0, task_config=task_config)
    result: Any
    with redirect_stdout(out), pytest.MonkeyPatch.context() as patch:
        patch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: backend)
        try:
            with stopping() as stop:
                result = steps.run_train_job(
                    {"run_id": run_id, "task_name": "train", "pipeline_name": "p", "namespace": "ns", **inputs}, artifacts, options,
                    stop=stop,
                )  # fmt: skip
        except Exception as e:  # noqa: BLE001 - the test looks at it
            result = e
    return result, out.getvalue()


def succeeding() -> FakeBackend:
    return FakeBackend([JobStatus(Phase.RUNNING), JobStatus(Phase.SUCCEEDED)], lines=['{"step": 5, "loss": 0.5}'], hold_logs=False)


# --------------------------------------------------------------------------- the real trainer, under kfp.local


@pytest.mark.slow
def test_a_tracked_step_gets_the_trainers_params_and_curves_and_what_the_launcher_knows(tmp_path, monkeypatch, mlflow_server, experiment):
    monkeypatch.setenv("KFP_TRAINER_BACKEND", "local")
    monkeypatch.setenv("KFP_TRAINER_LOCAL_ROOT", str(tmp_path / "trainjobs"))
    root = tmp_path / "pipeline-root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root),
               workspace_root=tempfile.mkdtemp(prefix="ws-", dir=tmp_path))  # fmt: skip
    prepare_digits = load_pipeline_module("pytorch_distributed").prepare_digits

    @dsl.pipeline(name="tracked")
    def tracked():
        data = prepare_digits()
        train_job(
            runtime="torch-distributed", command=["torchrun", "-m", "kfp_trainer.trainers.digits", "train"],
            args=["--dataset-dir", "{dataset}", "--output-dir", "{output_model}", "--epochs", "3", "--hidden", "16"],
            num_nodes=2, num_proc_per_node="1", dataset=data.outputs["dataset"],
        )  # fmt: skip

    tracked()
    [run] = mlflow_server.runs(experiment)
    info, tags, params, metrics = run["info"], tags_of(run), params_of(run), metrics_of(run)
    [model_dir] = root.glob("*/train-job/output_model")
    output = json.loads(next(root.glob("*/train-job/executor_output.json")).read_text())
    model_meta = output["artifacts"]["output_model"]["artifacts"][0]["metadata"]
    assert info["status"] == "FINISHED" and model_meta["mlflow_run_id"] == info["run_id"]
    # the launcher: the step's identity, the TrainJob, the times, the final metrics, the report
    assert tags["kfp.task_name"] == "train-job" and tags["kfp.pipeline_run_id"] and tags["kfp_trainer.task"]
    assert tags["kfp_trainer.trainjob"] == model_meta["trainjob"] and tags["kfp_trainer.trainjob_uid"]
    assert tags["kfp_trainer.runtime"] == "ClusterTrainingRuntime/torch-distributed" and tags["kfp_trainer.nodes"] == "2"
    assert tags["kfp_trainer.trainer_api"] in ("v2.1", "v2.2")
    assert {"running_seconds", "starting_seconds", "queued_seconds", "preemptions", "val_accuracy"} <= set(metrics)
    assert metrics["preemptions"] == 0 and metrics["val_accuracy"] > 0.5
    assert mlflow_server.artifacts(info["run_id"]) == ["report.html"]
    assert (Path(mlflow_server.root) / "artifacts").rglob("report.html")
    # the trainer, from rank 0: its settings, one point per epoch, system tags
    assert (params["epochs"], params["hidden"]) == ("3", "16")
    assert tags["kfp_trainer.trainer"] == "kfp_trainer.trainers.digits" and tags["kfp_trainer.world_size"] == "2"
    history = mlflow_server.metric_history(info["run_id"], "val_loss")
    assert sorted({m["step"] for m in history}) == [1, 2, 3]  # the launcher's final value lands on the last epoch
    assert (model_dir / "model.safetensors").is_file()


@pytest.mark.slow
def test_a_tracked_grpo_step_logs_each_rewards_mean_and_spread_per_step_and_its_sampled_completions(tmp_path, monkeypatch,
                                                                                                    mlflow_server, experiment):
    from kfp_trainer.components import trl_finetune

    monkeypatch.setenv("KFP_TRAINER_BACKEND", "local")
    monkeypatch.setenv("KFP_TRAINER_LOCAL_ROOT", str(tmp_path / "trainjobs"))
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(tmp_path / "pipeline-root"),
               workspace_root=tempfile.mkdtemp(prefix="ws-", dir=tmp_path))  # fmt: skip

    @dsl.pipeline(name="tracked-grpo")
    def tracked():
        trl_finetune(method="grpo", model_uri="builtin://models/tiny-char-lm", dataset_uri="builtin://datasets/addition",
                     rewards=["exact_answer", {"name": "format", "pattern": "[0-9]+", "weight": 0.1}], num_generations=4,
                     per_device_train_batch_size=8, max_completion_length=4, max_steps=3, logging_steps=1,
                     num_proc_per_node="1")  # fmt: skip

    tracked()
    [run] = mlflow_server.runs(experiment)
    info = run["info"]
    assert info["status"] == "FINISHED"
    for name in ("rewards/exact_answer/mean", "rewards/exact_answer/std", "rewards/format/mean", "reward", "completions/mean_length"):
        assert [m["step"] for m in mlflow_server.metric_history(info["run_id"], name)][:3] == [1, 2, 3], name  # from rank 0, per step
    assert sorted(mlflow_server.artifacts(info["run_id"])) == ["completions.jsonl", "report.html"]
    [uploaded] = (Path(mlflow_server.root) / "artifacts").rglob("completions.jsonl")
    samples = [json.loads(line) for line in uploaded.read_text().splitlines()]
    assert samples and all(set(s["rewards"]) == {"exact_answer", "format"} for s in samples)


# --------------------------------------------------------------------------- run status, retries, problems


def test_a_failed_step_ends_its_run_failed_and_its_retry_continues_the_same_run(tmp_path, mlflow_server, experiment):
    failing = FakeBackend([JobStatus(Phase.RUNNING), JobStatus(Phase.FAILED, "FailedJobs", "node-0 exited 1")], hold_logs=False)
    error, log = run_step(tmp_path / "try-1", failing)
    assert isinstance(error, JobFailedError) and "MLflow: run " in log, log
    [run] = mlflow_server.runs(experiment)
    assert run["info"]["status"] == "FAILED" and "node-0 exited 1" in tags_of(run)["kfp_trainer.error"]
    outcome, log = run_step(tmp_path / "try-2", succeeding())
    assert outcome.succeeded and f"continuing the run of an earlier try {run['info']['run_id']}" in log
    [again] = mlflow_server.runs(experiment)
    assert again["info"]["run_id"] == run["info"]["run_id"] and again["info"]["status"] == "FINISHED"
    assert metrics_of(again)["loss"] == 0.5
    other, _ = run_step(tmp_path / "other-run", succeeding(), run_id="run-2")  # another KFP run: its own MLflow run
    assert other.succeeded and len(mlflow_server.runs(experiment)) == 2


def test_a_cancelled_step_ends_its_run_killed(tmp_path, mlflow_server, experiment):
    def sigterm_soon() -> None:
        threading.Timer(0.3, lambda: os.kill(os.getpid(), signal.SIGTERM)).start()

    fake = FakeBackend([JobStatus(Phase.RUNNING)], idle=True, hooks={"watch": sigterm_soon})
    error, log = run_step(tmp_path, fake)
    assert isinstance(error, CancelledError) and fake.deleted
    [run] = mlflow_server.runs(experiment)
    assert run["info"]["status"] == "KILLED"


@pytest.mark.slow
def test_a_tracker_that_hangs_mid_training_loses_nothing_and_the_run_still_ends_finished(tmp_path, monkeypatch, mlflow_server, experiment):
    """The real server behind a proxy that holds every request from the TrainJob's start until 20 s later.

    The trainer (2 real nodes, digits) logs its epochs and exits while MLflow does not answer;
    what it queued and the step's final metrics, report and status reach the server once it answers.
    """
    from kfp_trainer.backends import select_backend
    from tests.tcp_proxy import TcpProxy

    host, port = mlflow_server.url.removeprefix("http://").split(":")
    proxy = TcpProxy(host, int(port))
    monkeypatch.setenv("MLFLOW_TRACKING_URI", proxy.url)
    monkeypatch.setenv("KFP_TRAINER_LOCAL_ROOT", str(tmp_path / "trainjobs"))

    def hang_when_the_trainjob_starts() -> None:
        deadline = time.monotonic() + 120
        while not list((tmp_path / "trainjobs").rglob("trainjob.json")) and time.monotonic() < deadline:
            time.sleep(0.05)
        proxy.hang()
        time.sleep(20)  # past the trainer's end, and past its 10 s request timeout: it sees the server not answering
        proxy.answer()

    watcher = threading.Thread(target=hang_when_the_trainjob_starts, daemon=True)
    watcher.start()
    data = tmp_path / "digits"
    digits.prepare(data)
    try:
        outcome, log = run_step(
            tmp_path / "step", select_backend("local"), runtime="torch-distributed", num_nodes=2, num_proc_per_node="1",
            command=["torchrun", "-m", "kfp_trainer.trainers.digits", "train"],
            args=["--dataset-dir", str(data), "--output-dir", str(tmp_path / "out"), "--epochs", "3", "--hidden", "8"],
        )  # fmt: skip
    finally:
        watcher.join(timeout=120)
        proxy.close()
    assert not isinstance(outcome, Exception), log
    [node_log] = (tmp_path / "trainjobs").rglob("node-0.log")
    said = node_log.read_text()
    assert "MLflow is not answering" in said and "MLflow answers again after" in said, said  # rank 0 said so
    [run] = mlflow_server.runs(experiment)
    assert run["info"]["status"] == "FINISHED" and params_of(run)["epochs"] == "3"
    assert {"val_accuracy", "running_seconds", "preemptions"} <= set(metrics_of(run))
    logged = [m["step"] for m in mlflow_server.metric_history(run["info"]["run_id"], "val_loss")]
    assert sorted(set(logged)) == [1, 2, 3] and logged.count(1) == logged.count(2) == 1  # each epoch once: none lost, none twice
    assert mlflow_server.artifacts(run["info"]["run_id"]) == ["report.html"]


def test_an_unreachable_server_is_one_warning_and_the_step_goes_on(tmp_path, monkeypatch):
    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://127.0.0.1:9")  # nothing listens there
    fake = succeeding()
    outcome, log = run_step(tmp_path, fake)
    assert outcome.succeeded, log
    warnings = [line for line in log.splitlines() if "MLflow" in line]
    assert len(warnings) == 1 and "tracking is off" in warnings[0] and "the training goes on" in warnings[0]
    assert not any(e["name"] == "MLFLOW_RUN_ID" for e in fake.submitted[0]["spec"].get("trainer", {}).get("env", []))


def test_without_a_server_nothing_is_tracked_or_said(tmp_path, monkeypatch):
    for key in [k for k in os.environ if k.startswith("MLFLOW_")]:
        monkeypatch.delenv(key)
    fake = succeeding()
    outcome, log = run_step(tmp_path, fake)
    assert outcome.succeeded and "MLflow" not in log and "env" not in fake.submitted[0]["spec"].get("trainer", {})


# --------------------------------------------------------------------------- KFP's plugin, credentials


def kfp_plugin_runs(server: Any, experiment: str) -> tuple[str, str, str]:
    """What KFP 2.17 makes before a task starts: the pipeline run's MLflow run, and the task's nested run."""
    client = server.client()
    experiment_id = client.experiment_id(experiment)
    parent = client.create_run(experiment_id, name="llm-finetune-run", tags={
        "kfp.pipeline_run_id": "kfp-run-42", "kfp.pipeline_run_url": "https://kfp.example.com/#/runs/details/kfp-run-42"})
    nested = client.create_run(experiment_id, name="train-job", tags={"mlflow.parentRunId": parent["run_id"]})
    return experiment_id, parent["run_id"], nested["run_id"]


@pytest.mark.slow
def test_kfp_plugin_variables_are_honoured_and_credentials_stay_secret_references(tmp_path, monkeypatch, mlflow_server):
    experiment = f"kfp-{uuid.uuid4().hex[:8]}"
    experiment_id, parent, nested = kfp_plugin_runs(mlflow_server, experiment)
    password = "Pw-" + uuid.uuid4().hex  # what the kubelet would resolve from the Secret into the step's env
    for key in [k for k in os.environ if k.startswith("MLFLOW_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("MLFLOW_TRACKING_USERNAME", "pipeline-runner")
    monkeypatch.setenv("MLFLOW_TRACKING_PASSWORD", password)
    monkeypatch.setenv("KFP_TRAINER_LOCAL_ROOT", str(tmp_path / "trainjobs"))
    ref = {"secretKeyRef": {"name": "kfp-mlflow-credentials", "key": "password"}}
    task_config = {"env": [  # the driver's injection, as the ENV passthrough hands it to the step
        {"name": "MLFLOW_RUN_ID", "value": nested}, {"name": "MLFLOW_TRACKING_URI", "value": mlflow_server.url},
        {"name": "MLFLOW_EXPERIMENT_ID", "value": experiment_id},
        {"name": "MLFLOW_TRACKING_USERNAME", "valueFrom": {"secretKeyRef": {"name": "kfp-mlflow-credentials", "key": "username"}}},
        {"name": "MLFLOW_TRACKING_PASSWORD", "valueFrom": ref},
    ]}  # fmt: skip
    data = tmp_path / "digits"
    digits.prepare(data)
    from kfp_trainer.backends import select_backend

    outcome, log = run_step(
        tmp_path / "step", select_backend("local"), task_config=task_config, runtime="torch-distributed",
        command=["torchrun", "-m", "kfp_trainer.trainers.digits", "train"],
        args=["--dataset-dir", str(data), "--output-dir", str(tmp_path / "out"), "--epochs", "2", "--hidden", "8"],
        num_proc_per_node="1",
    )  # fmt: skip
    assert not isinstance(outcome, Exception), log
    assert f"logging into the task's run {nested}" in log
    runs = {r["info"]["run_id"]: r for r in mlflow_server.runs(experiment)}
    assert set(runs) == {parent, nested}  # no run of its own
    run = runs[nested]
    assert run["info"]["status"] == "FINISHED" and params_of(run)["epochs"] == "2"
    assert tags_of(run)["kfp_trainer.trainer"] == "kfp_trainer.trainers.digits" and "val_accuracy" in metrics_of(run)
    # the TrainJob the local backend ran: the credentials by reference, never their value
    [manifest_file] = (tmp_path / "trainjobs").rglob("trainjob.json")
    manifest = json.loads(manifest_file.read_text())
    env = {e["name"]: e for e in manifest["spec"]["trainer"]["env"]}
    assert env["MLFLOW_TRACKING_PASSWORD"] == {"name": "MLFLOW_TRACKING_PASSWORD", "valueFrom": ref}
    assert env["MLFLOW_RUN_ID"]["value"] == nested
    assert_nowhere(password, [tmp_path, Path(mlflow_server.root) / "artifacts"], log, json.dumps(runs))


def assert_nowhere(secret: str, folders: list[Path], *texts: str) -> None:
    """``secret`` is in no file under ``folders`` and in none of ``texts``."""
    assert all(secret not in text for text in texts)
    for folder in folders:
        for path in folder.rglob("*"):
            if path.is_file() and not path.is_symlink():
                assert secret.encode() not in path.read_bytes(), f"the credential is in {path}"
