"""Where a step tracks (KFP's MLflow plugin variables, explicit inputs), what its trainers are told, and how credentials travel."""

from __future__ import annotations

import base64
import http.server
import json
import threading

import pytest

from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.spec import TrainJobInputs
from kfp_trainer.spec.env_rules import check_env
from kfp_trainer.tracking import settings
from kfp_trainer.tracking.client import MlflowClient, MlflowError, MlflowUnreachable
from kfp_trainer.tracking.trainer import RunLogger

# What KFP 2.17's driver puts in a task's env (and, through the ENV passthrough, its task_config.env)
# with injectUserEnvVars and basic-auth: literal values, and the credentials as Secret references.
SECRET = "kfp-mlflow-credentials"
KFP_ENV = [
    {"name": "MLFLOW_RUN_ID", "value": "nested-run"},
    {"name": "MLFLOW_TRACKING_URI", "value": "http://mlflow.kubeflow.svc:5000"},
    {"name": "MLFLOW_EXPERIMENT_ID", "value": "7"},
    {"name": "MLFLOW_TRACKING_USERNAME", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "username"}}},
    {"name": "MLFLOW_TRACKING_PASSWORD", "valueFrom": {"secretKeyRef": {"name": SECRET, "key": "password"}}},
]


def test_kfp_plugin_variables_name_the_run_to_log_into():
    target = settings.resolve_target(env=settings.literal_env(KFP_ENV))
    assert (target.uri, target.run_id, target.experiment_id, target.owns_run, target.source) == (
        "http://mlflow.kubeflow.svc:5000", "nested-run", "7", False, "env",
    )


def test_explicit_inputs_win_and_make_the_step_own_its_run():
    env = settings.literal_env(KFP_ENV)
    target = settings.resolve_target(tracking_uri="https://other:443/", experiment=None, env=env)
    assert (target.uri, target.run_id, target.experiment_id, target.owns_run) == ("https://other:443", "", "7", True)
    named = settings.resolve_target(experiment="sweeps", env=env)
    assert (named.uri, named.experiment_name, named.experiment_id, named.run_id) == ("http://mlflow.kubeflow.svc:5000", "sweeps", "", "")


def test_tracking_is_off_without_a_server_and_the_default_experiment_otherwise():
    assert settings.resolve_target(env={"MLFLOW_RUN_ID": "r"}) is None
    target = settings.resolve_target(env={"MLFLOW_TRACKING_URI": "http://m"})
    assert (target.experiment_name, target.owns_run) == (settings.DEFAULT_EXPERIMENT, True)
    assert settings.resolve_target(env={"MLFLOW_TRACKING_URI": "http://m", "MLFLOW_EXPERIMENT_NAME": "e"}).experiment_name == "e"


def test_kubernetes_auth_and_workspace_reach_the_trainer_nodes_and_need_no_secret():
    env = {"MLFLOW_TRACKING_URI": "http://m", "MLFLOW_RUN_ID": "r", "MLFLOW_EXPERIMENT_ID": "1",
           "MLFLOW_WORKSPACE": "team-a", "MLFLOW_TRACKING_AUTH": "kubernetes-namespaced"}  # fmt: skip
    target = settings.resolve_target(env=env)
    items = {e["name"]: e["value"] for e in settings.trainer_env(target, run_id="mine", experiment_id="1")}
    assert items == {"MLFLOW_TRACKING_URI": "http://m", "MLFLOW_RUN_ID": "mine", "MLFLOW_EXPERIMENT_ID": "1",
                     "MLFLOW_WORKSPACE": "team-a", "MLFLOW_TRACKING_AUTH": "kubernetes-namespaced"}  # fmt: skip
    assert settings.credential_notes(target, process_env={}, task_env=[]) == []


