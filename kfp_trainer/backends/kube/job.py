"""One submitted TrainJob on a cluster: its handle (:class:`KubeJob`), with all it keeps.

:meth:`KubernetesBackend.submit <kfp_trainer.backends.kubernetes.KubernetesBackend.submit>`
makes one per submitted job with the runtime the manifest was rendered for and the job as
created or adopted; the status watch starts from that object, and the pod and event watches
(:class:`~kfp_trainer.backends.kube.inspect.JobTracker`) are opened on first need and closed
by :meth:`KubeJob.release`. It is given what it uses -- the API client, the
:class:`~.lifecycle.Lifecycle` that deletes it and the :class:`JobSettings` -- and reads nothing
of the backend. Several jobs followed from one backend share nothing but its client.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, cast

from ...jobstatus import JobRef, JobStatus, Phase
from ...kube_types import TrainJob
from ...spec import GROUP, PLURAL, VERSION
from ..base import Blocker, JobHandle, LogSink, RuntimeInfo, trainjob_status
from ..deletion import deletion_time
from . import inspect
from .api import RetryPolicy
from .cache import EventQueue
from .leftovers import leftovers_message
from .lifecycle import Lifecycle
from .logs import NodeLogFollower

if TYPE_CHECKING:
    from .client import Client as ApiClient

__all__ = ["JobSettings", "KubeJob", "delete_job"]


@dataclass(frozen=True)
class JobSettings:
    """How a job's watches and log streams behave (the backend's settings, see :class:`~..kubernetes.KubernetesBackend`)."""

    watch_timeout: int = 300
    heartbeat: float = 0.2
    log_read_timeout: float = 300.0
    policy: RetryPolicy = field(default_factory=RetryPolicy)


def delete_job(lifecycle: Lifecycle, ref: JobRef, *, wait: float = 30.0) -> str:
    """Delete the TrainJob (background propagation) and wait, bounded, until it and its pods are gone.

    Returns:
        What is left and how to remove it; empty when everything is gone.
    """
    left = lifecycle.delete(ref, wait=wait)
    return leftovers_message(ref, left, wait) if left else ""


class KubeJob(JobHandle):
    """The handle of one TrainJob on a cluster.

    Args:
        ref: The job.
        api: The API client.
        lifecycle: What deletes it.
        settings: Its watches' and log streams' settings.
        runtime: What its manifest was rendered for (None: a ``node`` job of one pod).
        known: The job as created or adopted (its watch starts there), if known.
    """

    def __init__(self, ref: JobRef, *, api: ApiClient, lifecycle: Lifecycle, settings: JobSettings = JobSettings(),
                 runtime: RuntimeInfo | None = None, known: TrainJob | None = None) -> None:  # fmt: skip
        super().__init__(ref)
        self.api = api
        self.lifecycle = lifecycle
        self.settings = settings
        self.runtime = runtime
        if known is not None and ref.uid and known["metadata"].get("uid") != ref.uid:
            known = None
        self.known = known
        self.created = str(((known or {}).get("metadata") or {}).get("creationTimestamp") or "")
        self.deleted_at = ""  # the TrainJob's deletionTimestamp once its watch saw one: pods made since are not followed
        self._tracker: inspect.JobTracker | None = None
        self._lock = threading.Lock()  # the status watch and the log thread both ask for the tracker

    @property
    def trainer_job(self) -> str:
        """The replicated job whose pods run the trainer."""
        return self.runtime.trainer_job if self.runtime else "node"

    def tracker(self) -> inspect.JobTracker:
        """The job's pod and event watches, opened on first use."""
        with self._lock:
            if self._tracker is None:
                self._tracker = inspect.JobTracker(
                    self.api, self.ref, created=self.created, policy=self.settings.policy, timeout_seconds=self.settings.watch_timeout
                )
            return self._tracker

    def watch(self) -> Iterator[JobStatus | None]:
        """Status changes of the TrainJob (one watch, from the job as created or adopted); ``None`` = heartbeat."""
        ref, known, settings = self.ref, self.known, self.settings
        version = str(known["metadata"].get("resourceVersion") or "") or None if known else None
        events = EventQueue(
            self.api,
            f"/apis/{GROUP}/{VERSION}/namespaces/{ref.namespace}/{PLURAL}",
            [("fieldSelector", f"metadata.name={ref.name}")],
            resource_version=version,
            timeout_seconds=settings.watch_timeout,
            policy=settings.policy,
            name=f"watch-{ref.name}",
        )
        last: JobStatus | None = None
        if known is not None:  # the job as created or adopted: its state now, before any change
            last = self._observe(known)
            if last.phase is Phase.RUNNING:
                self.tracker().started()
            yield last
            if last.phase.finished:
                return
        for event in events.events(settings.heartbeat):
            if event is None:
                yield None
                continue
            status = self._observe(_object(ref, event))
            if (
                last is None
                or (status.phase, status.reason, status.message) != (last.phase, last.reason, last.message)
                or status.raw != last.raw
            ):
                last = status
                if status.phase is Phase.RUNNING:
                    self.tracker().started()
                elif status.phase is Phase.SUSPENDED:
                    self.tracker().suspended()
                yield status

    def _observe(self, obj: TrainJob | None) -> JobStatus:
        """The status of the job as stored (None: gone); remembers when its deletion began."""
        self.deleted_at = self.deleted_at or deletion_time(obj)
        return trainjob_status(obj, self.trainer_job)

    def blockers(self) -> list[Blocker]:
        """Warning events (on the TrainJob, its JobSet and Jobs) and pod states that keep the job from starting."""
        return inspect.blockers(self.tracker())

    def queue_notes(self) -> list[str]:
        """What Kueue said about the job's Workload (its events) since the last call, each message once."""
        return inspect.queue_notes(self.tracker())

    def pod_notes(self) -> list[str]:
        """The job's pods replaced (deleted, evicted, failed) or restarted since the last call, each once.

        Read from the pod watch the log followers keep (:func:`inspect.pod_notes`).
        """
        return inspect.pod_notes(self.tracker())

    def follow_logs(self, *, nodes: str, sink: LogSink, stop: threading.Event) -> None:
        """Stream node ``nodes`` ("0", "3", or "all") of the trainer to ``sink`` until done or stopped."""
        replicated_job = self.trainer_job
        count = self.runtime.nodes if self.runtime and replicated_job == "node" else 1
        indices = list(range(count)) if nodes == "all" else [int(nodes)]
        pods = self.tracker().pods()
        followers = [
            NodeLogFollower(
                self.api,
                namespace=self.ref.namespace,
                job=self.ref.name,
                replicated_job=replicated_job,
                index=index,
                sink=sink,
                stop=stop,
                source=f"{replicated_job}-{index}",
                pods=pods,
                deleted_at=lambda: self.deleted_at,
                read_timeout=self.settings.log_read_timeout,
                policy=self.settings.policy,
            )
            for index in indices
        ]
        threads = [threading.Thread(target=f.run, name=f"logs-{f.source}", daemon=True) for f in followers]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads) and not stop.wait(0.25):
            pass
        pods.wake()  # followers waiting on the pod watch see ``stop`` at once
        # The job has ended (or is being cancelled): a stream still open is cut and the follower
        # reads the rest once from its cursor -- a server can take seconds to end such a stream
        # on its own. A follower that already read its container to the end makes no request.
        for follower in followers:
            follower.interrupt()
        for thread in threads:
            thread.join()

    def diagnose(self, *, tail: int = 40) -> str:
        """Failed pods, recent events and the failing container's last log lines."""
        return inspect.diagnose(self.api, self.ref, tail=tail, created=self.created, policy=self.settings.policy)

    def delete(self, *, wait: float = 30.0) -> str:
        """Stop the watches, delete the TrainJob and wait, bounded, until it and its pods are gone.

        Returns:
            What is left and how to remove it; empty when everything is gone.
        """
        self.release()
        return delete_job(self.lifecycle, self.ref, wait=wait)

    def request_delete(self) -> None:
        """Send the TrainJob's deletion (background propagation) and return; :meth:`delete` waits for it."""
        self.lifecycle.request_delete(self.ref)

    def release(self) -> None:
        """Stop the watches kept for the job (pods, events)."""
        with self._lock:
            tracker, self._tracker = self._tracker, None
        if tracker is not None:
            tracker.close()

    def inspect_hint(self) -> str:
        """Kubectl commands to look at the job."""
        return inspect.inspect_hint(self.ref)


def _object(ref: JobRef, event: tuple[str, dict[str, Any]]) -> TrainJob | None:
    """The job as stored after one watch event (a LIST, or a change of one object); None when it is gone."""
    kind, obj = event
    if kind == "LIST":
        items: list[TrainJob] = [i for i in obj.get("items") or [] if not ref.uid or i["metadata"].get("uid") == ref.uid]
        return items[0] if items else None
    if ref.uid and obj["metadata"].get("uid") != ref.uid:
        return None  # a different object with the same name: ours is gone
    return None if kind == "DELETED" else cast(TrainJob, obj)  # the watch is on one TrainJob
