"""The Kubernetes backend: runs TrainJobs through a cluster's API server.

A thin facade over :mod:`kfp_trainer.backends.kube`: ``discovery`` (Trainer API version,
runtimes, namespace), ``lifecycle`` (create, adopt, replace, delete), ``cache``/``watch``
(watches), ``logs`` (the trainer's log) and ``inspect`` (blockers, failure diagnosis). Every
API call goes through :func:`kfp_trainer.backends.kube.api.call` (one error mapping, one retry
policy). Nothing polls: the job, its pods and the warning events are watched.

Example:
    >>> backend = KubernetesBackend.from_config()          # doctest: +SKIP
    >>> info = backend.resolve_runtime(TrainJobInputs(runtime="torch-distributed"))  # doctest: +SKIP
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from .. import cancel
from ..errors import KfpTrainerError
from ..jobstatus import JobRef, JobStatus, Phase
from ..spec import GROUP, PLURAL, VERSION, ApiVersion, TrainJobInputs
from .base import Backend, Blocker, LogSink, RuntimeInfo, Submission, trainjob_status
from .kube import discovery, inspect
from .kube.api import RetryPolicy
from .kube.cache import EventQueue
from .kube.discovery import load_api_client
from .kube.lifecycle import Lifecycle, leftovers_message
from .kube.logs import NodeLogFollower

if TYPE_CHECKING:
    from .kube.rest import Client as ApiClient

__all__ = ["KubernetesBackend", "load_api_client"]


class KubernetesBackend(Backend):
    """Runs TrainJobs on a Kubernetes cluster with Kubeflow Trainer installed.

    Args:
        api: The API client.
        namespace: Namespace for jobs whose inputs name none (default: the pod's, else the
            kubeconfig context's).
        api_version: ``auto`` (ask the cluster), ``v2.1`` or ``v2.2``.
        watch_timeout: Server-side timeout of each watch request: a quiet job costs one
            request per watch per period.
        policy: Retries of transient API errors.
        heartbeat: Seconds between the status watch's heartbeats (no request involved); the
            launcher looks for a stop signal at each, so keep it short.
        log_read_timeout: A log stream quiet this long is re-opened from its cursor.
        replace_timeout: How long an earlier try's job may take to go before replacing it.
    """

    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str | None = None,
        api_version: str = "auto",
        watch_timeout: int = 300,
        policy: RetryPolicy = RetryPolicy(),
        heartbeat: float = 0.2,
        log_read_timeout: float = 300.0,
        replace_timeout: float = 120.0,
    ) -> None:
        self.api = api
        self._namespace = namespace
        self._api_version = api_version
        self.watch_timeout = watch_timeout
        self.policy = policy
        self.heartbeat = heartbeat
        self.log_read_timeout = log_read_timeout
        self.lifecycle = Lifecycle(api, policy=policy, replace_timeout=replace_timeout)
        self.runtime: RuntimeInfo | None = None  # resolved last; each submitted job keeps its own
        # Per job, by (namespace, name): one backend can follow several jobs at once.
        self._runtimes: dict[tuple[str, str], RuntimeInfo] = {}
        self._trackers: dict[tuple[str, str], inspect.JobTracker] = {}

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, *, fail_fast: bool = False, **kwargs: Any) -> KubernetesBackend:
        """Backend for the cluster of the pod's service account or the kubeconfig.

        ``fail_fast`` (the command line): open the first connection now, and raise a one-line
        :class:`~kfp_trainer.errors.ClusterUnreachableError` when no cluster is configured or
        its API server cannot be reached, instead of retrying; jobs go to ``kubeconfig``'s
        context namespace unless ``namespace`` is given.
        """
        if fail_fast:
            from .kube.connect import connect, kubeconfig_namespace

            kwargs.setdefault("namespace", kubeconfig_namespace(kubeconfig))
            try:
                api = connect(kubeconfig)  # bounded (a connect timeout); a stop signal waits for it
            except KfpTrainerError:
                cancel.check()  # a stop signal while connecting is a cancel, not an unreachable cluster
                raise
            return cls(api, **kwargs)
        return cls(load_api_client(kubeconfig), **kwargs)

    # ------------------------------------------------------------------ discovery
    def default_namespace(self) -> str:
        """The configured namespace, else the launcher pod's, else the kubeconfig context's, else ``default``."""
        return self._namespace or discovery.default_namespace()

    def detect_api_version(self, namespace: str | None = None, *, runtime: tuple[str, str] | None = None) -> ApiVersion:
        """The Trainer API the cluster serves (``v2.2`` or ``v2.1``), unless one was forced."""
        if self._api_version not in ("v2.1", "v2.2"):  # asked once per backend
            self._api_version = discovery.detect_api_version(
                self.api, namespace=namespace or self.default_namespace(), policy=self.policy, runtime=runtime
            )
        return self._api_version  # type: ignore[return-value]

    def resolve_runtime(self, inputs: TrainJobInputs) -> RuntimeInfo:
        """Fetch the referenced runtime; raise :class:`RuntimeNotFoundError` listing those that exist."""
        namespace = inputs.namespace or self.default_namespace()
        cancel.check()  # each request here waits for its answer: a stop signal ends the preparation between them
        api_version = self.detect_api_version(namespace, runtime=(inputs.runtime_kind, inputs.runtime))
        cancel.check()
        self.runtime = discovery.resolve_runtime(self.api, inputs, namespace=namespace, api_version=api_version, policy=self.policy)
        return self.runtime

    # ------------------------------------------------------------------ lifecycle
    def submit(self, manifest: dict[str, Any], *, runtime: RuntimeInfo | None = None) -> Submission:
        """Create the TrainJob, adopt this task's earlier one, or replace a failed or stale one."""
        namespace = manifest["metadata"].get("namespace") or self.default_namespace()
        runtime = runtime or self.runtime  # the runtime this manifest was rendered for
        if runtime is not None:
            self._runtimes[(namespace, manifest["metadata"]["name"])] = runtime
        return self.lifecycle.submit(manifest, namespace)

    def reclaim(self, manifest: dict[str, Any], *, wait: float = 30.0) -> str | None:
        """After a cancel during :meth:`submit`: delete this task's job if the create got through."""
        namespace = manifest["metadata"].get("namespace") or self.default_namespace()
        found = self.lifecycle.reclaim(manifest, namespace, wait=wait)
        if found is None:
            return None
        ref, left = found
        return f"deleted TrainJob {ref}" + ("\n" + leftovers_message(ref, left, wait) if left else "")

    def delete(self, ref: JobRef, *, wait: float = 30.0) -> str:
        """Delete the TrainJob (background propagation) and wait, bounded, until it and its pods are gone.

        Returns:
            What is left and how to remove it; empty when everything is gone.
        """
        self.release(ref)
        left = self.lifecycle.delete(ref, wait=wait)
        return leftovers_message(ref, left, wait) if left else ""

    def release(self, ref: JobRef) -> None:
        """Stop the watches kept for ``ref`` (pods, events) and forget what was kept for it."""
        self._runtimes.pop((ref.namespace, ref.name), None)
        tracker = self._trackers.pop((ref.namespace, ref.name), None)
        if tracker is not None:
            tracker.close()

    def _tracker(self, ref: JobRef) -> inspect.JobTracker:
        key = (ref.namespace, ref.name)
        if key not in self._trackers:
            created = ((self.lifecycle.seen.get(key) or {}).get("metadata") or {}).get("creationTimestamp") or ""
            self._trackers[key] = inspect.JobTracker(self.api, ref, created=created, policy=self.policy, timeout_seconds=self.watch_timeout)
        return self._trackers[key]

    def _runtime(self, ref: JobRef) -> RuntimeInfo | None:
        """The runtime ``ref`` was submitted with (else the one resolved last)."""
        return self._runtimes.get((ref.namespace, ref.name)) or self.runtime

    # ------------------------------------------------------------------ following
    def watch(self, ref: JobRef, *, resource_version: str | None = None) -> Iterator[JobStatus | None]:
        """Status changes of one TrainJob (one watch, resumed from resourceVersion); ``None`` = heartbeat."""
        runtime = self._runtime(ref)
        trainer_job = runtime.trainer_job if runtime else "node"
        known = self.lifecycle.seen.get((ref.namespace, ref.name)) if resource_version is None else None
        if known is not None and ref.uid and known["metadata"].get("uid") != ref.uid:
            known = None
        version = resource_version or (str(known["metadata"].get("resourceVersion") or "") or None if known else None)
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{ref.namespace}/{PLURAL}"
        events = EventQueue(
            self.api,
            path,
            [("fieldSelector", f"metadata.name={ref.name}")],
            resource_version=version,
            timeout_seconds=self.watch_timeout,
            policy=self.policy,
            name=f"watch-{ref.name}",
        )
        last: JobStatus | None = None
        if known is not None:  # the job as created or adopted: its state now, before any change
            last = trainjob_status(known, trainer_job)
            if last.phase is Phase.RUNNING:
                self._tracker(ref).started()
            yield last
            if last.phase.finished:
                return
        for event in events.events(self.heartbeat):
            if event is None:
                yield None
                continue
            status = self._status(ref, event, trainer_job)
            if (
                last is None
                or (status.phase, status.reason, status.message) != (last.phase, last.reason, last.message)
                or status.raw != last.raw
            ):
                last = status
                if status.phase is Phase.RUNNING:
                    self._tracker(ref).started()
                yield status

    @staticmethod
    def _status(ref: JobRef, event: tuple[str, dict[str, Any]], trainer_job: str) -> JobStatus:
        kind, obj = event
        if kind == "LIST":
            items = [i for i in obj.get("items") or [] if not ref.uid or i["metadata"].get("uid") == ref.uid]
            return trainjob_status(items[0] if items else None, trainer_job)
        if ref.uid and obj["metadata"].get("uid") != ref.uid:
            return trainjob_status(None, trainer_job)  # a different object with the same name: ours is gone
        return trainjob_status(None if kind == "DELETED" else obj, trainer_job)

    def blockers(self, ref: JobRef) -> list[Blocker]:
        """Warning events (on the TrainJob, its JobSet and Jobs) and pod states that keep the job from starting."""
        return inspect.blockers(self._tracker(ref))

    def queue_notes(self, ref: JobRef) -> list[str]:
        """What Kueue said about the job's Workload (its events) since the last call, each message once."""
        return inspect.queue_notes(self._tracker(ref))

    def follow_logs(self, ref: JobRef, *, nodes: str, sink: LogSink, stop: threading.Event) -> None:
        """Stream node ``nodes`` ("0", "3", or "all") of the trainer to ``sink`` until done or stopped."""
        runtime = self._runtime(ref)
        replicated_job = runtime.trainer_job if runtime else "node"
        count = runtime.nodes if runtime and replicated_job == "node" else 1
        indices = list(range(count)) if nodes == "all" else [int(nodes)]
        pods = self._tracker(ref).pods()
        followers = [
            NodeLogFollower(
                self.api,
                namespace=ref.namespace,
                job=ref.name,
                replicated_job=replicated_job,
                index=index,
                sink=sink,
                stop=stop,
                source=f"{replicated_job}-{index}",
                pods=pods,
                read_timeout=self.log_read_timeout,
                policy=self.policy,
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

    def diagnose(self, ref: JobRef, *, tail: int = 40) -> str:
        """Failed pods, recent events and the failing container's last log lines."""
        created = ((self.lifecycle.seen.get((ref.namespace, ref.name)) or {}).get("metadata") or {}).get("creationTimestamp") or ""
        return inspect.diagnose(self.api, ref, tail=tail, created=created, policy=self.policy)

    def inspect_hint(self, ref: JobRef) -> str:
        """Kubectl commands to look at the job."""
        return inspect.inspect_hint(ref)
