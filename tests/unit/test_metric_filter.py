"""The metrics a step keeps: ``metric_names`` / ``--metrics`` (names and ``re:`` patterns), from every source."""

from __future__ import annotations

import json
import tempfile
from pathlib import Path
from typing import Any

import pytest
from kfp import compiler, dsl

from kfp_trainer import cli, steps
from kfp_trainer.components import train_job
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.jobstatus import JobStatus, Phase
from kfp_trainer.launcher import LaunchOptions
from kfp_trainer.metrics import MetricFilter, MetricPoint, MetricSeries, from_trainer_status
from kfp_trainer.spec import check_launch_options
from kfp_trainer.steps.checks import check_train_job
from tests.fakes import FakeBackend

C10D = "[W1207 04:18:16.154876372 socket.cpp:207] [c10d] The hostname of the client socket cannot be retrieved. err=-3"
LINES = [
    C10D,
    json.dumps({"step": 1, "loss": 2.0, "accuracy": 0.5, "eval_loss": 2.2}),
    "INFO:__main__:step=2 loss=1.5 accuracy=0.6 eval_acc=0.7",  # the trainer's own logging: a log line
    json.dumps({"step": 3, "loss": 1.0, "accuracy": 0.8, "eval_loss": 1.9}),
]
STATUS = {"trainerStatus": {"metrics": [{"name": "eval_loss", "value": "1.8"}, {"name": "throughput", "value": "120"}]}}


def kept(keep: str) -> list[tuple[str, float]]:
    series = MetricSeries(keep=keep)
    series.feed_text("\n".join(LINES))
    series.extend(from_trainer_status(STATUS))
    return [(p.name, p.value) for p in series.points]


def test_the_default_keeps_every_metric_of_lines_that_are_not_log_lines_and_of_the_status():
    assert kept("") == [
        ("loss", 2.0), ("accuracy", 0.5), ("eval_loss", 2.2), ("loss", 1.0), ("accuracy", 0.8), ("eval_loss", 1.9),
        ("eval_loss", 1.8), ("throughput", 120.0),
    ]  # fmt: skip


def test_names_keep_those_metrics_and_read_them_from_log_lines_too():
    assert kept("loss") == [("loss", 2.0), ("loss", 1.5), ("loss", 1.0)]
    assert kept(" loss , throughput ,") == [("loss", 2.0), ("loss", 1.5), ("loss", 1.0), ("throughput", 120.0)]
    # a log line's pairs are read for the names listed only: naming err is asking for the c10d warning's
    assert kept("err") == [("err", -3.0)]
    assert kept("eval_acc,eval_loss") == [("eval_loss", 2.2), ("eval_acc", 0.7), ("eval_loss", 1.9), ("eval_loss", 1.8)]


def test_a_pattern_keeps_the_metrics_whose_whole_name_it_matches_but_not_from_log_lines():
    assert kept("re:eval_.*") == [("eval_loss", 2.2), ("eval_loss", 1.9), ("eval_loss", 1.8)]  # not eval_acc: a log line's
    assert kept("re:loss") == [("loss", 2.0), ("loss", 1.0)]  # the whole name: not eval_loss
    assert kept("re:(eval_)?loss") == [("loss", 2.0), ("eval_loss", 2.2), ("loss", 1.0), ("eval_loss", 1.9), ("eval_loss", 1.8)]


def test_names_and_patterns_together():
    assert kept("accuracy, re:eval_.*") == [
        ("accuracy", 0.5), ("eval_loss", 2.2), ("accuracy", 0.6), ("accuracy", 0.8), ("eval_loss", 1.9), ("eval_loss", 1.8),
    ]  # fmt: skip


def test_the_filter_applies_to_every_way_in():
    series = MetricSeries([MetricPoint("loss", 3.0), MetricPoint("lr", 0.1)], keep="loss")
    assert series.feed('{"loss": 2.0, "lr": 0.01}') == 1
    series.extend([MetricPoint("loss", 1.0), MetricPoint("grad_norm", 2.0)])
    assert [(p.name, p.value) for p in series.points] == [("loss", 3.0), ("loss", 2.0), ("loss", 1.0)]
    assert series.final() == {"loss": 1.0} and series.names() == ["loss"]


def test_syntax():
    keep = MetricFilter(r"re:x{1,3}, re:a\,b|c[,], val/acc")
    assert keep.names == {"val/acc"} and [p.pattern for p in keep.patterns] == ["x{1,3}", r"a\,b|c[,]"]
    assert keep("xxx") and keep("a,b") and keep("c,") and keep("val/acc") and not keep("xxxx") and not keep("val")
    assert MetricFilter("").everything and MetricFilter(None).everything and MetricFilter(" , ").everything
    assert not MetricFilter("loss").everything


@pytest.mark.parametrize("text", ["re:(", "loss,re:[a-", "re:*x", "re:", "re:  "])
def test_a_bad_pattern_is_an_error_that_names_the_option(text):
    with pytest.raises(ValueError, match="re:"):
        MetricFilter(text)
    with pytest.raises(InvalidSpecErrors) as info:
        check_launch_options(metric_names=text)
    assert [e.field for e in info.value.errors] == ["metric_names"]
    assert "re:REGEX" in str(info.value)
    with pytest.raises(InvalidSpecErrors):
        LaunchOptions(metric_names=text)  # the Python API: refused when made, before any job exists


