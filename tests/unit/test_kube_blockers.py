"""Cannot-start blockers from the job's events and pods (event streams as constants)."""

from __future__ import annotations

import threading

from kfp_trainer.backends.kube.inspect import belongs, blockers, never_fits, pod_blockers
from kfp_trainer.jobstatus import JobRef

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
    def __init__(self, events=(), pods=(), workload_events=None, nodes=None):
        self.ref = REF
        self._events, self._pods = Cache(events), Cache(pods)
        self._workload = None if workload_events is None else Cache(workload_events)
        self.nodes = nodes or {}  # node -> why it is not ready ("" ready)
        self.nodes_read: list[str] = []

    def node_not_ready(self, name):
        self.nodes_read.append(name)
        return self.nodes.get(name, "")

    def watching_queue(self):
        return self._workload is not None

    def workload_events(self):
        return self._workload

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


def pulling(reason, message):
    return {
        "metadata": {"name": "train-abc-node-0-0-q"},
        "status": {
            "phase": "Pending",
            "containerStatuses": [{"name": "node", "state": {"waiting": {"reason": reason, "message": message}}}],
        },
    }


MISSING = (
    'failed to pull and unpack image "reg.example/none:1": failed to resolve reference "reg.example/none:1": '
    'failed to do request: Head "https://reg.example/v2/none/manifests/1": dial tcp: lookup reg.example: no such host'
)


def test_a_pull_of_an_image_that_is_not_there_is_fatal_and_one_blocker_through_the_kubelets_retries():
    # The kubelet alternates ErrImagePull (a pull) and ImagePullBackOff (waiting to retry); both
    # are one blocker, so its time adds up instead of starting over at each switch.
    first = pod_blockers(pulling("ErrImagePull", MISSING))
    retry = pod_blockers(pulling("ImagePullBackOff", f'Back-off pulling image "reg.example/none:1": ErrImagePull: {MISSING}'))
    assert [b.reason for b in first] == [b.reason for b in retry] == ["ErrImagePull"]
    assert first[0].fatal and retry[0].fatal
    assert "no such host" in first[0].message and retry[0].message.startswith("pod train-abc-node-0-0-q container node: ImagePullBackOff: ")
    for missing in (
        "rpc error: code = NotFound desc = failed to pull: not found",
        "manifest unknown",
        "pull access denied, repository does not exist",
    ):
        assert pod_blockers(pulling("ErrImagePull", missing))[0].fatal, missing


def test_a_pull_that_may_work_later_is_waited_out():
    for transient in (
        "dial tcp 10.0.0.1:443: i/o timeout",
        "unexpected status code 503 Service Unavailable",
        "toomanyrequests: rate limit",
    ):
        (blocker,) = pod_blockers(pulling("ErrImagePull", transient))
        assert not blocker.fatal, transient
    assert not pod_blockers(pulling("ImagePullBackOff", 'Back-off pulling image "x"'))[0].fatal


def test_the_diagnosis_names_the_node_and_container_of_a_failed_pod():
    from kfp_trainer.backends.kube.inspect import pod_summary

    def status(name, **state):
        return {"name": name, "image": "i", "ready": False, "restartCount": 1, "state": state}

    crashed = {**status("node", waiting={"reason": "CrashLoopBackOff"}),
               "lastState": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}  # fmt: skip
    pod = {
        "metadata": {"name": "train-abc-node-0-1-x"},
        "spec": {"containers": [], "nodeName": "gpu-7"},
        "status": {"phase": "Running", "containerStatuses": [status("sidecar", running={}), crashed]},
    }
    line, failing = pod_summary(pod)
    assert line == "  train-abc-node-0-1-x: Running on node gpu-7; sidecar: running, restarts 1; node: exit 137 (OOMKilled), restarts 1"
    assert failing == ("train-abc-node-0-1-x", "node", True, "")  # its log: the previous instance's; no end time given
    unscheduled = {"metadata": {"name": "p"}, "spec": {"containers": []}, "status": {"phase": "Pending"}}
    assert pod_summary(unscheduled) == ("  p: Pending; ", None)


