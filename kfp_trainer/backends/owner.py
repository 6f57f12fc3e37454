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
