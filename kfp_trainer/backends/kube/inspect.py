"""Looking at a TrainJob's insides: why it cannot start, and why it failed.

:class:`JobTracker` keeps the job's pods and the namespace's warning events current with one
watch each (started when first needed, the event watch stopped once the trainer runs), so the
launcher can ask "what keeps it from starting?" every second without a request.

Cannot-start blockers, from events on the TrainJob, its JobSet and its Jobs (the controllers
report there, not on the TrainJob) and from pod states:

* fatal: ``TrainJobResourcesCreationFailed`` (TrainJob), ``JobCreationFailed`` and
  ``HeadlessServiceCreationFailed`` (JobSet), ``FailedCreate`` (Job: pods refused by
  PodSecurity admission, a ResourceQuota, a LimitRange or a webhook) -- the event's message
  says why;
* waited out (``blocker_grace``): unschedulable pods, images that cannot be pulled -- unless
  the pull error says the image is not there (``not found``, ``manifest unknown``, a registry
  name that does not resolve, ...): then waiting cannot help and it is fatal. ``ErrImagePull``
  and ``ImagePullBackOff`` alternate while the kubelet retries; both are one blocker
  (``ErrImagePull``), so its time adds up.

While the job waits suspended in a Kueue queue, :func:`queue_notes` tells what Kueue says
about it: the events of its ``Workload`` (``Pending: couldn't assign flavors ...``,
``QuotaReserved``, ``Admitted``), read with the events permission the launcher already has.

Example:
    >>> tracker = JobTracker(api, JobRef("ns", "train-x", "uid"), created="2026-01-01T00:00:00Z")  # doctest: +SKIP
    >>> blockers(tracker)                                                                           # doctest: +SKIP
    [Blocker(reason='FailedCreate', message='Job ns/train-x-node-0: pods "..." is forbidden: ...', fatal=True)]
"""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, NamedTuple

from ...errors import ForbiddenError, UserError
from ...jobstatus import JobRef
from ...kube_types import Event, Pod
from ..base import Blocker
from .api import RetryPolicy, call
from .cache import ObjectCache, key_of
from .leftovers import JOBSET_LABEL
from .paths import events as events_path
from .paths import node as node_path
from .paths import pod_log, pods, trainjobs

if TYPE_CHECKING:
    from .client import Client as ApiClient

IMAGE_ERRORS = {
    "ErrImagePull": False,
    "ImagePullBackOff": False,
    "InvalidImageName": True,
    "CreateContainerConfigError": False,
    "CreateContainerError": False,
    "ErrImageNeverPull": True,
}
PULL_RETRIED = ("ErrImagePull", "ImagePullBackOff")  # one problem: the kubelet's pull, retried
# A pull error that says the image is not there: the registry answered "no such image", or its
# name does not resolve. Retrying the same reference cannot help.
_IMAGE_MISSING = re.compile(r"not ?found|manifest unknown|name unknown|no such host|does not exist|pull access denied", re.IGNORECASE)
CANNOT_START_EVENTS = {
    "TrainJobResourcesCreationFailed": "TrainJob",
    "JobCreationFailed": "JobSet",
    "HeadlessServiceCreationFailed": "JobSet",
    "FailedCreate": "Job",
}
_JOB_SUFFIX = re.compile(r"^-[a-z0-9]([-a-z0-9]*[a-z0-9])?-\d+$")
_WORKLOAD_HASH = re.compile(r"[0-9a-f]{5}")
_PREEMPTED = re.compile(r"JobUID: (?P<job>[^)\s]+)\) due to (?P<why>[^;]+); preemptor path: (?P<path>[^;]+)")
_UNAVAILABLE = re.compile(r"resource \S+ unavailable in ClusterQueue")
NODE_RECHECK = 5.0  # seconds before a node a pending pod waits on is read again (JobTracker.node_not_ready)
_SHORT_WORKLOAD_PREFIX = 57  # Kueue's ShortWorkloadNames: 63 characters in all, "-" and a 5-character hash included


