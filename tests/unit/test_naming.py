"""Names: RFC 1035, within JobSet's pod-name budget, stable across retries, unique across runs/tasks."""

from __future__ import annotations

import re
import uuid

import pytest

from kfp_trainer import naming
from kfp_trainer.errors import ValidationError

RFC1035 = re.compile(r"^[a-z]([-a-z0-9]*[a-z0-9])?$")


def pod_name(job: str, replicated: str, pod_index: int) -> str:
    return f"{job}-{replicated}-0-{pod_index}-abcde"


def test_budget_keeps_every_derived_pod_name_within_63():
    for jobs in (naming.DEFAULT_REPLICATED_JOBS, [("node", 1)], [("node", 100)], [("a-very-long-replicated-job-name", 1)]):
        budget = naming.max_name_length(jobs)
        name = "x" * budget
        for rj, pods in jobs:
            assert len(pod_name(name, rj, pods - 1)) <= 63
        # one more character breaks at least one pod name
        assert any(len(pod_name(name + "x", rj, pods - 1)) > 63 for rj, pods in jobs)


def test_default_budget_matches_runtimes_with_initializers():
    assert naming.max_name_length() == 33
    assert naming.max_name_length([("node", 4)]) == 48


@pytest.mark.parametrize("task", ["train-job", "Train Job", "9-lives", "ünïcode", "x" * 200, "---", "train-job-2"])
def test_names_are_rfc1035_and_fit(task):
    name = naming.trainjob_name(run_id=str(uuid.uuid4()), task_name=task)
    assert RFC1035.match(name), name
    assert len(name) <= naming.max_name_length()


def test_stable_across_retries():
    a = naming.trainjob_name(run_id="run-1", task_name="train", discriminator="d1")
    b = naming.trainjob_name(run_id="run-1", task_name="train", discriminator="d1")
    assert a == b


def test_unique_across_runs_tasks_and_iterations():
    runs = [str(uuid.UUID(int=i)) for i in range(300)]
    names = {naming.trainjob_name(run_id=r, task_name="train") for r in runs}
    names |= {naming.trainjob_name(run_id="run-1", task_name=f"train-{i}") for i in range(300)}
    names |= {naming.trainjob_name(run_id="run-1", task_name="train", discriminator=f"lr={i}") for i in range(300)}
    assert len(names) == 900


def test_prefix_is_used_and_checked():
    name = naming.trainjob_name(run_id="r", task_name="t", prefix="sweep")
    assert name.startswith("sweep-") and len(name) == len("sweep-") + naming.HASH_LENGTH
    with pytest.raises(ValidationError, match="RFC 1035"):
        naming.trainjob_name(run_id="r", task_name="t", prefix="Sweep")
    with pytest.raises(ValidationError, match="at most 22"):
        naming.trainjob_name(run_id="r", task_name="t", prefix="p" * 23)


def test_smaller_budget_shortens_the_stem_not_the_hash():
    name = naming.trainjob_name(run_id="r", task_name="a-long-task-name-for-training", max_length=20)
    assert len(name) <= 20 and RFC1035.match(name)
    assert name.endswith(naming.digest("r", "a-long-task-name-for-training", ""))


def test_label_values():
    assert naming.label_value("train") == "train"
    assert naming.label_value("Train Job #1") == "Train-Job-1"
    long = naming.label_value("x" * 100)
    assert len(long) <= 63 and re.match(r"^[A-Za-z0-9]([-A-Za-z0-9_.]*[A-Za-z0-9])?$", long)
    assert naming.label_value("x" * 100) != naming.label_value("x" * 101)
    assert naming.label_value("-_-") == ""


def test_check_name():
    assert naming.check_name("my-job", 33) == "my-job"
    with pytest.raises(ValidationError, match="at most 33"):
        naming.check_name("a" * 34, 33)
