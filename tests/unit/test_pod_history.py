"""What the step says about the trainer's pods while the job runs: a pod replaced (deleted, evicted,
failed) or a container restarted, each told once; a suspension's ends never told as replacements.
And which pending pods wait on a node, and how a node that is not ready reads."""

from __future__ import annotations

from kfp_trainer.backends.kube.inspect import PodHistory, not_ready, pending_on_nodes


def pod(uid: str, index: int = 0, job: str = "node", *, created: str = "2026-12-07T10:00:00Z", deleting: bool = False, **status) -> dict:
    labels = {"jobset.sigs.k8s.io/replicatedjob-name": job, "jobset.sigs.k8s.io/job-index": "0",
              "batch.kubernetes.io/job-completion-index": str(index)}  # fmt: skip
    meta = {"uid": uid, "name": f"tj-{job}-0-{index}-{uid}", "labels": labels, "creationTimestamp": created}
    if deleting:
        meta["deletionTimestamp"] = "2026-12-07T10:05:00Z"
    return {"metadata": meta, "spec": {"nodeName": status.pop("node", "")}, "status": {"phase": "Running", **status}}


def test_a_pod_deleted_and_replaced_is_told_once_with_the_reason_its_deletion_carried():
    history = PodHistory()
    assert history.notes([pod("a"), pod("b", 1)]) == []
    evicting = pod("a", deleting=True, conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                                                    "message": "Eviction API: evicting"}])  # fmt: skip
    assert history.notes([evicting, pod("b", 1)]) == []  # terminating, not replaced yet: nothing to say
    new = pod("c", created="2026-12-07T10:05:01Z", phase="Pending")
    [note] = history.notes([evicting, new, pod("b", 1)])
    assert note.startswith("node-0: pod tj-node-0-0-a ended before its job (EvictionByEvictionAPI: Eviction API: evicting); ")
    assert "pod tj-node-0-0-c takes its place, the 2nd pod of node-0" in note
    assert history.notes([new, pod("b", 1)]) == []  # told once, also once the old pod is gone


def test_a_pod_gone_between_two_looks_reads_deleted_and_a_third_pod_counts_as_the_third():
    history = PodHistory()
    history.notes([pod("a")])
    [first] = history.notes([pod("b", created="2026-12-07T10:01:00Z")])
    assert "pod tj-node-0-0-a ended before its job (deleted); pod tj-node-0-0-b takes its place, the 2nd pod" in first
    [second] = history.notes([pod("c", created="2026-12-07T10:02:00Z", phase="Pending")])
    assert "tj-node-0-0-b ended before its job (deleted)" in second and "the 3rd pod of node-0" in second


def test_a_pod_failed_by_the_kubelet_or_its_container_says_why():
    history = PodHistory()
    history.notes([pod("a"), pod("x", 1)])
    evicted = pod("a", phase="Failed", reason="Evicted", message="The node was low on resource: memory.")
    oom = {"name": "node", "state": {"terminated": {"exitCode": 137, "reason": "OOMKilled"}}}
    crashed = pod("x", 1, phase="Failed", containerStatuses=[oom])
    notes = history.notes([evicted, crashed, pod("b", created="2026-12-07T10:01:00Z"), pod("y", 1, created="2026-12-07T10:01:00Z")])
    assert [n.split(";")[0] for n in notes] == [
        "node-0: pod tj-node-0-0-a ended before its job (Evicted: The node was low on resource: memory.)",
        "node-1: pod tj-node-0-1-x ended before its job (container node exit 137 (OOMKilled))",
    ]


def test_pods_ended_by_a_suspension_are_not_told_as_replaced_when_the_job_is_admitted_again():
    history = PodHistory()
    history.notes([pod("a"), pod("b", 1)])
    history.forget([pod("a", deleting=True), pod("b", 1, deleting=True)])  # Kueue preempted the job
    assert history.notes([pod("c", created="2026-12-07T10:09:00Z"), pod("d", 1, created="2026-12-07T10:09:00Z")]) == []


def test_pods_seen_for_the_first_time_together_are_the_job_as_found_not_a_replacement():
    history = PodHistory()  # a retry adopting a job whose pod was replaced before it looked
    assert history.notes([pod("a", phase="Failed", reason="Evicted"), pod("b", created="2026-12-07T10:01:00Z")]) == []


def test_a_container_restart_is_told_with_its_last_exit_once_per_restart():
    history = PodHistory()
    history.notes([pod("a", containerStatuses=[{"name": "node", "restartCount": 0}])])
    again = {"name": "node", "restartCount": 1, "lastState": {"terminated": {"exitCode": 1, "reason": "Error"}}}
    restarted = pod("a", containerStatuses=[again])
    assert history.notes([restarted]) == ["node-0: pod tj-node-0-0-a restarted its container (node exit 1 (Error)), restart 1"]
    assert history.notes([restarted]) == []