def _second(stamp: Any) -> str:
    return str(stamp or "")[:19]


def event_time(event: Event) -> str:
    """When an event last happened (RFC 3339), whichever of its time fields is set."""
    meta = event.get("metadata") or {}
    return str(event.get("lastTimestamp") or event.get("eventTime") or meta.get("creationTimestamp") or "")


def belongs(event: Event, ref: JobRef, created: str) -> bool:
    """Whether ``event`` is about this TrainJob or what it owns (not an earlier job of the same name).

    Example:
        >>> ev = {"involvedObject": {"kind": "Job", "name": "tj-node-0"}, "lastTimestamp": "2026-01-01T00:00:05Z"}
        >>> belongs(ev, JobRef("ns", "tj", "u"), "2026-01-01T00:00:00Z"), belongs(ev, JobRef("ns", "tj", "u"), "2026-01-01T00:01:00Z")
        (True, False)
    """
    obj = event.get("involvedObject") or {}
    kind, name = obj.get("kind"), str(obj.get("name") or "")
    if created and _second(event_time(event)) < _second(created):
        return False
    if kind == "TrainJob":
        return name == ref.name and (not ref.uid or not obj.get("uid") or obj.get("uid") == ref.uid)
    if kind == "JobSet":
        return name == ref.name
    if kind == "Job":
        return name.startswith(ref.name) and bool(_JOB_SUFFIX.match(name[len(ref.name) :]))
    if kind == "Pod":
        return name.startswith(ref.name + "-")
    return False


def is_workload_of(workload: str, job: str) -> bool:
    """Whether ``workload`` is the name Kueue gives the Workload of TrainJob ``job``: ``trainjob-<job>-<hash>``.

    Example:
        >>> is_workload_of("trainjob-train-x-1a2b3", "train-x"), is_workload_of("trainjob-train-xy-1a2b3", "train-x")
        (True, False)
    """
    prefix = f"trainjob-{job}"
    for cut in (prefix, prefix[:_SHORT_WORKLOAD_PREFIX]):
        if workload.startswith(cut + "-") and _WORKLOAD_HASH.fullmatch(workload[len(cut) + 1 :]):
            return True
    return False


