"""The ``labels`` input labels the TrainJob itself (``kubectl get trainjobs -l team=a`` finds it), and its JobSet."""

import pytest

from kfp_trainer import spec
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.spec import LABEL_DIGEST, LABEL_MANAGED_BY, LABEL_RUN, LABEL_TASK, PRIORITY_LABEL, QUEUE_LABEL


def _job(api_version: str, **inputs) -> dict:
    return spec.build_trainjob(api_version=api_version, run_id="run-1", task_name="train", **inputs)


@pytest.mark.parametrize("api_version", ["v2.1", "v2.2"])
def test_labels_reach_the_trainjobs_metadata_beside_the_lineage(api_version):
    labels = _job(api_version, labels={"team": "a", "example.com/cost-center": "ml"})["metadata"]["labels"]
    assert labels["team"] == "a" and labels["example.com/cost-center"] == "ml"
    assert labels[LABEL_MANAGED_BY] == "kfp-trainer" and labels[LABEL_RUN] == "run-1" and labels[LABEL_TASK] == "train"
    assert LABEL_DIGEST in labels


def test_they_still_label_the_jobset_the_way_each_trainer_api_allows():
    v21 = _job("v2.1", labels={"team": "a"})
    assert v21["spec"]["labels"]["team"] == "a"  # v2.1: spec.labels, for the JobSet and its Jobs
    v22 = _job("v2.2", labels={"team": "a"})
    assert "labels" not in v22["spec"]  # v2.2 dropped spec.labels: the JobSet's through runtimePatches
    [patch] = v22["spec"]["runtimePatches"]
    assert patch["trainingRuntimeSpec"]["template"]["metadata"]["labels"]["team"] == "a"


@pytest.mark.parametrize("api_version", ["v2.1", "v2.2"])
def test_pod_labels_stay_off_the_trainjob(api_version):
    assert "pod" not in _job(api_version, pod_labels={"pod": "x"})["metadata"]["labels"]


def test_the_queue_and_priority_inputs_win_over_the_same_keys_in_labels():
    labels = _job("v2.2", labels={QUEUE_LABEL: "other", "team": "a"}, queue_name="team-a", priority_class="high")["metadata"]["labels"]
    assert (labels[QUEUE_LABEL], labels[PRIORITY_LABEL], labels["team"]) == ("team-a", "high", "a")


def test_a_label_cannot_take_over_the_launchers_lineage():
    with pytest.raises(InvalidSpecErrors, match="lineage"):
        _job("v2.2", labels={LABEL_RUN: "someone-elses-run"})