def test_a_credential_the_step_has_only_in_its_process_env_is_named_never_copied():
    target = settings.resolve_target(env={"MLFLOW_TRACKING_URI": "http://m"})
    notes = settings.credential_notes(target, process_env={"MLFLOW_TRACKING_TOKEN": "s3cr3t-token"}, task_env=[])
    assert len(notes) == 1 and "MLFLOW_TRACKING_TOKEN" in notes[0] and "s3cr3t-token" not in notes[0]
    assert settings.credential_notes(target, process_env={"MLFLOW_TRACKING_USERNAME": "u", "MLFLOW_TRACKING_PASSWORD": "p"},
                                     task_env=KFP_ENV) == []  # fmt: skip
    assert "s3cr3t-token" not in json.dumps(settings.trainer_env(target, run_id="r", experiment_id="1"))


def test_a_literal_mlflow_credential_in_the_trainjob_env_is_refused_and_a_secret_reference_passes():
    errors = check_env("env", [{"name": "MLFLOW_TRACKING_TOKEN", "value": "dapi0123456789abcdef"},
                               {"name": "MLFLOW_TRACKING_PASSWORD", "value": "hunter2-password"}])  # fmt: skip
    assert [e.field for e in errors] == ["env[0].value", "env[1].value"]
    assert all("dapi0123456789abcdef" not in str(e) and "hunter2-password" not in str(e) for e in errors)
    assert check_env("env", KFP_ENV) == []


def test_the_trainjob_name_does_not_depend_on_where_the_trainer_logs():
    def name_digest(env):
        return TrainJobInputs(run_id="r", task_name="t", env=env).digest()

    plain = name_digest({"EPOCHS": "3"})
    assert name_digest({"EPOCHS": "3", "MLFLOW_RUN_ID": "try-1"}) == name_digest({"EPOCHS": "3", "MLFLOW_RUN_ID": "try-2"}) == plain
    assert name_digest([{"name": "EPOCHS", "value": "3"}, *KFP_ENV]) == name_digest([{"name": "EPOCHS", "value": "3"}])
    assert name_digest([*KFP_ENV]) == name_digest({})
    assert name_digest({"EPOCHS": "4"}) != plain  # what the job runs still counts


def test_bad_tracking_inputs_are_refused_with_what_would_do():
    errors = settings.check_tracking_inputs("https://user:pa55word@mlflow.example.com", "ok")
    assert [e.field for e in errors] == ["mlflow_tracking_uri"] and "pa55word" not in str(errors[0])
    assert "MLFLOW_TRACKING_TOKEN" in errors[0].allowed
    assert [e.field for e in settings.check_tracking_inputs("sqlite:///mlflow.db", None)] == ["mlflow_tracking_uri"]
    assert settings.check_tracking_inputs("http://mlflow:5000", "my experiment") == []
    from kfp_trainer.steps.train_job import check_tracking

    with pytest.raises(InvalidSpecErrors, match="mlflow_tracking_uri"):
        check_tracking("file:./mlruns", None)
    check_tracking("{{$.inputs.parameters['x']}}", None)  # a placeholder KFP did not fill in counts as not given


def test_merge_env_replaces_names_and_keeps_the_rest_in_order():
    merged = settings.merge_env(KFP_ENV, [{"name": "MLFLOW_RUN_ID", "value": "mine"}])
    assert [e["name"] for e in merged] == [e["name"] for e in KFP_ENV[1:]] + ["MLFLOW_RUN_ID"]
    assert merged[-1]["value"] == "mine" and settings.merge_env(None, []) is None


# --------------------------------------------------------------------------- the client on a real HTTP server


class _Recorder(http.server.BaseHTTPRequestHandler):
    seen: list[dict] = []
    status = 200

    def do_GET(self):  # noqa: N802 - http.server's name
        type(self).seen.append({"path": self.path, "headers": {k.lower(): v for k, v in self.headers.items()}})
        body = json.dumps({"experiment": {"experiment_id": "5"}} if self.status == 200 else {"error_code": "X", "message": "no"}).encode()
        self.send_response(self.status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


@pytest.fixture
def recorder():
    _Recorder.seen, _Recorder.status = [], 200
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _Recorder)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()


