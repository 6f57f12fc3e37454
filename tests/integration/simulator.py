"""A test-only stand-in for the Kubeflow Trainer (and JobSet) controllers.

It watches TrainJobs (trainer.kubeflow.org/v1alpha1, all namespaces) through
the real API server and does what the Trainer + JobSet controllers would:

* resolves ``spec.runtimeRef``; when the runtime is missing it emits a Warning
  event ``TrainJobResourcesCreationFailed`` on the TrainJob and sets no condition;
* creates one batch/v1 Job per replicated job, named ``<trainjob>-<rj>-<idx>``
  (Indexed, completions = parallelism = numNodes for ``node``), owner-referenced
  to the TrainJob, with the JobSet labels on the Job and its pod template and the
  metadata / pod spec patches of ``spec.runtimePatches`` (and the older
  ``podTemplateOverrides``) applied, best effort;
* the real job controller creates the pods, the real scheduler binds them to a
  KWOK node; the simulator then drives the pod status (the kwok controller is
  told to disregard these pods through the annotation ``SIM_ANNOTATION``):
  Running, container restarts, Succeeded / Failed;
* serves log lines through KWOK's ``Logs`` resource: a host file per pod, in CRI
  log format, that the simulator appends to over time, so
  ``read_namespaced_pod_log(..., follow=True)`` streams through the API server;
* writes the TrainJob status: ``jobsStatus`` and the ``Suspended`` /
  ``Complete`` (``AllJobsCompleted``) / ``Failed`` conditions;
* finalizes the deletion of the pods it drives (a kubelet's job), so garbage
  collection of Jobs and pods completes.

Behaviour is scripted per TrainJob name *before* the TrainJob is created::

    sim.script("my-job", Script(lines=["step 1", "step 2"], line_delay=0.2))
    sim.script("bad-job", Script.failure(["epoch 1"], reason="FailedJobs", message="boom"))
    sim.script("stuck", Script.never_start("runtime broke"))

Unscripted TrainJobs get ``Script()``: a few log lines, then Complete.

Logs across a container restart: a real kubelet ends a ``follow`` stream when
the container exits and a new request returns the new instance's log
(``previous=True`` the old one).  KWOK's log server never ends a follow stream on
its own (it cannot tell that a container stopped), so here the stream continues
into the next instance instead: at a restart the simulator renames the log file
to the "previous" file and creates a new one at the same path; the follower
(like the kubelet's own reader on log rotation) reopens the path and goes on
with the new instance's lines.  ``previous=True`` returns the last instance's
log.  A follow stream also does not end when the pod completes: callers must
stop following on their own (for example when the TrainJob is finished), or
pass ``_request_timeout``.
"""

from __future__ import annotations

import copy
import dataclasses
import hashlib
import logging
import os
import threading
import time
import uuid
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

from kubernetes import client, watch
from kubernetes.client.rest import ApiException

log = logging.getLogger("trainer-sim")

TRAINER_GROUP = "trainer.kubeflow.org"
TRAINER_VERSION = "v1alpha1"
SIM_ANNOTATION = "sim.kfp-trainer.test/driven"
SIM_SCHED_LABEL_PREFIX = "sim.kfp-trainer.test/sched-"
JOBSET_NAME = "jobset.sigs.k8s.io/jobset-name"
RJ_NAME = "jobset.sigs.k8s.io/replicatedjob-name"
JOB_INDEX = "jobset.sigs.k8s.io/job-index"
RJ_REPLICAS = "jobset.sigs.k8s.io/replicatedjob-replicas"
JOB_KEY = "jobset.sigs.k8s.io/job-key"
COMPLETION_INDEX = "batch.kubernetes.io/job-completion-index"
ANCESTOR = "trainer.kubeflow.org/trainjob-ancestor-step"
INITIALIZER_JOBS = ("dataset-initializer", "model-initializer")
DEFAULT_LINES = ["Starting training", "epoch 1/2 loss=0.50", "epoch 2/2 loss=0.25", "Training finished"]


def _namespace_gone(e: ApiException) -> bool:
    """The namespace is being deleted (or gone): nothing more to do there."""
    body = e.body if isinstance(e.body, str) else (e.body or b"").decode(errors="replace") if isinstance(e.body, bytes) else ""
    return (e.status == 403 and "NamespaceTerminating" in body) or (e.status == 404 and "namespaces" in body)


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _cri_ts() -> str:
    t = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e9):09d}Z"


