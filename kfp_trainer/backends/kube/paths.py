"""URL paths of the objects the backend reads and writes, each part quoted. Pure.

Example:
    >>> trainjob("team-a", "train-x")
    '/apis/trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/train-x'
    >>> pod("ns", "p")
    '/api/v1/namespaces/ns/pods/p'
"""

from __future__ import annotations

from urllib.parse import quote

from ...spec import GROUP, PLURAL, VERSION

MERGE_PATCH = {"Content-Type": "application/merge-patch+json"}


def _q(part: str) -> str:
    return quote(str(part), safe="")


def trainjobs(namespace: str) -> str:
    """The TrainJobs of ``namespace``."""
    return f"/apis/{GROUP}/{VERSION}/namespaces/{_q(namespace)}/{PLURAL}"


def trainjob(namespace: str, name: str) -> str:
    """One TrainJob."""
    return f"{trainjobs(namespace)}/{_q(name)}"


def pods(namespace: str) -> str:
    """The pods of ``namespace``."""
    return f"/api/v1/namespaces/{_q(namespace)}/pods"


def pod(namespace: str, name: str) -> str:
    """One pod."""
    return f"{pods(namespace)}/{_q(name)}"


def pod_log(namespace: str, name: str) -> str:
    """One pod's log."""
    return f"{pod(namespace, name)}/log"


def events(namespace: str) -> str:
    """The events of ``namespace``."""
    return f"/api/v1/namespaces/{_q(namespace)}/events"


def node(name: str) -> str:
    """One node."""
    return f"/api/v1/nodes/{_q(name)}"
