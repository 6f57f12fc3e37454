"""Who launched a TrainJob: recorded on the job when it is created, checked by retries and gc.

The launcher annotates its TrainJob with ``kfp-trainer.kubeflow.org/launcher``, a small JSON
object naming itself:

* in a pod (a KFP step): ``{"pod": "<namespace>/<name>", "uid": "<pod uid>"}`` from KFP's
  ``KFP_POD_NAME``/``KFP_POD_UID`` (downward API), else ``$HOSTNAME`` and the service
  account's namespace;
* elsewhere (``kfp-trainer launch`` on a workstation): ``{"host": ..., "pid": ..., "start": ...}``,
  the process start time guarding against pid reuse.

A retry that adopts the job rewrites the annotation, so it always names the launcher that
follows the job now. Whether that launcher still runs is what tells a stale job of an earlier
try (replace it) from a sibling still followed by a live launcher (leave it), and what
``kfp-trainer gc`` calls "task gone".

In a pod, the TrainJob is also made a dependent of the pod's controller -- for a KFP step on
Argo, the run's Workflow -- through an owner reference (:func:`run_owner`): the backstop of a
cancel whose deletion could not go out (the container killed first, the API server unreachable
at that moment). Kubernetes' garbage collector then deletes the TrainJob, and everything under
it, when the run's Workflow goes (KFP deletes it an hour after the run ended, by default). Not
the pod itself: a step whose pod is lost is retried in a new pod of the same Workflow, which
adopts the job.

Example:
    >>> identity = {"host": "laptop", "pid": 1, "start": 5}
    >>> parse({"metadata": {"annotations": {ANNOTATION: encode(identity)}}}) == identity
    True
"""

from __future__ import annotations

import json
import os
import socket
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..spec import LABEL_PREFIX
from .procs import ProcessId

ANNOTATION = LABEL_PREFIX + "launcher"
SA_NAMESPACE = Path("/var/run/secrets/kubernetes.io/serviceaccount/namespace")


def current(env: dict[str, str] | None = None) -> dict[str, Any]:
    """This launcher's identity (see the module docstring)."""
    env = dict(os.environ) if env is None else env
    pod = env.get("KFP_POD_NAME") or (env.get("HOSTNAME") if env.get("KUBERNETES_SERVICE_HOST") else None)
    namespace = ""
    if pod:
        try:
            namespace = SA_NAMESPACE.read_text().strip()
        except OSError:
            namespace = env.get("POD_NAMESPACE", "")
    if pod and namespace:
        identity: dict[str, Any] = {"pod": f"{namespace}/{pod}"}
        if env.get("KFP_POD_UID"):
            identity["uid"] = env["KFP_POD_UID"]
        return identity
    me = ProcessId.of(os.getpid())
    return {"host": socket.gethostname(), "pid": me.pid, "start": me.start}


def encode(identity: dict[str, Any]) -> str:
    """The annotation value for ``identity``."""
    return json.dumps(identity, sort_keys=True, separators=(",", ":"))


def annotate(manifest: dict[str, Any], identity: dict[str, Any] | None = None) -> dict[str, Any]:
    """A copy of ``manifest`` whose annotations name the launcher."""
    metadata = dict(manifest.get("metadata") or {})
    metadata["annotations"] = {**(metadata.get("annotations") or {}), ANNOTATION: encode(identity or current())}
    return {**manifest, "metadata": metadata}


def parse(obj: Mapping[str, Any]) -> dict[str, Any] | None:
    """The launcher identity recorded on a stored TrainJob, or None."""
    raw = ((obj.get("metadata") or {}).get("annotations") or {}).get(ANNOTATION)
    try:
        value = json.loads(raw) if isinstance(raw, str) else None
    except ValueError:
        return None
    return value if isinstance(value, dict) else None


def is_me(identity: dict[str, Any] | None, me: dict[str, Any] | None = None) -> bool:
    """Whether ``identity`` names this very launcher."""
    me = me or current()
    if not identity:
        return False
    keys = ("pod", "uid") if "pod" in me else ("host", "pid", "start")
    return all(identity.get(k) == me.get(k) for k in keys)


def local_process_alive(identity: dict[str, Any]) -> bool | None:
    """For a launcher that ran outside a pod: alive (True/False) when it ran on this host, else None."""
    if "pid" not in identity or identity.get("host") != socket.gethostname():
        return None
    try:
        return ProcessId(int(identity["pid"]), int(identity.get("start") or 0)).alive()
    except (TypeError, ValueError):
        return None


def pod_alive(pod: dict[str, Any] | None, identity: dict[str, Any]) -> bool:
    """Whether the launcher pod ``identity`` names is ``pod`` (as stored) and still runs."""
    if pod is None:
        return False
    meta = pod.get("metadata") or {}
    if identity.get("uid") and meta.get("uid") != identity["uid"]:
        return False  # a newer pod with the same name
    if meta.get("deletionTimestamp"):
        return False
    return (pod.get("status") or {}).get("phase") not in ("Succeeded", "Failed")


def describe(identity: dict[str, Any] | None) -> str:
    """A launcher identity for people.

    Example:
        >>> describe({"pod": "kubeflow/run-1-train", "uid": "u"})
        'pod kubeflow/run-1-train'
        >>> describe({"host": "laptop", "pid": 42, "start": 7})
        'process 42 on laptop'
    """
    if not identity:
        return "(none recorded)"
    if "pod" in identity:
        return f"pod {identity['pod']}"
    return f"process {identity.get('pid')} on {identity.get('host')}"


def run_owner(pod: Mapping[str, Any] | None, identity: Mapping[str, Any], namespace: str) -> dict[str, Any] | None:
    """The owner reference a TrainJob in ``namespace`` gets from its launcher's pod, or None.

    The pod's controller (a KFP step's: the run's Argo Workflow), when the pod is the one
    ``identity`` names (same uid) and the TrainJob is in the pod's namespace: an owner in
    another namespace counts as gone, and the garbage collector would delete the job at once.
    ``blockOwnerDeletion`` is off: deleting the run never waits for its TrainJobs.

    Example:
        >>> pod = {"metadata": {"namespace": "kubeflow", "uid": "p1", "ownerReferences": [
        ...     {"apiVersion": "argoproj.io/v1alpha1", "kind": "Workflow", "name": "run-x", "uid": "w1", "controller": True}]}}
        >>> run_owner(pod, {"pod": "kubeflow/run-x-123", "uid": "p1"}, "kubeflow")
        {'apiVersion': 'argoproj.io/v1alpha1', 'kind': 'Workflow', 'name': 'run-x', 'uid': 'w1', 'blockOwnerDeletion': False}
        >>> run_owner(pod, {"pod": "kubeflow/run-x-123", "uid": "p1"}, "team-a") is None
        True
    """
    meta = (pod or {}).get("metadata") or {}
    if not meta or meta.get("namespace") != namespace:
        return None
    if identity.get("uid") and meta.get("uid") != identity["uid"]:
        return None
    for ref in meta.get("ownerReferences") or []:
        if ref.get("controller") and all(ref.get(k) for k in ("apiVersion", "kind", "name", "uid")):
            return {k: ref[k] for k in ("apiVersion", "kind", "name", "uid")} | {"blockOwnerDeletion": False}
    return None
