"""The rules ``kfp-trainer gc`` applies, on stored TrainJobs as constants (launcher and run lookups faked)."""

from __future__ import annotations

import pytest

from kfp_trainer.backends import owner
from kfp_trainer.errors import ValidationError
from kfp_trainer.gc import Collector, format_age, parse_age, table

NOW = 1_800_000_000.0  # 2027-01-15T08:00:00Z
POD = {"pod": "kubeflow/run-1-train-abc", "uid": "u1"}


def job(state: str | None = None, *, launcher=POD, run="run-1", created="2027-01-15T07:00:00Z", deleting=False) -> dict:
    meta = {
        "name": "train-x",
        "namespace": "team",
        "uid": "j1",
        "creationTimestamp": created,
        "labels": {
            "app.kubernetes.io/managed-by": "kfp-trainer",
            "kfp-trainer.kubeflow.org/run-id": run,
            "kfp-trainer.kubeflow.org/task": "train",
        },
        "annotations": {"kfp-trainer.kubeflow.org/run-id": run, "kfp-trainer.kubeflow.org/task": "train"},
    }
    if launcher is not None:
        meta["annotations"][owner.ANNOTATION] = owner.encode(launcher)
    if deleting:
        meta["deletionTimestamp"] = "2027-01-15T07:59:00Z"
    conditions = [{"type": state, "status": "True", "reason": "x"}] if state else []
    return {"metadata": meta, "spec": {}, "status": {"conditions": conditions}}


class Fake(Collector):
    def __init__(self, *, alive, workflow=False, older_than=None):
        super().__init__(None, older_than=older_than, now=NOW)
        self.lifecycle.launcher_alive = lambda identity: alive  # type: ignore[method-assign]
        self._workflow = workflow

    def workflow(self, namespace, run_id):
        return self._workflow


def test_an_unfinished_job_whose_launcher_is_gone_is_garbage():
    found = Fake(alive=False).inspect(job())
    assert found.why == ["task gone: launcher pod kubeflow/run-1-train-abc no longer runs"]
    assert (found.run, found.task, found.state, format_age(found.age)) == ("run-1", "train", "Pending", "1h")


@pytest.mark.parametrize("alive", [True, None])
def test_a_live_or_unknowable_launcher_keeps_the_job(alive):
    assert Fake(alive=alive).inspect(job()).why == []


def test_finished_jobs_are_kept_whatever_their_launcher_unless_old():
    assert Fake(alive=False).inspect(job("Complete")).why == []
    assert Fake(alive=False).inspect(job("Failed")).why == []
    old = Fake(alive=True, older_than=parse_age("30m")).inspect(job("Complete"))
    assert old.why == ["older than 30m"]


def test_a_job_without_a_recorded_launcher_is_not_called_orphaned():
    assert Fake(alive=False).inspect(job(launcher=None)).why == []


def test_run_gone_and_run_ended():
    assert Fake(alive=True, workflow=None).inspect(job()).why == ["run gone: no Workflow labelled pipeline/runid=run-1 in kubeflow"]
    ended = {"metadata": {"name": "wf"}, "status": {"phase": "Failed"}}
    assert Fake(alive=True, workflow=ended).inspect(job()).why == ["run ended: Workflow wf is Failed"]
    assert Fake(alive=True, workflow=ended).inspect(job("Complete")).why == []
    running = {"metadata": {"name": "wf"}, "status": {"phase": "Running"}}
    assert Fake(alive=True, workflow=running).inspect(job()).why == []


def test_a_job_already_being_deleted_is_left_to_its_deletion():
    found = Fake(alive=False, older_than=1).inspect(job(deleting=True))
    assert found.state == "Deleting" and found.why == []


@pytest.mark.parametrize(
    ("text", "seconds"), [("90s", 90), ("30m", 1800), ("24h", 86400), ("7d", 604800), ("1h30m", 5400), ("2w", 1209600)]
)
def test_ages(text, seconds):
    assert parse_age(text) == seconds


@pytest.mark.parametrize("text", ["", "24", "h", "1y", "-1h", "1h 30m", "1.5.2h"])
def test_bad_ages_name_the_flag_and_what_is_valid(text):
    with pytest.raises(ValidationError, match="--older-than.*24h"):
        parse_age(text)


def test_the_table_lines_up():
    found = Fake(alive=False).inspect(job())
    lines = table([found]).splitlines()
    assert lines[0].split() == ["NAMESPACE", "NAME", "RUN", "TASK", "AGE", "STATE", "WHY"]
    assert lines[1].index("train-x") == lines[0].index(" NAME ") + 1


@pytest.mark.parametrize(
    ("pod", "alive"),
    [
        ({"metadata": {"uid": "u1"}, "status": {"phase": "Running"}}, True),
        ({"metadata": {"uid": "u1"}, "status": {"phase": "Pending"}}, True),
        ({"metadata": {"uid": "u1"}, "status": {"phase": "Succeeded"}}, False),
        ({"metadata": {"uid": "u1"}, "status": {"phase": "Failed"}}, False),
        ({"metadata": {"uid": "u1", "deletionTimestamp": "2027-01-15T07:00:00Z"}, "status": {"phase": "Running"}}, False),
        ({"metadata": {"uid": "u2"}, "status": {"phase": "Running"}}, False),  # a newer pod with the same name
        (None, False),
    ],
)
def test_a_launcher_pod_runs_until_it_finishes_goes_or_is_replaced(pod, alive):
    assert owner.pod_alive(pod, POD) is alive
