"""The Kubernetes backend: runs TrainJobs through a cluster's API server.

Talks to the API with the official ``kubernetes`` client; every call goes through
:func:`~kfp_trainer.backends.kube_api.call` (one error mapping, one retry policy).

Example:
    >>> backend = KubernetesBackend.from_config()          # doctest: +SKIP
    >>> info = backend.resolve_runtime(TrainJobInputs(runtime="torch-distributed"))  # doctest: +SKIP
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from kubernetes import client, config
from kubernetes.client import ApiClient

from ..errors import RuntimeNotFoundError, UserError
from ..spec import GROUP, PLURAL, VERSION, ApiVersion, TrainJobInputs
from .base import Blocker, JobRef, JobStatus, LogSink, Phase, RuntimeInfo, Submission, check_ownership, trainjob_status
from .kube_api import Conflict, NotFound, RetryPolicy, call
from .kube_logs import NodeLogFollower
from .kube_watch import request, watch

log = logging.getLogger(__name__)
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")
IMAGE_ERRORS = {
    "ErrImagePull": False,
    "ImagePullBackOff": False,
    "InvalidImageName": True,
    "CreateContainerConfigError": False,
    "CreateContainerError": False,
    "ErrImageNeverPull": True,
}
CANNOT_START_EVENTS = ("TrainJobResourcesCreationFailed",)


def load_api_client(kubeconfig: str | None = None, context: str | None = None) -> ApiClient:
    """An API client from the pod's service account, else from a kubeconfig file."""
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        config.load_incluster_config()
        return ApiClient()
    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    return ApiClient(configuration)


