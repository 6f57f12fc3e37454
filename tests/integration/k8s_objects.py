"""Helpers for tests on the real API server that play the Trainer/JobSet controllers themselves.

The TrainJobs they create carry ``managedBy: kueue.x-k8s.io/multikueue``, which a real Trainer
controller leaves alone, and ``suspend: true``, which keeps a stand-in controller from running
them, so the tests behave the same whatever plays the controllers.
The helpers stand in for the controllers only where a test needs something to exist (a Job
owned by a TrainJob, a finished status): everything else is the real API server, garbage
collector and Job controller.
"""

from __future__ import annotations

import collections
import os
import subprocess
import sys
import time
import weakref
from typing import Any

from helpers import wait_for  # noqa: F401  (re-exported for the tests that import it from here)
from kubernetes import client

from kfp_trainer import spec
from kfp_trainer.backends import owner
from kfp_trainer.backends.kube.api import RetryPolicy
from kfp_trainer.backends.kube.apierrors import APIError
from kfp_trainer.backends.kube.client import Client, ListStats
from kfp_trainer.backends.kube.credentials import from_kubeconfig
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.backends.procs import ProcessId
from kfp_trainer.spec import TrainJobInputs

JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"
INERT = "kueue.x-k8s.io/multikueue"  # a managedBy value the Trainer controller does not reconcile


def inert(manifest: dict) -> dict:
    """``manifest`` no controller runs: a managedBy the Trainer controller leaves alone, and suspended."""
    return {**manifest, "spec": {**manifest["spec"], "managedBy": INERT, "suspend": True}}


class InertBackend(KubernetesBackend):
    """The real backend; the jobs it creates are left to the test, not to a controller."""

    def submit(self, manifest, *, runtime=None, stop=None):
        return super().submit(inert(manifest), runtime=runtime, stop=stop)


# Every backend client the tests made, for what their watches did together (each client counts its own: ``api.lists``).
MADE: weakref.WeakSet[Client] = weakref.WeakSet()
# Their counts, kept after a client is gone: a sum over the clients alive would go down when one is collected.
_COUNTS: list[ListStats] = []


def _made(api: Client) -> None:
    MADE.add(api)
    _COUNTS.append(api.lists)


def kube_client(kubeconfig: str) -> Client:
    """The backend's own client for ``kubeconfig``: its credentials read as a launch reads them."""
    api = Client(from_kubeconfig(kubeconfig))
    _made(api)
    return api


def list_counts() -> collections.Counter[str]:
    """How the watches of every client the tests made listed, summed (``streaming``, ``list``, ``refused``)."""
    total: collections.Counter[str] = collections.Counter()
    for stats in list(_COUNTS):
        total.update(stats.counts)
    return total


class Recording(Client):
    """The backend's client, recording every request it sends (method, path, query); it can act on one first,
    and send extra headers (``Impersonate-User``: act as a service account)."""

    def __init__(self, api: Client, before=None) -> None:
        super().__init__(api.credentials)
        _made(self)
        self.requests: list[tuple[str, str, dict[str, Any]]] = []
        self.refused: list[tuple[int, str, str]] = []  # (status, method, path) of failed requests
        self.before = before
        self.headers: dict[str, str] = {}

    def set_default_header(self, name: str, value: str) -> None:
        self.headers[name] = value

    def request(self, method, path, *, query=None, headers=None, **kwargs):
        pairs = query.items() if isinstance(query, dict) else query or []
        entry = (method, path.split("?", 1)[0], dict(pairs))
        self.requests.append(entry)
        if self.before is not None:
            self.before(entry)
        try:
            return super().request(method, path, query=query, headers={**self.headers, **(headers or {})}, **kwargs)
        except APIError as e:
            self.refused.append((e.status, method, path))
            raise

    def count(self, method: str, path_part: str = "", **query: str) -> int:
        return sum(
            1 for m, p, q in self.requests if m == method and path_part in p and all(str(q.get(k)) == str(v) for k, v in query.items())
        )


def recording(api: Client, before=None) -> Recording:
    return Recording(api, before)