def test_other_replicated_jobs_and_job_indices_are_places_of_their_own():
    history = PodHistory()
    init = pod("i", job="dataset-initializer")
    history.notes([init, pod("a")])
    [note] = history.notes([pod("j", job="dataset-initializer", created="2026-12-07T10:01:00Z"), pod("a")])
    assert note.startswith("dataset-initializer-0: pod tj-dataset-initializer-0-0-i ended before its job")


def test_pending_pods_bound_to_a_node_are_checked_once_per_node():
    pods = [pod("a", node="n1", phase="Pending"), pod("b", 1, node="n1", phase="Pending"), pod("c", 2, node="n2", phase="Running"),
            pod("d", 3, phase="Pending"), pod("e", 4, node="n3", phase="Pending", deleting=True)]  # fmt: skip
    assert pending_on_nodes(pods) == [("tj-node-0-0-a", "n1")]


def test_a_node_not_ready_reads_its_reason_message_and_since_when():
    ready = {"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "container runtime is down",
             "lastTransitionTime": "2026-12-07T10:00:00Z"}  # fmt: skip
    down = {"status": {"conditions": [{"type": "MemoryPressure", "status": "False"}, ready]}}
    assert not_ready(down) == "KubeletNotReady: container runtime is down (since 2026-12-07T10:00:00Z)"
    assert not_ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}}) == ""
    assert not_ready({"status": {}}) == "it reports no Ready condition"


class NodeApi:
    """``request`` of an API client whose node reads answer ``answer`` (an object, or an APIError raised)."""

    def __init__(self, answer) -> None:
        self.answer = answer
        self.calls: list[str] = []

    def request(self, method, path, **kw):
        self.calls.append(f"{method} {path}")
        if isinstance(self.answer, Exception):
            raise self.answer
        return self.answer


def test_a_launcher_not_allowed_to_read_nodes_asks_once_and_says_nothing_of_them():
    from kfp_trainer.backends.kube.apierrors import APIError
    from kfp_trainer.backends.kube.inspect import JobTracker
    from kfp_trainer.jobstatus import JobRef

    api = NodeApi(APIError(403, reason="Forbidden", message='nodes "n1" is forbidden: User cannot get resource "nodes"'))
    tracker = JobTracker(api, JobRef("ns", "tj", "u"))
    assert tracker.node_not_ready("n1") == "" and tracker.node_not_ready("n2") == ""
    assert api.calls == ["GET /api/v1/nodes/n1"]  # refused once: never asked again
    down = {"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "PLEG is not healthy"}]}}
    assert JobTracker(NodeApi(down), JobRef("ns", "tj", "u")).node_not_ready("n1") == "KubeletNotReady: PLEG is not healthy"


def test_a_pod_evicted_and_gone_between_two_looks_reads_why_from_its_final_state():
    history = PodHistory()
    history.notes([pod("a")])
    final = pod("a", deleting=True, conditions=[{"type": "DisruptionTarget", "status": "True", "reason": "EvictionByEvictionAPI",
                                                 "message": "Eviction API: evicting"}])  # fmt: skip
    [note] = history.notes([pod("b", created="2026-12-07T10:01:00Z")], gone=[final, pod("z", 3)])  # z: never seen, ignored
    assert "pod tj-node-0-0-a ended before its job (EvictionByEvictionAPI: Eviction API: evicting)" in note


def test_the_pod_watch_keeps_the_final_state_of_what_it_saw_deleted():
    from kfp_trainer.backends.kube.cache import GONE_KEPT, ObjectCache

    cache = ObjectCache(None, "/pods", [], keep=lambda p: p["metadata"]["uid"] != "other")
    cache._apply(("LIST", {"items": [pod("a"), pod("other")]}))
    final = pod("a", deleting=True, phase="Failed")
    cache._apply(("DELETED", final))
    cache._apply(("DELETED", pod("other")))
    assert cache.objects() == []
    assert cache.gone() == [final]
    for i in range(GONE_KEPT + 5):
        cache._apply(("DELETED", pod(f"x{i}")))
    assert len(cache.gone()) == GONE_KEPT and cache.gone()[-1]["metadata"]["uid"] == f"x{GONE_KEPT + 4}"


def test_a_node_is_read_again_only_after_the_recheck_interval():
    from kfp_trainer.backends.kube.inspect import NODE_RECHECK, JobTracker
    from kfp_trainer.jobstatus import JobRef

    now = [100.0]
    api = NodeApi({"status": {"conditions": [{"type": "Ready", "status": "False", "reason": "KubeletNotReady", "message": "down"}]}})
    tracker = JobTracker(api, JobRef("ns", "tj", "u"), clock=lambda: now[0])
    assert tracker.node_not_ready("n1") == tracker.node_not_ready("n1") == "KubeletNotReady: down"
    assert api.calls == ["GET /api/v1/nodes/n1"]  # a blocker check every 2 s asks the server once in NODE_RECHECK
    api.answer = {"status": {"conditions": [{"type": "Ready", "status": "True"}]}}
    now[0] += NODE_RECHECK
    assert tracker.node_not_ready("n1") == "" and len(api.calls) == 2  # back: seen at the next read
