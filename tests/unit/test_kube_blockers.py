"""Cannot-start blockers from the job's events and pods (event streams as constants)."""

from __future__ import annotations

import threading

from kfp_trainer.backends.base import JobRef
from kfp_trainer.backends.kube.inspect import belongs, blockers, pod_blockers

REF = JobRef("ns", "train-abc", "uid-1")
CREATED = "2026-05-01T10:00:00Z"


def event(kind, name, reason, message, when="2026-05-01T10:00:05Z", uid=None):
    return {
        "type": "Warning",
        "reason": reason,
        "message": message,
        "lastTimestamp": when,
        "involvedObject": {"kind": kind, "name": name, **({"uid": uid} if uid else {})},
        "metadata": {"name": f"{name}.{reason}", "uid": f"{name}-{reason}-{when}"},
    }


class Cache:
    def __init__(self, objects):
        self._objects = list(objects)
        self.synced = threading.Event()
        self.synced.set()

    def objects(self):
        return list(self._objects)


class Tracker:
    def __init__(self, events=(), pods=()):
        self.ref = REF
        self._events, self._pods = Cache(events), Cache(pods)

    def events(self):
        return self._events

    def pods(self):
        return self._pods


def test_pods_refused_by_admission_are_a_fatal_blocker_with_the_admission_message():
    refused = event(
        "Job", "train-abc-node-0", "FailedCreate", 'Error creating: pods "train-abc-node-0-0-x" is forbidden: exceeded quota: gpu'
    )
    found = blockers(Tracker([refused]))
    assert [(b.reason, b.fatal) for b in found] == [("FailedCreate", True)]
    assert "Job ns/train-abc-node-0" in found[0].message and "exceeded quota: gpu" in found[0].message


def test_jobset_and_trainjob_failures_to_create_are_fatal_blockers():
    found = blockers(
        Tracker(
            [
                event("JobSet", "train-abc", "JobCreationFailed", "jobs.batch is forbidden"),
                event("TrainJob", "train-abc", "TrainJobResourcesCreationFailed", "runtime missing", uid="uid-1"),
            ]
        )
    )
    assert sorted(b.reason for b in found) == ["JobCreationFailed", "TrainJobResourcesCreationFailed"]
    assert all(b.fatal for b in found)


def test_events_of_other_jobs_and_of_an_earlier_job_with_the_same_name_are_ignored():
    ref = REF
    assert not belongs(event("Job", "train-abcd-node-0", "FailedCreate", "x"), ref, CREATED)  # another job's name prefix
    assert not belongs(event("Job", "train-abc-node-0", "FailedCreate", "x", when="2026-05-01T09:59:00Z"), ref, CREATED)
    assert not belongs(event("TrainJob", "train-abc", "TrainJobResourcesCreationFailed", "x", uid="uid-0"), ref, CREATED)
    assert not belongs(event("ConfigMap", "train-abc", "FailedCreate", "x"), ref, CREATED)
    assert belongs(event("Pod", "train-abc-node-0-0-xyz12", "FailedMount", "x"), ref, CREATED)
    # A reason on the wrong kind is no cannot-start blocker.
    assert blockers(Tracker([event("Pod", "train-abc-node-0-0-xyz12", "FailedCreate", "x")])) == []


def test_unschedulable_and_image_problems_of_pending_pods():
    pending = {
        "metadata": {"name": "train-abc-node-0-0-q"},
        "status": {
            "phase": "Pending",
            "conditions": [{"type": "PodScheduled", "status": "False", "reason": "Unschedulable", "message": "0/3 nodes are available"}],
            "containerStatuses": [{"name": "node", "state": {"waiting": {"reason": "InvalidImageName", "message": "bad ref"}}}],
        },
    }
    found = {b.reason: b for b in pod_blockers(pending)}
    assert not found["Unschedulable"].fatal and "0/3 nodes are available" in found["Unschedulable"].message
    assert found["InvalidImageName"].fatal
    assert pod_blockers({**pending, "status": {**pending["status"], "phase": "Running"}}) == []


def test_the_same_reason_is_reported_once():
    many = [event("Job", "train-abc-node-0", "FailedCreate", f"try {i}", when=f"2026-05-01T10:00:0{i}Z") for i in range(5)]
    assert len(blockers(Tracker(many))) == 1