def impersonating(api: Client, user: str) -> Recording:
    """The backend's client acting as ``user`` (``system:serviceaccount:<ns>:<name>``)."""
    acting = Recording(api)
    acting.set_default_header("Impersonate-User", user)
    return acting


def backend(api: Client, namespace: str, **kw: Any) -> KubernetesBackend:
    return InertBackend(api, namespace=namespace, policy=RetryPolicy(attempts=3, base=0.2), **kw)


def inputs(namespace: str, *, run: str | None = None, task: str = "train", **kw: Any) -> TrainJobInputs:
    return TrainJobInputs(run_id=run or f"run-{time.time_ns()}", task_name=task, namespace=namespace, **kw)


def manifest(namespace: str, identity: dict | None = None, **kw: Any) -> dict:
    """A rendered TrainJob naming ``identity`` as its launcher (this process by default)."""
    return inert(owner.annotate(spec.render(inputs(namespace, **kw)), identity))


def dead_launcher() -> dict:
    """The identity of a launcher process that has exited (pid and start time)."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    gone = ProcessId.of(proc.pid)
    proc.wait()
    return {"host": os.uname().nodename, "pid": gone.pid, "start": gone.start or 1}


def trainjobs(api: client.ApiClient, namespace: str) -> list[dict]:
    return client.CustomObjectsApi(api).list_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL)["items"]


def get_trainjob(api: client.ApiClient, namespace: str, name: str) -> dict | None:
    try:
        return client.CustomObjectsApi(api).get_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, name)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def set_finalizers(api: client.ApiClient, namespace: str, name: str, finalizers: list[str]) -> None:
    client.CustomObjectsApi(api).patch_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, spec.PLURAL, name, {"metadata": {"finalizers": finalizers}}
    )


def set_condition(api: client.ApiClient, namespace: str, name: str, kind: str, reason: str = "FailedJobs") -> None:
    """Write a Complete/Failed condition, as the Trainer controller would, and make sure it stays.

    A controller stand-in may still be writing the job's status; the condition is written again
    until it has held for a second.
    """
    from kfp_trainer.backends.base import trainjob_status

    condition = {
        "type": kind,
        "status": "True",
        "reason": reason,
        "message": "set by the test",
        "lastTransitionTime": "2026-01-01T00:00:00Z",
    }
    want = trainjob_status({"status": {"conditions": [condition]}}).phase
    held = 0
    for _ in range(40):
        obj = get_trainjob(api, namespace, name)
        if obj is not None and trainjob_status(obj).phase is want:
            held += 1
            if held >= 4:
                return
        else:
            held = 0
            client.CustomObjectsApi(api).patch_namespaced_custom_object_status(
                spec.GROUP, spec.VERSION, namespace, spec.PLURAL, name, {"status": {"conditions": [condition]}}
            )
        time.sleep(0.25)
    raise AssertionError(f"the {kind} condition of TrainJob {namespace}/{name} did not stay")


def owned_job(api: client.ApiClient, trainjob: dict, *, replicated_job: str = "extra", pods: int = 1, pod_spec: dict | None = None) -> dict:
    """A batch Job owned by ``trainjob`` with JobSet's labels, as the JobSet controller would create it."""
    meta = trainjob["metadata"]
    labels = {
        JOBSET_LABEL: meta["name"],
        "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
        "jobset.sigs.k8s.io/job-index": "0",
    }
    body = {
        "metadata": {
            "name": f"{meta['name']}-{replicated_job}-0",
            "labels": labels,
            "ownerReferences": [
                {"apiVersion": spec.API_VERSION, "kind": "TrainJob", "name": meta["name"], "uid": meta["uid"], "controller": True}
            ],
        },
        "spec": {
            "completionMode": "Indexed",
            "completions": pods,
            "parallelism": pods,
            "backoffLimit": 0,
            "template": {
                "metadata": {"labels": labels},
                "spec": pod_spec or {"restartPolicy": "Never", "containers": [{"name": "node", "image": "busybox"}]},
            },
        },
    }
    return client.BatchV1Api(api).create_namespaced_job(meta["namespace"], body).to_dict()