@dataclasses.dataclass
class Script:
    """What happens to one TrainJob.

    lines          log lines of each trainer pod (container ``node``), one every ``line_delay`` s
    start_delay    seconds a bound pod stays Pending (ContainerCreating) before it runs
    outcome        "succeed" | "fail" | "run_forever"
    fail_reason    Failed condition reason (JobSet's ``FailedJobs`` by default)
    fail_message   Failed condition message
    exit_code      the failed container's exit code
    restarts       the container crashes after emitting restarts[i] lines in its i-th instance
                   (pod restartCount goes up; each new instance logs ``lines`` from the start)
    restart_delay  seconds between a crash and the next instance (CrashLoopBackOff)
    schedule_delay pods are unschedulable (nodeSelector no node has) for this many seconds
    unschedulable  pods are unschedulable forever
    never_start    no Jobs at all; a Warning event TrainJobResourcesCreationFailed only
    event_message  message of that event
    initializer_lines  log lines of initializer pods
    finish_delay   seconds between the last line and the pod's termination
    """

    lines: list[str] = dataclasses.field(default_factory=lambda: list(DEFAULT_LINES))
    line_delay: float = 0.05
    start_delay: float = 0.0
    outcome: str = "succeed"
    fail_reason: str = "FailedJobs"
    fail_message: str = "jobset failed due to failed job node"
    exit_code: int = 1
    restarts: list[int] = dataclasses.field(default_factory=list)
    restart_delay: float = 0.2
    schedule_delay: float | None = None
    unschedulable: bool = False
    never_start: bool = False
    event_message: str | None = None
    initializer_lines: list[str] = dataclasses.field(default_factory=lambda: ["downloading", "done"])
    finish_delay: float = 0.0

    @classmethod
    def success(cls, lines: list[str] | None = None, line_delay: float = 0.05, **kw) -> Script:
        return cls(lines=list(DEFAULT_LINES if lines is None else lines), line_delay=line_delay, **kw)

    @classmethod
    def failure(
        cls,
        lines: list[str] | None = None,
        reason: str = "FailedJobs",
        message: str = "jobset failed due to failed job node",
        line_delay: float = 0.05,
        **kw,
    ) -> Script:
        return cls(
            lines=list(DEFAULT_LINES[:2] if lines is None else lines),
            line_delay=line_delay,
            outcome="fail",
            fail_reason=reason,
            fail_message=message,
            **kw,
        )

    @classmethod
    def never_starting(cls, message: str | None = None) -> Script:
        return cls(never_start=True, event_message=message)

    @classmethod
    def slow_scheduling(cls, seconds: float, **kw) -> Script:
        return cls(schedule_delay=seconds, **kw)

    @classmethod
    def unschedulable_forever(cls, **kw) -> Script:
        return cls(unschedulable=True, **kw)

    @classmethod
    def restarting(cls, lines: list[str], restarts: list[int], **kw) -> Script:
        return cls(lines=list(lines), restarts=list(restarts), **kw)


@dataclasses.dataclass
class _TJState:
    key: tuple[str, str]
    obj: dict
    script: Script
    uid: str
    deleted: threading.Event = dataclasses.field(default_factory=threading.Event)
    changed: threading.Condition = dataclasses.field(default_factory=threading.Condition)
    conditions: list[dict] = dataclasses.field(default_factory=list)
    failed: bool = False
    finished: bool = False
    failing: bool = False
    jobs: list[str] = dataclasses.field(default_factory=list)


