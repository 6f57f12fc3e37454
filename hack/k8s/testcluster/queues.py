"""Kueue objects tests create: ResourceFlavors (matching the KWOK nodes), ClusterQueues,
LocalQueues and WorkloadPriorityClasses, and removing them again."""

from __future__ import annotations

import time
from collections.abc import Mapping

from .binaries import ClusterError
from .kueue import GROUP, VERSION

# The KWOK GPU nodes' label (objects.DEFAULT_NODES): a flavor of those nodes.
GPU_NODE_LABELS = {"nvidia.com/gpu.present": "true"}


def _api(api):
    from kubernetes import client

    return client.CustomObjectsApi(api)


def _create(api, plural: str, body: dict, namespace: str | None = None) -> dict:
    body = {"apiVersion": f"{GROUP}/{VERSION}", **body}
    if namespace:
        return _api(api).create_namespaced_custom_object(GROUP, VERSION, namespace, plural, body)
    return _api(api).create_cluster_custom_object(GROUP, VERSION, plural, body)


def resource_flavor(api, name: str, node_labels: Mapping[str, str] | None = None) -> dict:
    """A ResourceFlavor whose workloads go to nodes with ``node_labels`` (default: the GPU nodes)."""
    labels = dict(GPU_NODE_LABELS if node_labels is None else node_labels)
    return _create(api, "resourceflavors", {"kind": "ResourceFlavor", "metadata": {"name": name}, "spec": {"nodeLabels": labels}})


def cluster_queue(api, name: str, flavor: str, quota: Mapping[str, str | int], *, preemption: str = "LowerPriority") -> dict:
    """A ClusterQueue with ``quota`` (resource -> nominal quota) in ``flavor`` for every
    namespace; ``preemption``: its ``withinClusterQueue`` policy (``Never`` to turn it off)."""
    return _create(
        api,
        "clusterqueues",
        {
            "kind": "ClusterQueue",
            "metadata": {"name": name},
            "spec": {
                "namespaceSelector": {},
                "resourceGroups": [
                    {
                        "coveredResources": list(quota),
                        "flavors": [{"name": flavor, "resources": [{"name": r, "nominalQuota": str(q)} for r, q in quota.items()]}],
                    }
                ],
                "preemption": {"withinClusterQueue": preemption},
            },
        },
    )


def local_queue(api, namespace: str, name: str, cluster_queue_name: str) -> dict:
    """A LocalQueue in ``namespace`` feeding ``cluster_queue_name``."""
    body = {"kind": "LocalQueue", "metadata": {"name": name, "namespace": namespace}, "spec": {"clusterQueue": cluster_queue_name}}
    return _create(api, "localqueues", body, namespace)


def priority_class(api, name: str, value: int) -> dict:
    """A WorkloadPriorityClass (what the ``kueue.x-k8s.io/priority-class`` label names)."""
    return _create(api, "workloadpriorityclasses", {"kind": "WorkloadPriorityClass", "metadata": {"name": name}, "value": value})


def wait_active(api, name: str, timeout: float = 30) -> None:
    """Wait until ClusterQueue ``name`` is Active (its flavors exist, Kueue took it in)."""
    deadline = time.monotonic() + timeout
    while True:
        cq = _api(api).get_cluster_custom_object(GROUP, VERSION, "clusterqueues", name)
        conds = {c["type"]: c for c in (cq.get("status") or {}).get("conditions") or []}
        if conds.get("Active", {}).get("status") == "True":
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"ClusterQueue {name} not Active after {timeout}s: {conds.get('Active')}")
        time.sleep(0.2)


def workloads(api, namespace: str) -> list[dict]:
    """The Workloads in ``namespace``."""
    return _api(api).list_namespaced_custom_object(GROUP, VERSION, namespace, "workloads")["items"]


def delete(api, plural: str, name: str, namespace: str | None = None) -> None:
    """Delete a Kueue object; gone already is fine."""
    from kubernetes.client.rest import ApiException

    try:
        if namespace:
            _api(api).delete_namespaced_custom_object(GROUP, VERSION, namespace, plural, name)
        else:
            _api(api).delete_cluster_custom_object(GROUP, VERSION, plural, name)
    except ApiException as e:
        if e.status != 404:
            raise