def test_the_diagnosis_shows_the_log_of_the_container_that_failed_first():
    from kfp_trainer.backends.kube.inspect import Failure, first_failure

    def ended(pod, at):
        return Failure(pod, "node", False, at)

    # Rank 1 crashed; rank 0 was stopped after it (JobSet's failure policy) and exited non-zero too.
    crashed, stopped = ended("tj-node-0-1-b", "2026-12-06T10:09:45Z"), ended("tj-node-0-0-a", "2026-12-06T10:09:47Z")
    assert first_failure([stopped, crashed]) == crashed
    same_second = [ended("tj-node-0-1-b", "2026-12-06T10:09:45Z"), ended("tj-node-0-0-a", "2026-12-06T10:09:45Z")]
    assert first_failure(same_second).pod == "tj-node-0-0-a"  # then name order
    assert first_failure([ended("tj-node-0-0-a", ""), crashed]) == crashed  # no end time: after those with one
    assert first_failure([]) is None


WORKLOAD = "trainjob-train-abc-1a2b3"
TOO_BIG = (
    "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu in flavor gpu, "
    "previously considered podsets requests (0) + current podset request (16) > maximum capacity (8)"
)
BUSY = "couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu in flavor gpu, 8 more needed"


def pending(message, when):
    e = event("Workload", WORKLOAD, "Pending", message, when=when)
    e["involvedObject"]["namespace"] = "ns"
    return e


def test_a_workload_its_cluster_queue_can_never_admit_is_a_fatal_insufficient_quota_blocker():
    found = blockers(Tracker(workload_events=[pending(BUSY, "2026-05-01T10:00:05Z"), pending(TOO_BIG, "2026-05-01T10:00:06Z")]))
    assert [(b.reason, b.fatal) for b in found] == [("InsufficientQuota", True)]
    assert found[0].message.startswith(f"Workload ns/{WORKLOAD}: {TOO_BIG}") and "can ever admit" in found[0].message


def test_quota_in_use_now_or_an_earlier_reason_is_no_blocker():
    # Busy quota: waiting helps. A never-fits reason followed by a busy one (the queue grew): waiting helps.
    assert blockers(Tracker(workload_events=[pending(BUSY, "2026-05-01T10:00:05Z")])) == []
    assert blockers(Tracker(workload_events=[pending(TOO_BIG, "2026-05-01T10:00:05Z"), pending(BUSY, "2026-05-01T10:00:09Z")])) == []
    # The queue's events are only looked at while the launcher watches them (a queued job).
    assert blockers(Tracker()) == []


def test_never_fits_reads_kueues_reasons():
    assert never_fits(TOO_BIG)
    assert never_fits("couldn't assign flavors to pod set node: resource nvidia.com/gpu unavailable in ClusterQueue")
    assert not never_fits(BUSY) and not never_fits(TOO_BIG + "; " + BUSY.split(": ", 1)[1])


def test_a_pending_pod_on_a_node_that_is_not_ready_names_the_node_and_why_and_is_waited_out():
    bound = {"metadata": {"name": "train-abc-node-0-0-x"}, "spec": {"nodeName": "gpu-1"},
             "status": {"phase": "Pending", "containerStatuses": [{"name": "node", "state": {"waiting": {"reason": "ContainerCreating"}}}]}}
    running = {"metadata": {"name": "train-abc-node-0-1-y"}, "spec": {"nodeName": "gpu-2"}, "status": {"phase": "Running"}}
    tracker = Tracker(pods=[bound, running], nodes={"gpu-1": "NodeStatusUnknown: Kubelet stopped posting node status."})
    [found] = blockers(tracker)
    assert (found.reason, found.fatal) == ("NodeNotReady", False)  # a node can come back: waited out by blocker_grace
    assert found.message == (
        "pod train-abc-node-0-0-x is on node gpu-1, which is not ready: NodeStatusUnknown: Kubelet stopped posting node status."
    )
    assert tracker.nodes_read == ["gpu-1"]  # only where a pending pod waits
    tracker.nodes = {}
    assert blockers(tracker) == []