def test_the_client_authenticates_as_mlflow_does_from_the_environment(recorder):
    MlflowClient(recorder, env={"MLFLOW_TRACKING_TOKEN": "tok-1"}).experiment_id("e")
    basic_env = {"MLFLOW_TRACKING_USERNAME": "ann", "MLFLOW_TRACKING_PASSWORD": "pw", "MLFLOW_WORKSPACE": "team-a"}
    MlflowClient(recorder, env=basic_env).experiment_id("e")
    bearer, basic = (r["headers"] for r in _Recorder.seen)
    assert bearer["authorization"] == "Bearer tok-1" and "x-mlflow-workspace" not in bearer
    assert basic["authorization"] == "Basic " + base64.b64encode(b"ann:pw").decode() and basic["x-mlflow-workspace"] == "team-a"
    assert "tok-1" not in repr(MlflowClient(recorder, env={"MLFLOW_TRACKING_TOKEN": "tok-1"}))


def test_refusals_carry_mlflows_code_and_5xx_is_retried_then_unreachable(recorder):
    _Recorder.status = 403
    with pytest.raises(MlflowError) as refused:
        MlflowClient(recorder, env={"MLFLOW_TRACKING_TOKEN": "tok-2"}, attempts=3).experiment_id("e")
    assert refused.value.status == 403 and "not allowed" in str(refused.value) and "tok-2" not in str(refused.value)
    assert len(_Recorder.seen) == 1  # a refusal is not retried
    _Recorder.status, _Recorder.seen = 503, []
    with pytest.raises(MlflowUnreachable):
        MlflowClient(recorder, env={}, attempts=3, backoff=0.01).experiment_id("e")
    assert len(_Recorder.seen) == 3


def test_the_trainer_logs_from_rank_0_only():
    env = {"MLFLOW_TRACKING_URI": "http://127.0.0.1:9", "MLFLOW_RUN_ID": "r"}
    assert not RunLogger(env={**env, "RANK": "1"}, at_exit=False).enabled
    logger = RunLogger(env={**env, "RANK": "0"}, warn=lambda text: None, at_exit=False)
    assert logger.enabled and logger.log_record({"step": 1, "loss": 1.0}) is True  # queued: nothing listens on port 9, nothing waits
    assert logger.sender.close(0) is False


def test_an_untracked_step_loads_no_rest_client_and_a_tracked_one_no_mlflow_package():
    probe = (
        "import sys, io\n"
        "from kfp_trainer.tracking.step import StepTracking\n"
        "off = StepTracking.open(tracking_uri=None, experiment=None, env=None, identity={}, say=print, process_env={})\n"
        "print(off.enabled, 'kfp_trainer.tracking.client' in sys.modules)\n"
        "on = StepTracking.open(tracking_uri='http://127.0.0.1:9', experiment=None, env=None, identity={}, say=lambda m: None,"
        " process_env={})\n"
        "print(on.enabled, 'kfp_trainer.tracking.client' in sys.modules, any(m.split('.')[0] == 'mlflow' for m in sys.modules))\n"
    )
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", probe], capture_output=True, text=True, check=True).stdout.split()
    assert out == ["False", "False", "False", "True", "False"]


@pytest.mark.parametrize("name", ["train_job", "trl_finetune", "torchtune_finetune"])
def test_every_launcher_component_takes_the_tracking_inputs_and_checks_them_first(name, tmp_path, capsys):
    from kfp import dsl

    from kfp_trainer.components import COMPONENTS

    component = COMPONENTS[name]
    inputs = component.component_spec.inputs
    assert inputs["mlflow_tracking_uri"].default is None and inputs["mlflow_experiment"].default is None

    def out(cls, n):
        a = cls(uri=str(tmp_path / n), name=n, metadata={})
        a.path = str(tmp_path / n)
        return a

    with pytest.raises(SystemExit) as exited:
        component.python_func(
            output_model=out(dsl.Model, "m"), metrics=out(dsl.Metrics, "x"), report=out(dsl.HTML, "r"), trainjob=str(tmp_path / "t"),
            run_id="r", task_name="t", mlflow_tracking_uri="sqlite:///mlflow.db",
            **({} if name == "train_job" else {"dataset_uri": "builtin://datasets/addition", "model_uri": "builtin://models/tiny-char-lm"}),
        )
    assert exited.value.code == 2 and "mlflow_tracking_uri" in capsys.readouterr().err