def test_a_value_that_is_not_text_is_refused_and_none_is_every_metric():
    with pytest.raises(InvalidSpecErrors, match="metric_names"):
        check_launch_options(metric_names=3)
    check_launch_options(metric_names=None)


# ------------------------------------------------------------------ the step, the component, the command line


def test_the_step_options_reach_the_launch_options():
    options = steps.StepOptions.of({"metric_names": "loss,re:eval_.*", "metrics": object(), "backend": "local"})
    assert options.metric_names == "loss,re:eval_.*"  # not the metrics artifact
    assert steps.train_job.launch_options(options, "").metric_names == "loss,re:eval_.*"
    with pytest.raises(InvalidSpecErrors, match="metric_names"):
        steps.train_job.launch_options(steps.StepOptions.of({"metric_names": "re:("}), "")


def test_metric_names_is_a_launch_option_of_train_job_not_a_trainjob_input():
    assert "metric_names" in steps.arguments.LAUNCH_OPTIONS
    assert "metric_names" not in steps.train_job_inputs({"runtime": "torch-distributed", "metric_names": "loss"})
    assert train_job.component_spec.inputs["metric_names"].default == ""
    with pytest.raises(InvalidSpecErrors) as info:
        check_train_job({"runtime": "torch-distributed", "metric_names": "re:(", "run_id": "r", "task_name": "t"})
    assert [e.field for e in info.value.errors] == ["metric_names"]


def test_a_bad_pattern_is_refused_while_the_pipeline_is_built():
    def build() -> None:
        @dsl.pipeline(name="p")
        def p():
            train_job(metric_names="re:eval_(")

        with tempfile.TemporaryDirectory() as tmp:
            compiler.Compiler().compile(p, str(Path(tmp) / "p.yaml"))

    with pytest.raises(InvalidSpecErrors, match="metric_names"):
        build()


class _Cluster(FakeBackend):
    def __init__(self) -> None:
        done = JobStatus(Phase.SUCCEEDED, reason="AllJobsCompleted", raw={"jobsStatus": [{"name": "node", "succeeded": 1}], **STATUS})
        super().__init__([JobStatus(Phase.RUNNING), done], namespace="team-a", lines=LINES, hold_logs=False)


def artifact(cls: type, path: Path) -> Any:
    a = cls(uri=str(path), name=path.name, metadata={})
    a.path = str(path)
    return a


def run_component(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, **values: Any) -> tuple[Any, _Cluster]:
    fake = _Cluster()
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: fake)
    metrics = artifact(dsl.Metrics, tmp_path / "metrics")
    train_job.python_func(
        output_model=artifact(dsl.Model, tmp_path / "model"), metrics=metrics, report=artifact(dsl.HTML, tmp_path / "r.html"),
        trainjob=str(tmp_path / "trainjob"), image="trainer:1", command=["python", "train.py"], run_id="r1", task_name="train",
        backend="kubernetes", task_config=dsl.TaskConfig(), **values,
    )  # fmt: skip
    return metrics, fake


def test_the_component_keeps_the_metrics_it_names(tmp_path, monkeypatch):
    metrics, _ = run_component(tmp_path, monkeypatch, metric_names="loss,re:eval_.*")
    # final values, and best_<name> where the best differs (loss fell to its last value; eval_loss too)
    assert {k: v for k, v in metrics.metadata.items() if not k.endswith("_seconds")} == {"loss": 1.0, "eval_loss": 1.8}


def test_the_component_by_default_leaves_out_the_c10d_warnings_err(tmp_path, monkeypatch):
    metrics, _ = run_component(tmp_path, monkeypatch)
    assert "err" not in metrics.metadata and "best_err" not in metrics.metadata
    assert metrics.metadata["loss"] == 1.0 and metrics.metadata["throughput"] == 120.0


def test_the_component_refuses_a_bad_pattern_before_submitting(tmp_path, monkeypatch, capsys):
    with pytest.raises(SystemExit) as err:
        run_component(tmp_path, monkeypatch, metric_names="re:eval_(")
    assert err.value.code == 2 and "metric_names" in capsys.readouterr().err


def test_the_command_line_takes_metrics(monkeypatch, capsys):
    from kfp_trainer.backends import kubernetes

    made: list[_Cluster] = []
    monkeypatch.setattr(kubernetes.KubernetesBackend, "from_config", classmethod(lambda cls, *a, **kw: made.append(_Cluster()) or made[-1]))
    launch = ["launch", "--run-id", "r1", "--task-name", "train", "--logs", "0", "--image", "trainer:1"]
    for flag in ("--metrics", "--metric-names"):
        assert cli.main([*launch, flag, "loss, re:eval_.*"]) == 0
        summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
        assert summary["metrics"] == {"loss": 1.0, "eval_loss": 1.8}
    assert cli.main(launch) == 0
    assert json.loads(capsys.readouterr().out.strip().splitlines()[-1])["metrics"] == {
        "loss": 1.0, "accuracy": 0.8, "eval_loss": 1.8, "throughput": 120.0,
    }  # fmt: skip
    made.clear()
    assert cli.main([*launch, "--metrics", "re:("]) == 2
    assert "metric_names" in capsys.readouterr().err
    assert made == []  # refused before a connection
