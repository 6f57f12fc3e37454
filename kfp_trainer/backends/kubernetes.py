"""The Kubernetes backend: runs TrainJobs through a cluster's API server.

A thin facade over :mod:`kfp_trainer.backends.kube`: ``discovery`` (Trainer API version,
runtimes, namespace), ``lifecycle`` (create, adopt, replace, delete), ``cache``/``watch``
(watches), ``logs`` (the trainer's log) and ``inspect`` (blockers, failure diagnosis); each
submitted job's state lives in its handle, ``job`` (:class:`~.kube.job.KubeJob`). Every
API call goes through :func:`kfp_trainer.backends.kube.api.call` (one error mapping, one retry
policy). Nothing polls: the job, its pods and the warning events are watched.

Example:
    >>> backend = KubernetesBackend.from_config()          # doctest: +SKIP
    >>> info = backend.resolve_runtime(TrainJobInputs(runtime="torch-distributed"))  # doctest: +SKIP
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..cancel import Stop
from ..errors import KfpTrainerError
from ..jobstatus import JobRef
from ..kube_types import TrainJob
from ..spec import ApiVersion, TrainJobInputs
from .base import Backend, RuntimeInfo, Submission
from .kube import discovery
from .kube.api import RetryPolicy
from .kube.discovery import load_api_client
from .kube.job import JobSettings, KubeJob, delete_job
from .kube.leftovers import leftovers_message
from .kube.lifecycle import Lifecycle

if TYPE_CHECKING:
    from .kube.client import Client as ApiClient

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
        self.job_settings = JobSettings(watch_timeout=watch_timeout, heartbeat=heartbeat, log_read_timeout=log_read_timeout, policy=policy)

    @classmethod
    def from_config(
        cls, kubeconfig: str | None = None, *, fail_fast: bool = False, stop: Stop | None = None, **kwargs: Any
    ) -> KubernetesBackend:
        """Backend for the cluster of the pod's service account or the kubeconfig.

        Given a ``kubeconfig``, jobs go to its current context's namespace unless ``namespace``
        is given (never the pod's or the default kubeconfig's). ``fail_fast`` (the command
        line): raise a one-line :class:`~kfp_trainer.errors.ClusterUnreachableError` when no
        cluster is configured or its API server does not answer the first request, instead of
        retrying. The connection is bounded (a connect timeout); a stop signal waits for it, and
        ``stop`` (the run's token) makes a failure to connect after a stop signal a cancel, not
        an unreachable cluster.
        """
        from .kube.connect import kubeconfig_namespace

        if kwargs.get("namespace") is None:
            kwargs["namespace"] = kubeconfig_namespace(kubeconfig)
        if fail_fast:
            from .kube.connect import connect

            token = stop or Stop()
            try:
                api = connect(kubeconfig, stopped=token.check)
            except KfpTrainerError:
                token.check()
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
        api_version = self.detect_api_version(namespace, runtime=(inputs.runtime_kind, inputs.runtime))
        return discovery.resolve_runtime(self.api, inputs, namespace=namespace, api_version=api_version, policy=self.policy)

    # ------------------------------------------------------------------ lifecycle
    def submit(self, manifest: dict[str, Any], *, runtime: RuntimeInfo | None = None, stop: Stop | None = None) -> Submission:
        """Create the TrainJob, adopt this task's earlier one, or replace a failed or stale one.

        The submission's ``job`` (:class:`~.kube.job.KubeJob`) keeps ``runtime`` and the job as
        created or adopted; the backend keeps nothing of it.
        """
        namespace = manifest["metadata"].get("namespace") or self.default_namespace()
        manifest = self.lifecycle.owned_by_run(manifest, namespace)

        def handle(ref: JobRef, known: TrainJob) -> KubeJob:
            return KubeJob(ref, api=self.api, lifecycle=self.lifecycle, settings=self.job_settings, runtime=runtime, known=known)

        return self.lifecycle.submit(manifest, namespace, handle=handle, stop=stop)

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
        return delete_job(self.lifecycle, ref, wait=wait)