class JobTracker:
    """The pods and warning events of one TrainJob, each kept by a watch while needed."""

    def __init__(
        self, api: ApiClient, ref: JobRef, *, created: str = "", policy: RetryPolicy = RetryPolicy(), timeout_seconds: int = 300,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:  # fmt: skip
        self.api = api
        self.ref = ref
        self.created = created
        self.policy = policy
        self.timeout_seconds = timeout_seconds
        self._pods: ObjectCache[Pod] | None = None
        self._events: ObjectCache[Event] | None = None
        self._workload_events: ObjectCache[Event] | None = None
        self.queue_said: set[tuple[str, str]] = set()  # (reason, message) of the queue notes already reported
        self.history = PodHistory()
        self.nodes_readable = True  # False once reading a node was refused (no ``get nodes`` right)
        self._nodes: dict[str, tuple[float, str]] = {}  # node -> (when read, why it is not ready)
        self._clock = clock

    def pods(self) -> ObjectCache[Pod]:
        """The job's pods (started on first use)."""
        if self._pods is None:
            self._pods = ObjectCache(
                self.api,
                f"/api/v1/namespaces/{self.ref.namespace}/pods",
                [("labelSelector", f"{JOBSET_LABEL}={self.ref.name}")],
                keep=lambda pod: _second((pod.get("metadata") or {}).get("creationTimestamp")) >= _second(self.created),
                timeout_seconds=self.timeout_seconds,
                policy=self.policy,
                name=f"pods-{self.ref.name}",
            ).start()
        return self._pods

    def watched_pods(self) -> ObjectCache[Pod] | None:
        """The job's pods if they are watched already; None (and no watch started) otherwise."""
        return self._pods

    def events(self) -> ObjectCache[Event]:
        """The warning events about the job (started on first use)."""
        if self._events is None:
            self._events = ObjectCache(
                self.api,
                f"/api/v1/namespaces/{self.ref.namespace}/events",
                [("fieldSelector", "type=Warning")],
                keep=lambda event: belongs(event, self.ref, self.created),
                timeout_seconds=self.timeout_seconds,
                policy=self.policy,
                name=f"events-{self.ref.name}",
            ).start()
        return self._events

    def workload_events(self) -> ObjectCache[Event]:
        """The events of the job's Kueue Workload, any type (started on first use).

        Started again when the job is queued after it ran (preempted, evicted).
        """
        if self._workload_events is None or self._workload_events.closed:
            self._workload_events = ObjectCache(
                self.api,
                f"/api/v1/namespaces/{self.ref.namespace}/events",
                [("fieldSelector", "involvedObject.kind=Workload")],
                keep=lambda event: (
                    is_workload_of(str((event.get("involvedObject") or {}).get("name") or ""), self.ref.name)
                    and _second(event_time(event)) >= _second(self.created)
                ),
                timeout_seconds=self.timeout_seconds,
                policy=self.policy,
                name=f"workload-events-{self.ref.name}",
            ).start()
        return self._workload_events

    def watching_queue(self) -> bool:
        """Whether the Workload's events are watched (the launcher asked for the queue's notes)."""
        return self._workload_events is not None and not self._workload_events.closed

    def suspended(self) -> None:
        """The job was suspended (queued, preempted): its pods end, and none is said to be replaced."""
        if self._pods is not None:
            self.history.forget(self._pods.objects())

    def node_not_ready(self, name: str) -> str:
        """Why node ``name`` is not ready ("" when it is, cannot be read, or reading nodes is not allowed).

        A node is read again at most every :data:`NODE_RECHECK` seconds: a pod that waits minutes
        for its image keeps the blocker checks asking, and the answer is the same most times.
        """
        if not self.nodes_readable:
            return ""
        now = self._clock()
        read_at, why = self._nodes.get(name, (float("-inf"), ""))
        if now - read_at < NODE_RECHECK:
            return why
        try:
            why = not_ready(call(self.api.request, "GET", node_path(name), what=f"read node {name}", policy=self.policy))
        except ForbiddenError:  # reading nodes is an extra right (deploy/rbac.yaml): without it, say nothing
            self.nodes_readable = False
            return ""
        except Exception:  # noqa: BLE001 - a blocker's detail is a courtesy
            why = ""
        self._nodes[name] = (now, why)
        return why

    def started(self) -> None:
        """The trainer runs: blockers and the queue no longer matter, stop watching events."""
        for cache in (self._events, self._workload_events):
            if cache is not None:
                cache.close()

    def close(self) -> None:
        """Stop every watch."""
        for cache in (self._pods, self._events, self._workload_events):
            if cache is not None:
                cache.close()


def blockers(tracker: JobTracker, *, wait: float = 5.0) -> list[Blocker]:
    """What keeps the job from starting now (from the watches; the first call waits for their lists)."""
    pods, events = tracker.pods(), tracker.events()
    pods.synced.wait(wait)
    events.synced.wait(wait)
    found: list[Blocker] = []
    for event in sorted(events.objects(), key=event_time):
        reason = event.get("reason") or ""
        obj = event.get("involvedObject") or {}
        if CANNOT_START_EVENTS.get(reason) == obj.get("kind"):
            found.append(
                Blocker(reason, f"{obj.get('kind')} {tracker.ref.namespace}/{obj.get('name')}: {event.get('message') or ''}", fatal=True)
            )
    current = pods.objects()
    for pod in current:
        found += pod_blockers(pod)
    for pod_name, node in pending_on_nodes(current):
        why = tracker.node_not_ready(node)
        if why:
            found.append(Blocker("NodeNotReady", f"pod {pod_name} is on node {node}, which is not ready: {why}"))
    if tracker.watching_queue():
        found += quota_blockers(tracker.workload_events().objects())
    unique: dict[str, Blocker] = {}
    for blocker in found:
        unique.setdefault(blocker.reason, blocker)
    return list(unique.values())


def queue_notes(tracker: JobTracker, *, wait: float = 5.0) -> list[str]:
    """What Kueue said about the job's Workload since the last call (``reason: message``), each message once.

    A ``Preempted`` event is told in short (:func:`preemption_note`), the preempting TrainJob
    named when it is in the same namespace.
    """
    events = tracker.workload_events()
    events.synced.wait(wait)
    notes = []
    for event in sorted(events.objects(), key=event_time):
        key = (str(event.get("reason") or ""), str(event.get("message") or ""))
        if key not in tracker.queue_said:
            tracker.queue_said.add(key)
            message = preemption_note(key[1], _trainjob_names(tracker)) if key[0] == "Preempted" else key[1]
            notes.append(f"{key[0]}: {message}".strip(": "))
    return notes


def pod_notes(tracker: JobTracker) -> list[str]:
    """Which of the job's pods were replaced, or restarted their containers, since the last call (:class:`PodHistory`).

    Read from the pod watch the log followers (or the blocker checks) keep; none is started for
    it, so a launcher that follows no log makes no request for these notes and says none.
    """
    pods = tracker.watched_pods()
    if pods is None or not pods.synced.is_set():
        return []
    return tracker.history.notes(pods.objects(), gone=pods.gone())


def preemption_note(message: str, names: dict[str, str]) -> str:
    """Kueue's ``Preempted`` message in short; ``names``: TrainJob uid -> name (the preemptor's job uid).

    Example:
        >>> said = ("Preempted to accommodate a workload (UID: w1, JobUID: j1) due to prioritization in the ClusterQueue; "
        ...         "preemptor path: /team-cq; preemptee path: /team-cq; preemptor effective priority: 9")
        >>> preemption_note(said, {"j1": "urgent"})
        'preempted by TrainJob urgent in ClusterQueue team-cq (prioritization in the ClusterQueue); waiting to be re-admitted'
    """
    found = _PREEMPTED.search(message)
    if not found:
        return message
    queue = found["path"].strip().rstrip("/").rsplit("/", 1)[-1]
    who = f"TrainJob {names[found['job']]}" if found["job"] in names else f"a workload of job uid {found['job']}"
    return f"preempted by {who} in ClusterQueue {queue} ({found['why'].strip()}); waiting to be re-admitted"


def _trainjob_names(tracker: JobTracker) -> dict[str, str]:
    """The TrainJobs of the job's namespace by uid ({} when they cannot be listed)."""
    try:
        listed = call(tracker.api.request, "GET", trainjobs(tracker.ref.namespace), what="list TrainJobs", policy=tracker.policy)
    except Exception:  # noqa: BLE001 - a name is a courtesy; the uid is said instead
        return {}
    return {str(j["metadata"].get("uid")): str(j["metadata"].get("name")) for j in listed.get("items") or []}


def never_fits(message: str) -> bool:
    """Whether Kueue's reason for not admitting a Workload says its ClusterQueue can never fit it.

    That is: more than the queue's whole quota, or a resource the queue does not have -- not
    quota that is in use now.

    Example:
        >>> never_fits("couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu in flavor gpu, "
        ...            "previously considered podsets requests (0) + current podset request (16) > maximum capacity (8)")
        True
        >>> never_fits("couldn't assign flavors to pod set node: insufficient unused quota for nvidia.com/gpu in flavor gpu, 8 more needed")
        False
    """
    if "insufficient unused quota" in message:  # some flavor fits once quota is free again
        return False
    return "> maximum capacity" in message or bool(_UNAVAILABLE.search(message))


def quota_blockers(workload_events: list[Event]) -> list[Blocker]:
    """A fatal ``InsufficientQuota`` blocker when the Workload's ClusterQueue can never admit it.

    Kueue's latest ``Pending`` event on the job's Workload says so (:func:`never_fits`).
    """
    pending = [e for e in sorted(workload_events, key=event_time) if e.get("reason") == "Pending"]
    if not pending:
        return []
    obj = pending[-1].get("involvedObject") or {}
    message = str(pending[-1].get("message") or "")
    if not never_fits(message):
        return []
    where = f"Workload {obj.get('namespace') or ''}/{obj.get('name') or ''}".replace(" /", " ")
    return [Blocker("InsufficientQuota", f"{where}: {message} (more than its ClusterQueue can ever admit)", fatal=True)]


def pod_blockers(pod: Pod) -> list[Blocker]:
    """Unschedulable or image trouble of one Pending pod (stored form)."""
    status = pod.get("status") or {}
    if status.get("phase") != "Pending":
        return []
    name = (pod.get("metadata") or {}).get("name")
    found = []
    for condition in status.get("conditions") or []:
        if condition.get("type") == "PodScheduled" and condition.get("status") == "False" and condition.get("reason") == "Unschedulable":
            found.append(Blocker("Unschedulable", f"pod {name}: {condition.get('message')}"))
    for cs in (status.get("containerStatuses") or []) + (status.get("initContainerStatuses") or []):
        waiting = (cs.get("state") or {}).get("waiting") or {}
        reason, message = waiting.get("reason"), str(waiting.get("message") or "")
        if reason in IMAGE_ERRORS:
            fatal = IMAGE_ERRORS[reason] or (reason in PULL_RETRIED and bool(_IMAGE_MISSING.search(message)))
            found.append(
                Blocker(
                    PULL_RETRIED[0] if reason in PULL_RETRIED else reason,
                    f"pod {name} container {cs.get('name')}: " + (f"{reason}: {message}" if reason == "ImagePullBackOff" else message),
                    fatal=fatal,
                )
            )
    return found


def pending_on_nodes(pods: list[Pod]) -> list[tuple[str, str]]:
    """``(pod, node)`` for each Pending pod that is bound to a node (each node once): where a node's state can hold a start."""
    found: dict[str, str] = {}
    for pod in pods:
        node = str((pod.get("spec") or {}).get("nodeName") or "")
        if node and (pod.get("status") or {}).get("phase") == "Pending" and not (pod.get("metadata") or {}).get("deletionTimestamp"):
            found.setdefault(node, str(pod["metadata"].get("name") or ""))
    return [(pod, node) for node, pod in found.items()]


def not_ready(node: dict[str, Any]) -> str:
    """Why a node (as stored) is not ready, and since when; "" when its ``Ready`` condition is True.

    Example:
        >>> not_ready({"status": {"conditions": [{"type": "Ready", "status": "Unknown", "reason": "NodeStatusUnknown",
        ...     "message": "Kubelet stopped posting node status.", "lastTransitionTime": "2026-12-07T10:00:00Z"}]}})
        'NodeStatusUnknown: Kubelet stopped posting node status. (since 2026-12-07T10:00:00Z)'
        >>> not_ready({"status": {"conditions": [{"type": "Ready", "status": "True"}]}})
        ''
    """
    for condition in (node.get("status") or {}).get("conditions") or []:
        if condition.get("type") == "Ready":
            if condition.get("status") == "True":
                return ""
            why = f"{condition.get('reason') or 'NotReady'}: {condition.get('message') or ''}".strip(": ")
            since = condition.get("lastTransitionTime")
            return why + (f" (since {since})" if since else "")
    return "it reports no Ready condition"


def _slot(pod: Pod) -> str:
    """The place a pod fills in its job: ``node-0`` (replicated job and completion index; the job index when not 0)."""
    labels = (pod.get("metadata") or {}).get("labels") or {}
    job = labels.get("jobset.sigs.k8s.io/replicatedjob-name") or "pod"
    job_index = labels.get("jobset.sigs.k8s.io/job-index") or "0"
    index = labels.get("batch.kubernetes.io/job-completion-index") or "0"
    return f"{job}-{index}" if job_index == "0" else f"{job}-{job_index}-{index}"


def _ended(pod: Pod, gone: bool) -> str:
    """How a pod ended, from the last state seen of it (``gone``: it has been deleted since)."""
    status = pod.get("status") or {}
    for condition in status.get("conditions") or []:
        if condition.get("type") == "DisruptionTarget" and condition.get("status") == "True":
            return f"{condition.get('reason')}: {condition.get('message') or ''}".strip(": ")
    if status.get("reason"):  # Evicted (node pressure), NodeLost, ...
        return f"{status['reason']}: {status.get('message') or ''}".strip(": ")
    for cs in status.get("containerStatuses") or []:
        term = (cs.get("state") or {}).get("terminated")
        if term and term.get("exitCode"):
            return f"container {cs.get('name')} exit {term.get('exitCode')} ({term.get('reason')})"
    if gone or (pod.get("metadata") or {}).get("deletionTimestamp"):
        return "deleted"
    return str(status.get("phase") or "ended").lower()


def _ordinal(n: int) -> str:
    return f"{n}{'th' if 10 <= n % 100 <= 20 else {1: 'st', 2: 'nd', 3: 'rd'}.get(n % 10, 'th')}"


class PodHistory:
    """What became of a job's pods, told once each: a pod replaced by a new one, a container restarted.

    A Job replaces a pod that was deleted, evicted or failed with a new pod of the same
    completion index; a pod with ``restartPolicy: OnFailure`` restarts its container instead.
    :meth:`notes` compares the pods it is given with those of the calls before: a new pod in
    the place (:func:`_slot`) of one seen in an earlier call replaces it. Pods a suspension
    ends (:meth:`forget`) are not said to be replaced when the job is admitted again: the
    queue's notes tell that story.

    Example:
        >>> def pod(uid, **status):
        ...     labels = {"jobset.sigs.k8s.io/replicatedjob-name": "node", "batch.kubernetes.io/job-completion-index": "0"}
        ...     return {"metadata": {"uid": uid, "name": f"tj-node-0-0-{uid}", "labels": labels}, "status": status}
        >>> history = PodHistory()
        >>> history.notes([pod("a", phase="Running")])
        []
        >>> history.notes([pod("a", phase="Failed", reason="Evicted", message="The node was low on resource: memory."),
        ...                pod("b", phase="Pending")])  # doctest: +NORMALIZE_WHITESPACE
        ['node-0: pod tj-node-0-0-a ended before its job (Evicted: The node was low on resource: memory.);
          pod tj-node-0-0-b takes its place, the 2nd pod of node-0 (a trainer that saves checkpoints resumes from its last one)']
    """

    def __init__(self) -> None:
        self.last: dict[str, Pod] = {}  # uid -> the pod as last seen
        self.slots: dict[str, list[str]] = {}  # slot -> uids of its pods, in the order seen
        self.closed: set[str] = set()  # uids whose end was told (or is not to be)
        self.restarts: dict[str, int] = {}  # uid -> container restarts told

    def forget(self, pods: list[Pod]) -> None:
        """The job was suspended: ``pods`` (and those seen before) end without a note."""
        for pod in pods:
            self._see(pod)
        self.closed.update(self.last)

    def _see(self, pod: Pod) -> bool:
        """Remember ``pod``; True when it was not seen before."""
        uid = key_of(pod)
        new = uid not in self.last
        self.last[uid] = pod
        if new:
            self.slots.setdefault(_slot(pod), []).append(uid)
            self.restarts[uid] = _restarts(pod)
        return new

    def notes(self, pods: list[Pod], gone: Sequence[Pod] = ()) -> list[str]:
        """What changed since the last call, each told once; ``gone``: the final state of pods deleted meanwhile.

        A pod can be evicted and gone between two calls: its final state (from the watch's
        DELETED event) still tells why it ended (its ``DisruptionTarget`` condition).
        """
        for pod in gone:
            if key_of(pod) in self.last:
                self.last[key_of(pod)] = pod
        before = set(self.last)
        present = {key_of(p) for p in pods}
        said = []
        ordered = sorted(pods, key=lambda p: (str(p["metadata"].get("creationTimestamp") or ""), str(p["metadata"].get("name"))))
        for pod in ordered:
            uid = key_of(pod)
            slot = _slot(pod)
            if self._see(pod):
                for old in self.slots[slot][:-1]:
                    if old in before and old not in self.closed:
                        self.closed.add(old)
                        count = len(self.slots[slot])
                        said.append(
                            f"{slot}: pod {self.last[old]['metadata'].get('name')} ended before its job "
                            f"({_ended(self.last[old], old not in present)}); pod {pod['metadata'].get('name')} takes its place, "
                            f"the {_ordinal(count)} pod of {slot} (a trainer that saves checkpoints resumes from its last one)"
                        )
            restarts = _restarts(pod)
            if restarts > self.restarts[uid]:
                self.restarts[uid] = restarts
                said.append(f"{slot}: pod {pod['metadata'].get('name')} restarted its container ({_last_exit(pod)}), restart {restarts}")
        return said


def _restarts(pod: Pod) -> int:
    return sum(int(cs.get("restartCount") or 0) for cs in (pod.get("status") or {}).get("containerStatuses") or [])


def _last_exit(pod: Pod) -> str:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        term = (cs.get("lastState") or {}).get("terminated")
        if term:
            return f"{cs.get('name')} exit {term.get('exitCode')} ({term.get('reason')})"
    return "reason not reported"


class Failure(NamedTuple):
    """A container that exited non-zero: its pod, its name, whether it runs again since, and when it ended (RFC 3339)."""

    pod: str
    container: str
    restarted: bool
    finished: str


def first_failure(failures: list[Failure]) -> Failure | None:
    """The container that failed first: the cause, where the others were stopped after it.

    A JobSet ends the other ranks when one fails, and they may exit non-zero too. Name order
    between those that ended in the same second; one without an end time comes last.

    Example:
        >>> killed = Failure("tj-node-0-0-a", "node", False, "2026-12-06T10:09:47Z")
        >>> crashed = Failure("tj-node-0-1-b", "node", False, "2026-12-06T10:09:45Z")
        >>> first_failure([killed, crashed]).pod
        'tj-node-0-1-b'
    """
    # The API server writes times as RFC 3339 in UTC to the second: their text sorts as the times do.
    return min(failures, key=lambda f: (f.finished or "~", f.pod), default=None)


def pod_summary(pod: Pod) -> tuple[str, Failure | None]:
    """A pod's line of the diagnosis (phase, node, containers) and its first failed container.

    The failed container is the first that exited non-zero, or None.

    Example:
        >>> pod = {"metadata": {"name": "tj-node-0-0-x"}, "spec": {"nodeName": "n1"}, "status": {"phase": "Failed",
        ...        "containerStatuses": [{"name": "node", "restartCount": 0, "state": {"terminated":
        ...            {"exitCode": 137, "reason": "OOMKilled", "finishedAt": "2026-12-06T10:09:45Z"}}}]}}
        >>> line, failing = pod_summary(pod)
        >>> line
        '  tj-node-0-0-x: Failed on node n1; node: exit 137 (OOMKilled), restarts 0'
        >>> failing
        Failure(pod='tj-node-0-0-x', container='node', restarted=False, finished='2026-12-06T10:09:45Z')
    """
    name = str((pod.get("metadata") or {}).get("name") or "")
    status = pod.get("status") or {}
    states = []
    failing = None
    for cs in status.get("containerStatuses") or []:
        state, last = cs.get("state") or {}, cs.get("lastState") or {}
        term = state.get("terminated") or last.get("terminated")
        wait = state.get("waiting")
        detail = f"exit {term.get('exitCode')} ({term.get('reason')})" if term else (wait.get("reason") if wait else "running")
        states.append(f"{cs.get('name')}: {detail}, restarts {cs.get('restartCount') or 0}")
        if term and term.get("exitCode") and failing is None:
            failing = Failure(name, str(cs.get("name")), "waiting" in state or "running" in state, str(term.get("finishedAt") or ""))
    node = (pod.get("spec") or {}).get("nodeName")
    where = f" on node {node}" if node else ""
    return f"  {name}: {status.get('phase')}{where}; " + "; ".join(states), failing


def diagnose(api: ApiClient, ref: JobRef, *, tail: int = 40, created: str = "", policy: RetryPolicy = RetryPolicy()) -> str:
    """Failed pods, recent events and the failing container's last log lines."""
    parts: list[str] = []
    try:
        listed = call(api.request, "GET", pods(ref.namespace), query={"labelSelector": f"{JOBSET_LABEL}={ref.name}"},
                      what=f"list pods of {ref}", policy=policy)  # fmt: skip
    except UserError as e:
        return f"(could not list pods: {e})"
    failures = []
    pod_lines = []
    for pod in sorted(listed.get("items") or [], key=lambda p: str(p["metadata"]["name"])):
        line, failed = pod_summary(pod)
        pod_lines.append(line)
        if failed:
            failures.append(failed)
    failing = first_failure(failures)
    if pod_lines:
        parts.append("Pods:\n" + "\n".join(pod_lines))
    try:
        found = call(api.request, "GET", events_path(ref.namespace), what=f"list events in {ref.namespace}", policy=policy)
        events = list(found.get("items") or [])
    except UserError:
        events = []
    related = sorted((event for event in events if belongs(event, ref, created)), key=event_time)
    grouped: dict[tuple[str, str, str, str], tuple[str, int]] = {}  # the same complaint once, with a count
    for event in related:
        obj = event.get("involvedObject") or {}
        key = (str(event.get("type") or ""), str(event.get("reason") or ""), str(obj.get("kind") or ""), str(obj.get("name") or ""))
        _, count = grouped.pop(key, ("", 0))
        grouped[key] = (str(event.get("message") or ""), count + int(event.get("count") or 1))
    if grouped:
        parts.append(
            "Recent events:\n"
            + "\n".join(
                f"  {kind_} {reason} {obj_kind}/{name}: {message}" + (f" (x{count})" if count > 1 else "")
                for (kind_, reason, obj_kind, name), (message, count) in list(grouped.items())[-10:]
            )
        )
    if failing:
        pod_name, container, restarted = failing.pod, failing.container, failing.restarted
        query = {"container": container, "tailLines": tail, "previous": restarted}
        try:
            text = call(api.request, "GET", pod_log(ref.namespace, pod_name), query=query, what=f"logs of {pod_name}", policy=policy)
            lines = str(text or "").splitlines()
            parts.append(f"Last {tail} log lines of {pod_name}/{container}:\n" + "\n".join("  " + line for line in lines))
        except UserError as e:
            parts.append(f"(log of {pod_name} unavailable: {e})")
    return "\n\n".join(parts)


def inspect_hint(ref: JobRef) -> str:
    """Kubectl commands to look at the job."""
    return (
        f"  kubectl get trainjob -n {ref.namespace} {ref.name} -o yaml\n"
        f"  kubectl get pods -n {ref.namespace} -l {JOBSET_LABEL}={ref.name}\n"
        f"  kubectl logs -n {ref.namespace} -l {JOBSET_LABEL}={ref.name},"
        f"batch.kubernetes.io/job-completion-index=0 -c node -f\n"
        f"  kubectl get events -n {ref.namespace} --field-selector involvedObject.name={ref.name}"
    )