class TrainerSimulator:
    """Plays the Trainer + JobSet controllers against a real API server."""

    def __init__(
        self,
        api_client: client.ApiClient,
        logs_dir: str | os.PathLike,
        node_for_scheduling: str | None = None,
        kwok_port: int | None = None,
    ):
        self.api = api_client
        self.core = client.CoreV1Api(api_client)
        self.batch = client.BatchV1Api(api_client)
        self.co = client.CustomObjectsApi(api_client)
        self.logs_dir = Path(logs_dir)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.node_for_scheduling = node_for_scheduling
        # The kwok controller's own server: probed directly to know when it serves a pod's log.
        self.kwok_port = kwok_port
        self._scripts: dict[tuple[str | None, str], Script] = {}
        self.default_script = Script()
        self._lock = threading.RLock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []
        self._trainjobs: dict[tuple[str, str], _TJState] = {}
        self._pods_driven: dict[str, threading.Event] = {}
        # Everything the simulator saw, for assertions.
        self.seen: dict[tuple[str, str], list[dict]] = {}
        self.created_jobs: dict[tuple[str, str], list[dict]] = {}
        self.events: list[dict] = []
        self.errors: list[str] = []

    # ------------------------------------------------------------------ public API
    def script(self, name: str, script: Script, namespace: str | None = None) -> None:
        """Script the TrainJob ``name`` (in ``namespace``, or any) before it is created."""
        with self._lock:
            self._scripts[(namespace, name)] = script

    def reset(self) -> None:
        """Forget per-test scripts (TrainJobs already running keep theirs)."""
        with self._lock:
            self._scripts.clear()
            self.default_script = Script()

    def trainjob_seen(self, name: str, namespace: str, timeout: float = 10) -> dict:
        """The TrainJob as the simulator first saw it (waits for it)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            with self._lock:
                got = self.seen.get((namespace, name))
            if got:
                return got[0]
            time.sleep(0.05)
        raise TimeoutError(f"simulator never saw TrainJob {namespace}/{name}")

    def start(self) -> TrainerSimulator:
        for target, name in ((self._watch_trainjobs, "tj-watch"), (self._watch_pods, "pod-watch")):
            t = threading.Thread(target=self._guard(target), name=f"sim-{name}", daemon=True)
            t.start()
            self._threads.append(t)
        return self

    def stop(self, timeout: float = 15) -> None:
        self._stop.set()
        for ev in list(self._pods_driven.values()):
            ev.set()
        deadline = time.monotonic() + timeout
        for t in self._threads:
            t.join(max(0.1, deadline - time.monotonic()))

    # ------------------------------------------------------------------ plumbing
    def _guard(self, fn: Callable, *args) -> Callable[[], None]:
        def run() -> None:
            try:
                fn(*args)
            except ApiException as e:
                if _namespace_gone(e) or e.status == 404:
                    return  # the TrainJob / namespace went away under us: normal in tests
                if not self._stop.is_set():
                    log.exception("simulator thread %s failed", fn.__name__)
                    self.errors.append(f"{fn.__name__}: {e.status} {e.reason}: {str(e.body)[:300]}")
            except Exception as e:  # noqa: BLE001
                if not self._stop.is_set():
                    log.exception("simulator thread %s failed", fn.__name__)
                    self.errors.append(f"{fn.__name__}{args!r}: {e!r}")

        return run

    def _spawn(self, fn: Callable, *args, name: str = "worker") -> None:
        t = threading.Thread(target=self._guard(fn, *args), name=f"sim-{name}", daemon=True)
        t.start()

    def _sleep(self, seconds: float, *events: threading.Event) -> bool:
        """Sleep; return False when the simulator (or one of ``events``) stopped meanwhile."""
        deadline = time.monotonic() + seconds
        while True:
            if self._stop.is_set() or any(e.is_set() for e in events):
                return False
            left = deadline - time.monotonic()
            if left <= 0:
                return True
            time.sleep(min(left, 0.05))

    def _watch_loop(self, list_fn: Callable, handle: Callable[[str, dict], None], **kw) -> None:
        """List + watch with reconnects; ``handle(event_type, obj_dict)``."""
        rv = None
        while not self._stop.is_set():
            try:
                if rv is None:
                    resp = list_fn(**kw)
                    items = resp["items"] if isinstance(resp, dict) else self.api.sanitize_for_serialization(resp)["items"]
                    rv = resp["metadata"]["resourceVersion"] if isinstance(resp, dict) else resp.metadata.resource_version
                    for it in items:
                        handle("ADDED", it)
                w = watch.Watch()
                for ev in w.stream(list_fn, resource_version=rv, timeout_seconds=5, allow_watch_bookmarks=True, **kw):
                    if self._stop.is_set():
                        w.stop()
                        break
                    obj = ev["object"]
                    if not isinstance(obj, dict):
                        obj = self.api.sanitize_for_serialization(obj)
                    if ev["type"] == "ERROR":
                        rv = None
                        break
                    new_rv = obj.get("metadata", {}).get("resourceVersion")
                    if new_rv:
                        rv = new_rv
                    if ev["type"] == "BOOKMARK":
                        continue
                    handle(ev["type"], obj)
            except ApiException as e:
                if e.status in (410, 404):
                    rv = None
                    self._sleep(0.5)
                    continue
                if not self._stop.is_set():
                    log.warning("watch error: %s", e)
                    self._sleep(1)
                    rv = None
            except Exception as e:  # noqa: BLE001 - connection resets and the like
                if not self._stop.is_set():
                    log.debug("watch reconnect: %r", e)
                    self._sleep(0.5)

    # ------------------------------------------------------------------ TrainJobs
    def _watch_trainjobs(self) -> None:
        def list_fn(**kw):
            return self.co.list_cluster_custom_object(TRAINER_GROUP, TRAINER_VERSION, "trainjobs", **kw)

        self._watch_loop(list_fn, self._on_trainjob)

    def _lookup_script(self, ns: str, name: str) -> Script:
        with self._lock:
            s = self._scripts.get((ns, name)) or self._scripts.get((None, name))
            return copy.deepcopy(s if s is not None else self.default_script)

    def _on_trainjob(self, typ: str, obj: dict) -> None:
        md = obj["metadata"]
        key = (md["namespace"], md["name"])
        with self._lock:
            st = self._trainjobs.get(key)
            if st is not None and st.uid != md["uid"]:
                st.deleted.set()
                st = None
                self._trainjobs.pop(key, None)
            if typ == "DELETED":
                if st is not None:
                    st.deleted.set()
                    with st.changed:
                        st.changed.notify_all()
                    self._trainjobs.pop(key, None)
                return
            if st is None:
                if md.get("deletionTimestamp"):
                    return
                st = _TJState(key=key, obj=obj, script=self._lookup_script(*key), uid=md["uid"])
                # An object that already has a terminal condition (simulator restarted) is left alone.
                conds = (obj.get("status") or {}).get("conditions") or []
                if any(c.get("type") in ("Complete", "Failed") and c.get("status") == "True" for c in conds):
                    return
                self._trainjobs[key] = st
                self.seen.setdefault(key, []).append(copy.deepcopy(obj))
                self._spawn(self._run_trainjob, st, name=f"tj-{md['name']}")
            else:
                with st.changed:
                    st.obj = obj
                    st.changed.notify_all()

    def _runtime(self, st: _TJState) -> dict | None:
        ref = st.obj["spec"].get("runtimeRef") or {}
        kind = ref.get("kind") or "ClusterTrainingRuntime"
        name = ref.get("name")
        try:
            if kind == "TrainingRuntime":
                return self.co.get_namespaced_custom_object(TRAINER_GROUP, TRAINER_VERSION, st.key[0], "trainingruntimes", name)
            return self.co.get_cluster_custom_object(TRAINER_GROUP, TRAINER_VERSION, "clustertrainingruntimes", name)
        except ApiException as e:
            if e.status == 404:
                return None
            raise

    def _event(self, st: _TJState, reason: str, message: str, typ: str = "Warning") -> None:
        ns, name = st.key
        now = datetime.now(timezone.utc)
        body = {
            "metadata": {"name": f"{name}.{uuid.uuid4().hex[:16]}", "namespace": ns},
            "involvedObject": {
                "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
                "kind": "TrainJob",
                "name": name,
                "namespace": ns,
                "uid": st.uid,
                "resourceVersion": st.obj["metadata"].get("resourceVersion"),
            },
            "reason": reason,
            "message": message,
            "type": typ,
            "count": 1,
            "firstTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "lastTimestamp": now.strftime("%Y-%m-%dT%H:%M:%SZ"),
            "source": {"component": "trainjob-controller"},
            "reportingComponent": "trainjob-controller",
            "reportingInstance": "trainer-simulator",
        }
        try:
            self.core.create_namespaced_event(ns, body)
        except ApiException as e:
            if _namespace_gone(e):
                return
            raise
        with self._lock:
            self.events.append(body)

    def _set_condition(self, st: _TJState, typ: str, status: str, reason: str, message: str) -> None:
        for c in st.conditions:
            if c["type"] == typ:
                if c["status"] != status:
                    c["lastTransitionTime"] = _now()
                c.update(status=status, reason=reason, message=message)
                break
        else:
            st.conditions.append({"type": typ, "status": status, "reason": reason, "message": message, "lastTransitionTime": _now()})

    def _write_status(self, st: _TJState) -> None:
        if st.deleted.is_set():
            return
        ns, name = st.key
        status: dict[str, Any] = {"conditions": copy.deepcopy(st.conditions)}
        status["jobsStatus"] = self._jobs_status(st)
        if status == getattr(st, "_last_written", None):
            return
        st._last_written = copy.deepcopy(status)  # type: ignore[attr-defined]
        try:
            self.co.patch_namespaced_custom_object_status(TRAINER_GROUP, TRAINER_VERSION, ns, "trainjobs", name, {"status": status})
        except ApiException as e:
            if e.status != 404:
                raise

    def _jobs_status(self, st: _TJState) -> list[dict]:
        ns, name = st.key
        try:
            jobs = self.batch.list_namespaced_job(ns, label_selector=f"{JOBSET_NAME}={name}").items
        except ApiException:
            return []
        by_rj: dict[str, dict] = {}
        for rj in self._replicated_job_names(st):
            by_rj[rj] = {"name": rj, "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0}
        for j in jobs:
            if j.metadata.owner_references and all(o.uid != st.uid for o in j.metadata.owner_references):
                continue
            rj = (j.metadata.labels or {}).get(RJ_NAME)
            if rj is None:
                continue
            s = by_rj.setdefault(rj, {"name": rj, "ready": 0, "succeeded": 0, "failed": 0, "active": 0, "suspended": 0})
            conds = {c.type: c.status for c in (j.status.conditions or [])}
            if conds.get("Complete") == "True":
                s["succeeded"] += 1
            elif conds.get("Failed") == "True":
                s["failed"] += 1
            elif j.spec.suspend:
                s["suspended"] += 1
            else:
                s["active"] += 1
                if (j.status.ready or 0) + (j.status.succeeded or 0) >= (j.spec.parallelism or 1):
                    s["ready"] += 1
        return list(by_rj.values())

    def _replicated_job_names(self, st: _TJState) -> list[str]:
        return getattr(st, "_rj_names", [])

    def _wait(self, st: _TJState, pred: Callable[[], bool], timeout: float | None = None) -> bool:
        deadline = None if timeout is None else time.monotonic() + timeout
        with st.changed:
            while True:
                if pred():
                    return True
                if self._stop.is_set() or st.deleted.is_set():
                    return False
                if deadline is not None and time.monotonic() > deadline:
                    return False
                st.changed.wait(0.2)

    def _run_trainjob(self, st: _TJState) -> None:
        sc = st.script
        spec = st.obj["spec"]
        if sc.never_start:
            msg = sc.event_message or (f"failed to build the JobSet for TrainJob {st.key[1]}: simulated resource creation failure")
            self._event(st, "TrainJobResourcesCreationFailed", msg)
            return
        runtime = self._runtime(st)
        if runtime is None:
            ref = spec.get("runtimeRef") or {}
            kind = ref.get("kind") or "ClusterTrainingRuntime"
            self._event(
                st,
                "TrainJobResourcesCreationFailed",
                f'{kind}.{TRAINER_GROUP} "{ref.get("name")}" not found',
            )
            return
        jobs = self._build_jobs(st, runtime)
        st._rj_names = []  # type: ignore[attr-defined]
        for j in jobs:
            rj = j["metadata"]["labels"][RJ_NAME]
            if rj not in st._rj_names:  # type: ignore[attr-defined]
                st._rj_names.append(rj)  # type: ignore[attr-defined]
        with self._lock:
            self.created_jobs[st.key] = jobs
        suspended = bool(spec.get("suspend"))
        if suspended:
            self._set_condition(st, "Suspended", "True", "Suspended", "TrainJob is suspended")
            self._write_status(st)
        if sc.schedule_delay is not None and not sc.unschedulable:
            self._spawn(self._make_schedulable_later, st, sc.schedule_delay, name="sched")
        deadline_s = spec.get("activeDeadlineSeconds")
        started = time.monotonic()
        # Create the Jobs, honouring dependsOn (a dependent job is created once its
        # dependencies are Complete, as JobSet does).
        pending = list(jobs)
        while pending and not st.deleted.is_set() and not self._stop.is_set():
            if st.failing:
                break
            progressed = False
            for j in list(pending):
                deps = j.pop("_dependsOn", None) or []
                if deps and not self._deps_complete(st, deps):
                    j["_dependsOn"] = deps
                    continue
                j["spec"]["suspend"] = bool(st.obj["spec"].get("suspend"))
                if not self._create_job(st, j):
                    return
                pending.remove(j)
                st.jobs.append(j["metadata"]["name"])
                progressed = True
            self._write_status(st)
            if pending and not progressed:
                self._sleep(0.2, st.deleted)
        # Follow suspension changes and completion.
        last_status = None
        while not st.deleted.is_set() and not self._stop.is_set():
            now_susp = bool(st.obj["spec"].get("suspend"))
            if now_susp != suspended:
                suspended = now_susp
                for jn in st.jobs:
                    self._patch_job(st.key[0], jn, {"spec": {"suspend": now_susp}})
                if now_susp:
                    self._set_condition(st, "Suspended", "True", "Suspended", "TrainJob is suspended")
                else:
                    self._set_condition(st, "Suspended", "False", "Resumed", "TrainJob is resumed")
                    started = time.monotonic()
                self._write_status(st)
            if st.failed:
                self._write_status(st)
                st.finished = True
                return
            if deadline_s and not suspended and time.monotonic() - started > deadline_s:
                self._set_condition(st, "Failed", "True", "DeadlineExceeded", "TrainJob exceeded its activeDeadlineSeconds")
                st.failed = st.finished = True
                for jn in st.jobs:
                    self._patch_job(st.key[0], jn, {"spec": {"suspend": True}})
                self._write_status(st)
                return
            js = self._jobs_status(st)
            if js != last_status:
                last_status = js
                self._write_status(st)
            if (
                js
                and not pending
                and all(s["succeeded"] >= 1 and s["active"] == 0 and s["failed"] == 0 for s in js)
                and len(st.jobs) == len(jobs)
            ):
                self._set_condition(st, "Complete", "True", "AllJobsCompleted", "jobset completed successfully")
                st.finished = True
                self._write_status(st)
                return
            with st.changed:
                st.changed.wait(0.3)

    def _deps_complete(self, st: _TJState, deps: list[dict]) -> bool:
        ns, name = st.key
        for d in deps:
            try:
                jobs = self.batch.list_namespaced_job(ns, label_selector=f"{JOBSET_NAME}={name},{RJ_NAME}={d['name']}").items
            except ApiException:
                return False
            if not jobs:
                return False
            want = d.get("status", "Complete")
            for j in jobs:
                conds = {c.type: c.status for c in (j.status.conditions or [])}
                if want == "Ready":
                    if not ((j.status.ready or 0) >= 1 or conds.get("Complete") == "True"):
                        return False
                elif conds.get("Complete") != "True":
                    return False
        return True

    def _create_job(self, st: _TJState, job: dict) -> bool:
        """Create a Job; on a rejection emit the controller's Warning event (as JobSet/Trainer would)."""
        try:
            self.batch.create_namespaced_job(job["metadata"]["namespace"], job)
            return True
        except ApiException as e:
            if e.status == 409:
                return True
            if _namespace_gone(e):
                st.deleted.set()
                return False
            if e.status in (400, 422):
                msg = e.body if isinstance(e.body, str) else str(e.body)
                try:
                    import json

                    msg = json.loads(msg).get("message", msg)
                except ValueError:
                    pass
                self._event(st, "TrainJobResourcesCreationFailed", f"failed to create Job {job['metadata']['name']}: {msg}")
                return False
            raise

    def _patch_job(self, ns: str, name: str, patch: dict) -> None:
        try:
            self.batch.patch_namespaced_job(name, ns, patch)
        except ApiException as e:
            if e.status != 404:
                raise

    def _make_schedulable_later(self, st: _TJState, seconds: float) -> None:
        if not self._sleep(seconds, st.deleted):
            return
        label = SIM_SCHED_LABEL_PREFIX + st.uid[:8]
        node = self.node_for_scheduling
        if node is None:
            nodes = self.core.list_node(label_selector="type=kwok").items
            node = sorted(n.metadata.name for n in nodes)[0]
        self.core.patch_node(node, {"metadata": {"labels": {label: "true"}}})

    # ------------------------------------------------------------------ Jobs
    def _build_jobs(self, st: _TJState, runtime: dict) -> list[dict]:
        ns, name = st.key
        spec = st.obj["spec"]
        sc = st.script
        rspec = runtime.get("spec", {})
        template = rspec.get("template", {})
        js_spec = template.get("spec", {})
        ml = rspec.get("mlPolicy") or {}
        trainer = spec.get("trainer") or {}
        num_nodes = trainer.get("numNodes") or ml.get("numNodes") or 1
        patches = spec.get("runtimePatches") or []
        overrides = spec.get("podTemplateOverrides") or []
        owner = {
            "apiVersion": f"{TRAINER_GROUP}/{TRAINER_VERSION}",
            "kind": "TrainJob",
            "name": name,
            "uid": st.uid,
            "controller": True,
            "blockOwnerDeletion": True,
        }
        claim_templates = []
        for pol in js_spec.get("volumeClaimPolicies") or []:
            claim_templates.extend(pol.get("templates") or [])
        for ct in claim_templates:
            self._create_pvc(st, ct, owner)
        jobs = []
        for rj in js_spec.get("replicatedJobs") or []:
            rj_name = rj["name"]
            replicas = rj.get("replicas", 1)
            jt = copy.deepcopy(rj.get("template") or {})
            jmeta = jt.get("metadata") or {}
            jspec = jt.get("spec") or {}
            pt = jspec.get("template") or {}
            pmeta = pt.setdefault("metadata", {})
            pspec = pt.setdefault("spec", {})
            job_labels = dict(jmeta.get("labels") or {})
            job_ann = dict(jmeta.get("annotations") or {})
            # Top-level JobSet metadata from the runtime template and patches.
            tmeta = template.get("metadata") or {}
            job_labels.update(tmeta.get("labels") or {})
            job_ann.update(tmeta.get("annotations") or {})
            job_labels.update(spec.get("labels") or {})  # v2.1 top-level labels
            job_ann.update(spec.get("annotations") or {})
            for p in patches:
                trs = (p.get("trainingRuntimeSpec") or {}).get("template") or {}
                job_labels.update((trs.get("metadata") or {}).get("labels") or {})
                job_ann.update((trs.get("metadata") or {}).get("annotations") or {})
            is_trainer = rj_name in ("node", "launcher") or job_labels.get(ANCESTOR) == "trainer"
            # The trainer container.
            containers = pspec.setdefault("containers", [])
            for c in containers:
                if c.get("name") == "node" and is_trainer:
                    if trainer.get("image"):
                        c["image"] = trainer["image"]
                    if trainer.get("command"):
                        c["command"] = list(trainer["command"])
                    if trainer.get("args"):
                        c["args"] = list(trainer["args"])
                    env = [e for e in c.get("env") or [] if e["name"] not in {x["name"] for x in trainer.get("env") or []}]
                    env.extend(trainer.get("env") or [])
                    if "torch" in ml:
                        env.extend(self._torch_env(name, num_nodes, trainer))
                    if env:
                        c["env"] = env
                    if trainer.get("resourcesPerNode"):
                        c["resources"] = copy.deepcopy(trainer["resourcesPerNode"])
                elif c.get("name") in INITIALIZER_JOBS:
                    which = "dataset" if c["name"] == "dataset-initializer" else "model"
                    ini = (spec.get("initializer") or {}).get(which) or {}
                    env = list(c.get("env") or [])
                    if ini.get("storageUri"):
                        env = [e for e in env if e["name"] != "STORAGE_URI"] + [{"name": "STORAGE_URI", "value": ini["storageUri"]}]
                    env.extend(ini.get("env") or [])
                    if env:
                        c["env"] = env
                    if (ini.get("secretRef") or {}).get("name"):
                        c.setdefault("envFrom", []).append({"secretRef": {"name": ini["secretRef"]["name"]}})
            # Volumes from volumeClaimPolicies: an emptyDir stands in for the PVC
            # (nothing provisions volumes here; the PVC object itself is created).
            have = {v["name"] for v in pspec.get("volumes") or []}
            for ct in claim_templates:
                vn = ct["metadata"]["name"]
                mounted = any(
                    m.get("name") == vn for c in containers + (pspec.get("initContainers") or []) for m in c.get("volumeMounts") or []
                )
                if mounted and vn not in have:
                    pspec.setdefault("volumes", []).append({"name": vn, "emptyDir": {}})
            # runtimePatches (v2.2+)
            for p in patches:
                for prj in ((p.get("trainingRuntimeSpec") or {}).get("template") or {}).get("spec", {}).get("replicatedJobs") or []:
                    if prj.get("name") != rj_name:
                        continue
                    ptmpl = prj.get("template") or {}
                    job_labels.update((ptmpl.get("metadata") or {}).get("labels") or {})
                    job_ann.update((ptmpl.get("metadata") or {}).get("annotations") or {})
                    ppt = (ptmpl.get("spec") or {}).get("template") or {}
                    pmeta.setdefault("labels", {}).update((ppt.get("metadata") or {}).get("labels") or {})
                    pmeta.setdefault("annotations", {}).update((ppt.get("metadata") or {}).get("annotations") or {})
                    self._apply_pod_spec_patch(pspec, ppt.get("spec") or {})
            # podTemplateOverrides (v2.1)
            for o in overrides:
                if rj_name not in [t.get("name") for t in o.get("targetJobs") or []]:
                    continue
                pmeta.setdefault("labels", {}).update((o.get("metadata") or {}).get("labels") or {})
                pmeta.setdefault("annotations", {}).update((o.get("metadata") or {}).get("annotations") or {})
                self._apply_pod_spec_patch(pspec, o.get("spec") or {})
            pspec.setdefault("restartPolicy", "OnFailure")
            if sc.unschedulable or sc.schedule_delay is not None:
                pspec.setdefault("nodeSelector", {})[SIM_SCHED_LABEL_PREFIX + st.uid[:8]] = "true"
            for idx in range(replicas):
                job_name = f"{name}-{rj_name}-{idx}"
                jsl = {
                    JOBSET_NAME: name,
                    RJ_NAME: rj_name,
                    JOB_INDEX: str(idx),
                    RJ_REPLICAS: str(replicas),
                    JOB_KEY: hashlib.sha1(f"{ns}/{job_name}".encode()).hexdigest(),
                }
                p_labels = {**(pmeta.get("labels") or {}), **job_labels, **jsl}
                p_ann = {**(pmeta.get("annotations") or {}), **job_ann, **jsl, SIM_ANNOTATION: "true"}
                completions = num_nodes if is_trainer else (jspec.get("completions") or 1)
                parallelism = num_nodes if is_trainer else (jspec.get("parallelism") or completions)
                job = {
                    "apiVersion": "batch/v1",
                    "kind": "Job",
                    "metadata": {
                        "name": job_name,
                        "namespace": ns,
                        "labels": {**job_labels, **jsl},
                        "annotations": {**job_ann, **jsl},
                        "ownerReferences": [owner],
                    },
                    "spec": {
                        **{k: v for k, v in jspec.items() if k not in ("template", "completions", "parallelism", "completionMode")},
                        "completionMode": "Indexed",
                        "completions": completions,
                        "parallelism": parallelism,
                        "backoffLimit": jspec.get("backoffLimit", 6),
                        "template": {
                            "metadata": {**pmeta, "labels": p_labels, "annotations": p_ann},
                            "spec": copy.deepcopy(pspec),
                        },
                    },
                }
                if rj.get("dependsOn"):
                    job["_dependsOn"] = rj["dependsOn"]
                jobs.append(job)
        return jobs

    @staticmethod
    def _torch_env(name: str, num_nodes: int, trainer: dict) -> list[dict]:
        return [
            {"name": "PET_NNODES", "value": str(num_nodes)},
            {"name": "PET_NPROC_PER_NODE", "value": str(trainer.get("numProcPerNode") or "auto")},
            {
                "name": "PET_NODE_RANK",
                "valueFrom": {"fieldRef": {"fieldPath": f"metadata.annotations['{COMPLETION_INDEX}']"}},
            },
            {"name": "PET_MASTER_ADDR", "value": f"{name}-node-0-0.{name}"},
            {"name": "PET_MASTER_PORT", "value": "29500"},
        ]

    @staticmethod
    def _apply_pod_spec_patch(pspec: dict, patch: dict) -> None:
        for k, v in patch.items():
            if k == "containers" or k == "initContainers":
                cur = pspec.setdefault(k, [])
                for pc in v or []:
                    tgt = next((c for c in cur if c.get("name") == pc.get("name")), None)
                    if tgt is None:
                        if k == "initContainers" or pc.get("image"):
                            cur.append(copy.deepcopy(pc))
                        continue
                    for ck, cv in pc.items():
                        if ck in ("env", "volumeMounts", "envFrom", "ports"):
                            names = {x.get("name") or x.get("mountPath") for x in cv}
                            tgt[ck] = [x for x in tgt.get(ck) or [] if (x.get("name") or x.get("mountPath")) not in names] + copy.deepcopy(
                                cv
                            )
                        elif ck != "name":
                            tgt[ck] = copy.deepcopy(cv)
            elif k in ("volumes", "imagePullSecrets", "schedulingGates", "tolerations"):
                cur = pspec.setdefault(k, [])
                names = {x.get("name") for x in v or [] if x.get("name")}
                pspec[k] = [x for x in cur if not x.get("name") or x.get("name") not in names] + copy.deepcopy(v or [])
            elif k == "nodeSelector":
                pspec.setdefault("nodeSelector", {}).update(v or {})
            else:
                pspec[k] = copy.deepcopy(v)

    def _create_pvc(self, st: _TJState, ct: dict, owner: dict) -> None:
        ns, name = st.key
        body = {
            "metadata": {
                "name": f"{ct['metadata']['name']}-{name}",
                "namespace": ns,
                "labels": {JOBSET_NAME: name},
                "ownerReferences": [owner],
            },
            "spec": copy.deepcopy(ct.get("spec") or {}),
        }
        try:
            self.core.create_namespaced_persistent_volume_claim(ns, body)
        except ApiException as e:
            if e.status != 409:
                log.warning("PVC %s: %s", body["metadata"]["name"], e.reason)

    # ------------------------------------------------------------------ Pods
    def _watch_pods(self) -> None:
        def list_fn(**kw):
            return self.core.list_pod_for_all_namespaces(label_selector=JOBSET_NAME, **kw)

        self._watch_loop(list_fn, self._on_pod)

    def _on_pod(self, typ: str, pod: dict) -> None:
        md = pod["metadata"]
        if (md.get("annotations") or {}).get(SIM_ANNOTATION) != "true":
            return
        uid = md["uid"]
        if typ == "DELETED":
            ev = self._pods_driven.pop(uid, None)
            if ev:
                ev.set()
            return
        if md.get("deletionTimestamp"):
            # The kubelet's part: the containers are gone, remove the pod.
            ev = self._pods_driven.get(uid)
            if ev:
                ev.set()
            try:
                self.core.delete_namespaced_pod(
                    md["name"],
                    md["namespace"],
                    grace_period_seconds=0,
                    body=client.V1DeleteOptions(grace_period_seconds=0, preconditions={"uid": uid}),
                )
            except ApiException as e:
                if e.status not in (404, 409):
                    log.warning("force delete %s: %s", md["name"], e.reason)
            return
        if not pod["spec"].get("nodeName"):
            return
        phase = (pod.get("status") or {}).get("phase")
        if phase in ("Succeeded", "Failed"):
            return
        with self._lock:
            if uid in self._pods_driven:
                return
            self._pods_driven[uid] = threading.Event()
            stop = self._pods_driven[uid]
        self._spawn(self._drive_pod, pod, stop, name=f"pod-{md['name']}")

    def _tj_state_for_pod(self, pod: dict) -> _TJState | None:
        md = pod["metadata"]
        key = (md["namespace"], md["labels"].get(JOBSET_NAME))
        with self._lock:
            return self._trainjobs.get(key)

    def _log_paths(self, pod: dict) -> tuple[Path, Path]:
        md = pod["metadata"]
        d = self.logs_dir / f"{md['namespace']}_{md['name']}_{md['uid']}"
        d.mkdir(parents=True, exist_ok=True)
        return d / "current.log", d / "previous.log"

    @staticmethod
    def _log_specs(pod: dict, current: Path, previous: Path) -> list[dict]:
        """The scripted log belongs to the pod's first container (``node``, or the initializer);
        any other container (e.g. a sidecar added by runtimePatches) has an empty log."""
        containers = [c["name"] for c in pod["spec"]["containers"]]
        specs = [{"containers": containers[:1], "logsFile": str(current), "previousLogsFile": str(previous), "follow": True}]
        if len(containers) > 1:
            other = current.parent / "other-containers.log"
            other.touch()
            specs.append({"logsFile": str(other), "previousLogsFile": str(other), "follow": True})
        return specs

    def _ensure_logs_resource(self, pod: dict, current: Path, previous: Path) -> None:
        md = pod["metadata"]
        body = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {
                "name": md["name"],
                "namespace": md["namespace"],
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": md["name"], "uid": md["uid"]}],
            },
            "spec": {"logs": self._log_specs(pod, current, previous)},
        }
        try:
            self.co.create_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", md["namespace"], "logs", body)
        except ApiException as e:
            if e.status != 409:
                raise

    def _wait_logs_served(self, pod: dict, timeout: float = 5) -> None:
        """Wait until the kwok controller serves this pod's log (it learns of Logs objects by watch)."""
        if not self.kwok_port:
            self._sleep(0.5)
            return
        import http.client
        import ssl

        md = pod["metadata"]
        container = pod["spec"]["containers"][0]["name"]
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        path = f"/containerLogs/{md['namespace']}/{md['name']}/{container}?limitBytes=1"
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self._stop.is_set():
            conn = http.client.HTTPSConnection("127.0.0.1", self.kwok_port, context=ctx, timeout=5)
            try:
                conn.request("GET", path)
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.05)

    @staticmethod
    def _append(path: Path, line: str) -> None:
        with open(path, "a") as f:
            f.write(f"{_cri_ts()} stdout F {line}\n")
            f.flush()

    def _patch_pod_status(self, pod: dict, status: dict) -> bool:
        md = pod["metadata"]
        try:
            self.core.patch_namespaced_pod_status(md["name"], md["namespace"], {"status": status})
            return True
        except ApiException as e:
            if e.status in (404, 409, 422):
                return False
            raise

    def _drive_pod(self, pod: dict, stop: threading.Event) -> None:
        md = pod["metadata"]
        st = self._tj_state_for_pod(pod)
        sc = st.script if st is not None else self.default_script
        rj = md["labels"].get(RJ_NAME)
        index = int(md["labels"].get(COMPLETION_INDEX, md.get("annotations", {}).get(COMPLETION_INDEX, "0")))
        is_trainer = rj in ("node", "launcher")
        lines = sc.lines if is_trainer else sc.initializer_lines
        containers = pod["spec"]["containers"]
        current, previous = self._log_paths(pod)
        current.touch()
        if not self._sleep(sc.start_delay, stop):
            return
        # Pod IPs from a per-node range, like kwok's default stages.
        ip_n = int(hashlib.sha1(md["uid"].encode()).hexdigest()[:4], 16)
        pod_ip = f"10.0.{(ip_n >> 8) % 250 + 1}.{ip_n % 250 + 2}"
        start_time = _now()

        def cstatus(state: dict, restart_count: int, ready: bool, last: dict | None = None, instance: int = 0) -> list[dict]:
            out = []
            for c in containers:
                cs = {
                    "name": c["name"],
                    "image": c.get("image", ""),
                    "imageID": "",
                    "containerID": "containerd://" + hashlib.sha256(f"{md['uid']}/{c['name']}/{instance}".encode()).hexdigest(),
                    "ready": ready,
                    "started": "running" in state,
                    "restartCount": restart_count,
                    "state": state,
                }
                if last:
                    cs["lastState"] = last
                out.append(cs)
            return out

        def conditions(ready: bool, reason: str | None = None) -> list[dict]:
            now = _now()
            conds = [
                {"type": "PodReadyToStartContainers", "status": "True", "lastTransitionTime": now},
                {"type": "Initialized", "status": "True", "lastTransitionTime": now},
                {"type": "Ready", "status": "True" if ready else "False", "lastTransitionTime": now},
                {"type": "ContainersReady", "status": "True" if ready else "False", "lastTransitionTime": now},
            ]
            if reason and not ready:
                conds[2]["reason"] = conds[3]["reason"] = reason
            return conds

        base = {
            "hostIP": "127.0.0.1",
            "hostIPs": [{"ip": "127.0.0.1"}],
            "podIP": pod_ip,
            "podIPs": [{"ip": pod_ip}],
            "startTime": start_time,
        }
        # ContainerCreating until the log is served, then Running.
        self._patch_pod_status(
            pod,
            {
                **base,
                "phase": "Pending",
                "conditions": conditions(False, "ContainersNotReady"),
                "containerStatuses": cstatus({"waiting": {"reason": "ContainerCreating"}}, 0, False),
            },
        )
        self._ensure_logs_resource(pod, current, previous)
        self._wait_logs_served(pod)
        restarts = list(sc.restarts) if is_trainer else []
        instance = 0
        last_state = None
        while True:
            started_at = _now()
            running = {"running": {"startedAt": started_at}}
            if not self._patch_pod_status(
                pod,
                {
                    **base,
                    "phase": "Running",
                    "conditions": conditions(True),
                    "containerStatuses": cstatus(running, instance, True, last_state, instance),
                },
            ):
                return
            crash_after = restarts[instance] if instance < len(restarts) else None
            emitted = 0
            for line in lines:
                if crash_after is not None and emitted >= crash_after:
                    break
                if st is not None and st.finished and st.failed:
                    break
                self._append(current, line)
                emitted += 1
                if not self._sleep(sc.line_delay, stop):
                    return
            if crash_after is not None:
                # The container crashed: rotate its log and start the next instance.
                finished_at = _now()
                term = {
                    "terminated": {
                        "exitCode": sc.exit_code or 1,
                        "reason": "Error",
                        "startedAt": started_at,
                        "finishedAt": finished_at,
                        "containerID": "containerd://"
                        + hashlib.sha256(f"{md['uid']}/{containers[0]['name']}/{instance}".encode()).hexdigest(),
                    }
                }
                instance += 1
                os.replace(current, previous)
                self._patch_pod_status(
                    pod,
                    {
                        **base,
                        "phase": "Running",
                        "conditions": conditions(False, "ContainersNotReady"),
                        "containerStatuses": cstatus(
                            {"waiting": {"reason": "CrashLoopBackOff", "message": "back-off restarting failed container"}},
                            instance,
                            False,
                            term,
                            instance - 1,
                        ),
                    },
                )
                last_state = term
                if not self._sleep(sc.restart_delay, stop):
                    return
                current.touch()
                continue
            break
        if sc.outcome == "run_forever" and is_trainer:
            while self._sleep(1.0, stop):
                pass
            return
        if not self._sleep(sc.finish_delay, stop):
            return
        fail = sc.outcome == "fail" and is_trainer and index == 0
        if st is not None and st.failing and not fail:
            return
        finished_at = _now()
        if fail and st is not None:
            st.failing = True
            # No retry of the failed pod: the Job fails at once (see module docs).
            job_name = f"{md['labels'][JOBSET_NAME]}-{rj}-{md['labels'].get(JOB_INDEX, '0')}"
            self._patch_job(md["namespace"], job_name, {"spec": {"backoffLimit": 0}})
        code = sc.exit_code if fail else 0
        term = {
            "terminated": {
                "exitCode": code,
                "reason": "Error" if fail else "Completed",
                "startedAt": started_at,
                "finishedAt": finished_at,
                "containerID": "containerd://" + hashlib.sha256(f"{md['uid']}/{containers[0]['name']}/{instance}".encode()).hexdigest(),
            }
        }
        self._patch_pod_status(
            pod,
            {
                **base,
                "phase": "Failed" if fail else "Succeeded",
                "conditions": conditions(False, "PodFailed" if fail else "PodCompleted"),
                "containerStatuses": cstatus(term, instance, False, last_state, instance),
            },
        )
        if fail and st is not None:
            self._set_condition(st, "Failed", "True", sc.fail_reason, sc.fail_message)
            st.failed = True
            with st.changed:
                st.changed.notify_all()