class KubernetesBackend:
    """Runs TrainJobs on a Kubernetes cluster with Kubeflow Trainer installed."""

    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str | None = None,
        api_version: str = "auto",
        watch_timeout: int = 15,
        policy: RetryPolicy = RetryPolicy(),
    ) -> None:
        self.api = api
        self._namespace = namespace
        self._api_version = api_version
        self.watch_timeout = watch_timeout
        self.policy = policy
        self.custom = client.CustomObjectsApi(api)
        self.core = client.CoreV1Api(api)
        self.runtime: RuntimeInfo | None = None

    @classmethod
    def from_config(cls, kubeconfig: str | None = None, **kwargs: Any) -> KubernetesBackend:
        """Backend for the cluster of the pod's service account or the kubeconfig."""
        return cls(load_api_client(kubeconfig), **kwargs)

    # ------------------------------------------------------------------ discovery
    def default_namespace(self) -> str:
        """The launcher pod's own namespace, else the kubeconfig context's, else ``default``."""
        if self._namespace:
            return self._namespace
        if SA_NAMESPACE.exists():
            return SA_NAMESPACE.read_text().strip()
        try:
            _, active = config.list_kube_config_contexts()
            return (active.get("context") or {}).get("namespace") or "default"
        except (config.ConfigException, OSError, TypeError):
            return "default"

    def detect_api_version(self) -> ApiVersion:
        """The Trainer API the cluster serves: ``v2.2`` (runtimePatches) or ``v2.1`` (podTemplateOverrides).

        Reads the OpenAPI v3 document (open to every authenticated user, unlike the CRD).
        """
        if self._api_version in ("v2.1", "v2.2"):
            return self._api_version  # type: ignore[return-value]
        doc = call(
            request,
            self.api,
            f"/openapi/v3/apis/{GROUP}/{VERSION}",
            [],
            timeout=30,
            what="read the Trainer OpenAPI schema",
            policy=self.policy,
        )
        schemas = ((doc or {}).get("components") or {}).get("schemas") or {}
        for key, schema in schemas.items():
            if key.endswith(".TrainJob"):
                fields = ((schema.get("properties") or {}).get("spec") or {}).get("properties") or {}
                if "runtimePatches" in fields:
                    self._api_version = "v2.2"
                elif "podTemplateOverrides" in fields:
                    self._api_version = "v2.1"
                else:
                    raise UserError(
                        "The cluster's TrainJob API has neither runtimePatches (Trainer v2.2+) nor "
                        "podTemplateOverrides (v2.1); set api_version explicitly."
                    )
                return self._api_version  # type: ignore[return-value]
        raise UserError(f"The cluster serves no TrainJob kind in {GROUP}/{VERSION}: is Kubeflow Trainer installed?")

    def _available_runtimes(self, namespace: str) -> list[str]:
        names = []
        for kind, fn, args in (
            ("ClusterTrainingRuntime", self.custom.list_cluster_custom_object, (GROUP, VERSION, "clustertrainingruntimes")),
            ("TrainingRuntime", self.custom.list_namespaced_custom_object, (GROUP, VERSION, namespace, "trainingruntimes")),
        ):
            try:
                items = call(fn, *args, what=f"list {kind}s", policy=self.policy).get("items") or []
            except UserError:
                names.append(f"({kind}s: not allowed to list)")
                continue
            names += [f"{kind}/{i['metadata']['name']}" for i in items]
        return names

    def resolve_runtime(self, inputs: TrainJobInputs) -> RuntimeInfo:
        """Fetch the referenced runtime; raise :class:`RuntimeNotFoundError` listing those that exist."""
        namespace = inputs.namespace or self.default_namespace()
        api_version = self.detect_api_version()
        try:
            if inputs.runtime_kind == "TrainingRuntime":
                runtime = call(
                    self.custom.get_namespaced_custom_object,
                    GROUP,
                    VERSION,
                    namespace,
                    "trainingruntimes",
                    inputs.runtime,
                    what=f"get TrainingRuntime {namespace}/{inputs.runtime}",
                    policy=self.policy,
                )
            else:
                runtime = call(
                    self.custom.get_cluster_custom_object,
                    GROUP,
                    VERSION,
                    "clustertrainingruntimes",
                    inputs.runtime,
                    what=f"get ClusterTrainingRuntime {inputs.runtime}",
                    policy=self.policy,
                )
        except NotFound:
            available = self._available_runtimes(namespace)
            raise RuntimeNotFoundError(
                f"runtime: {inputs.runtime_kind} {inputs.runtime!r} does not exist"
                + (f" in namespace {namespace}" if inputs.runtime_kind == "TrainingRuntime" else "")
                + f". Available: {', '.join(available) or 'none (is Kubeflow Trainer installed?)'}"
            ) from None
        self.runtime = RuntimeInfo.from_runtime(
            runtime, name=inputs.runtime, kind=inputs.runtime_kind, api_version=api_version, num_nodes=inputs.num_nodes
        )
        return self.runtime

    # ------------------------------------------------------------------ lifecycle
    def _get(self, ref: JobRef) -> dict[str, Any]:
        return call(
            self.custom.get_namespaced_custom_object,
            GROUP,
            VERSION,
            ref.namespace,
            PLURAL,
            ref.name,
            what=f"get TrainJob {ref}",
            policy=self.policy,
        )

    def _create(self, namespace: str, manifest: dict[str, Any]) -> dict[str, Any]:
        return call(
            self.custom.create_namespaced_custom_object,
            GROUP,
            VERSION,
            namespace,
            PLURAL,
            manifest,
            field_validation="Strict",
            what=f"create TrainJob {namespace}/{manifest['metadata']['name']}",
            policy=self.policy,
        )

    def submit(self, manifest: dict[str, Any]) -> Submission:
        """Create the TrainJob, adopt this task's earlier one, or replace it if it Failed."""
        namespace = manifest["metadata"].get("namespace") or self.default_namespace()
        manifest = {**manifest, "metadata": {**manifest["metadata"], "namespace": namespace}}
        name = manifest["metadata"]["name"]
        ref = JobRef(namespace, name)
        try:
            created = self._create(namespace, manifest)
            return Submission(JobRef(namespace, name, created["metadata"]["uid"]), adopted=False)
        except Conflict:
            pass
        existing = self._get(ref)
        check_ownership(manifest, existing, remedy=f"delete it: kubectl delete trainjob -n {namespace} {name}")
        if trainjob_status(existing).phase is Phase.FAILED:
            log.warning("TrainJob %s from an earlier try failed; replacing it", ref)
            self.delete(ref, wait=120.0)
            created = self._create(namespace, manifest)
            return Submission(JobRef(namespace, name, created["metadata"]["uid"]), adopted=False, replaced=True)
        return Submission(JobRef(namespace, name, existing["metadata"]["uid"]), adopted=True)

    def watch(self, ref: JobRef, *, resource_version: str | None = None) -> Iterator[JobStatus | None]:
        """Status changes of one TrainJob (watch, resumed from resourceVersion); ``None`` = heartbeat."""
        trainer_job = self.runtime.trainer_job if self.runtime else "node"
        path = f"/apis/{GROUP}/{VERSION}/namespaces/{ref.namespace}/{PLURAL}"
        last: JobStatus | None = None
        for event in watch(
            self.api,
            path,
            [("fieldSelector", f"metadata.name={ref.name}")],
            timeout_seconds=self.watch_timeout,
            policy=self.policy,
            resource_version=resource_version,
        ):
            if event is None:
                yield None
                continue
            kind, obj = event
            if obj is not None and ref.uid and obj["metadata"].get("uid") != ref.uid:
                obj = None  # a different object with the same name: ours is gone
            status = trainjob_status(None if kind in ("DELETED", "ABSENT") else obj, trainer_job)
            if (
                last is None
                or (status.phase, status.reason, status.message) != (last.phase, last.reason, last.message)
                or status.raw != last.raw
            ):
                last = status
                yield status

    def blockers(self, ref: JobRef) -> list[Blocker]:
        """Warning events and pod states that keep the job from starting."""
        found: list[Blocker] = []
        events = call(
            self.core.list_namespaced_event,
            ref.namespace,
            field_selector=f"involvedObject.name={ref.name},type=Warning",
            what=f"list events of {ref}",
            policy=self.policy,
        )
        for event in events.items:
            if event.reason in CANNOT_START_EVENTS:
                found.append(Blocker(event.reason, event.message or "", fatal=True))
        for pod in self._pods(ref):
            status = pod.status
            if status.phase != "Pending":
                continue
            for condition in status.conditions or []:
                if condition.type == "PodScheduled" and condition.status == "False" and condition.reason == "Unschedulable":
                    found.append(Blocker("Unschedulable", f"pod {pod.metadata.name}: {condition.message}"))
            for cs in (status.container_statuses or []) + (status.init_container_statuses or []):
                waiting = cs.state.waiting if cs.state else None
                if waiting and waiting.reason in IMAGE_ERRORS:
                    found.append(
                        Blocker(
                            waiting.reason,
                            f"pod {pod.metadata.name} container {cs.name}: {waiting.message or ''}",
                            fatal=IMAGE_ERRORS[waiting.reason],
                        )
                    )
        return found

    def _pods(self, ref: JobRef) -> list[Any]:
        return call(
            self.core.list_namespaced_pod,
            ref.namespace,
            label_selector=f"jobset.sigs.k8s.io/jobset-name={ref.name}",
            what=f"list pods of {ref}",
            policy=self.policy,
        ).items

    def follow_logs(self, ref: JobRef, *, nodes: str, sink: LogSink, stop: threading.Event) -> None:
        """Stream node ``nodes`` ("0", "3", or "all") of the trainer to ``sink`` until done or stopped."""
        replicated_job = self.runtime.trainer_job if self.runtime else "node"
        count = self.runtime.nodes if self.runtime and replicated_job == "node" else 1
        indices = list(range(count)) if nodes == "all" else [int(nodes)]
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
                policy=self.policy,
            )
            for index in indices
        ]
        threads = [threading.Thread(target=f.run, name=f"logs-{f.source}", daemon=True) for f in followers]
        for thread in threads:
            thread.start()
        while any(t.is_alive() for t in threads):
            if stop.wait(0.5):
                for follower in followers:
                    follower.interrupt()
                break
        for thread in threads:
            thread.join()

    def diagnose(self, ref: JobRef, *, tail: int = 40) -> str:
        """Failed pods, recent events and the failing container's last log lines."""
        parts: list[str] = []
        try:
            pods = self._pods(ref)
        except UserError as e:
            return f"(could not list pods: {e})"
        failing = None
        pod_lines = []
        for pod in sorted(pods, key=lambda p: p.metadata.name):
            states = []
            for cs in pod.status.container_statuses or []:
                term = (cs.state.terminated if cs.state else None) or (cs.last_state.terminated if cs.last_state else None)
                wait = cs.state.waiting if cs.state else None
                detail = f"exit {term.exit_code} ({term.reason})" if term else (wait.reason if wait else "running")
                states.append(f"{cs.name}: {detail}, restarts {cs.restart_count}")
                if term and term.exit_code and failing is None:
                    failing = (pod.metadata.name, cs.name, bool(cs.state.waiting or cs.state.running))
            pod_lines.append(f"  {pod.metadata.name}: {pod.status.phase}; " + "; ".join(states))
        if pod_lines:
            parts.append("Pods:\n" + "\n".join(pod_lines))
        try:
            events = call(self.core.list_namespaced_event, ref.namespace, what=f"list events in {ref.namespace}", policy=self.policy).items
        except UserError:
            events = []
        related = [e for e in events if e.involved_object and (e.involved_object.name or "").startswith(ref.name)]
        related.sort(key=lambda e: e.last_timestamp or e.event_time or e.metadata.creation_timestamp)
        if related:
            parts.append(
                "Recent events:\n"
                + "\n".join(f"  {e.type} {e.reason} {e.involved_object.kind}/{e.involved_object.name}: {e.message}" for e in related[-10:])
            )
        if failing:
            pod_name, container, restarted = failing
            try:
                text = call(
                    self.core.read_namespaced_pod_log,
                    pod_name,
                    ref.namespace,
                    container=container,
                    tail_lines=tail,
                    previous=restarted,
                    what=f"logs of {pod_name}",
                    policy=self.policy,
                )
                parts.append(f"Last {tail} log lines of {pod_name}/{container}:\n" + "\n".join("  " + line for line in text.splitlines()))
            except UserError as e:
                parts.append(f"(log of {pod_name} unavailable: {e})")
        return "\n\n".join(parts)

    def delete(self, ref: JobRef, *, wait: float = 30.0) -> None:
        """Delete the TrainJob (background propagation) and wait (up to ``wait`` s) until it is gone.

        Background, not foreground: the Trainer controller does not skip a TrainJob that is
        being deleted, so while the garbage collector removes the JobSet of a TrainJob held by
        a foreground-deletion finalizer, the controller creates the JobSet again, over and over.
        With background propagation the TrainJob is gone at once and its JobSet, Jobs and pods
        are collected after it.
        """
        try:
            call(
                self.custom.delete_namespaced_custom_object,
                GROUP,
                VERSION,
                ref.namespace,
                PLURAL,
                ref.name,
                propagation_policy="Background",
                what=f"delete TrainJob {ref}",
                policy=RetryPolicy(attempts=3),
            )
        except NotFound:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            try:
                obj = self._get(ref)
            except NotFound:
                return
            if ref.uid and obj["metadata"].get("uid") != ref.uid:
                return
            time.sleep(0.5)
        log.warning("TrainJob %s still being deleted after %.0fs", ref, wait)

    def inspect_hint(self, ref: JobRef) -> str:
        """Kubectl commands to look at the job."""
        return (
            f"  kubectl get trainjob -n {ref.namespace} {ref.name} -o yaml\n"
            f"  kubectl get pods -n {ref.namespace} -l jobset.sigs.k8s.io/jobset-name={ref.name}\n"
            f"  kubectl logs -n {ref.namespace} -l jobset.sigs.k8s.io/jobset-name={ref.name},"
            f"batch.kubernetes.io/job-completion-index=0 -c node -f\n"
            f"  kubectl get events -n {ref.namespace} --field-selector involvedObject.name={ref.name}"
        )
