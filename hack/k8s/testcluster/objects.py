"""Cluster objects the test cluster starts with: fake nodes and the default storage class."""

from __future__ import annotations

import time

from .binaries import KUBE_VERSION, ClusterError

# Fake nodes: (name, capacity, extra labels)
Node = tuple[str, dict[str, str], dict[str, str]]
GPU = {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "1Ti"}
DEFAULT_NODES: list[Node] = [
    ("kwok-gpu-0", GPU, {"nvidia.com/gpu.present": "true"}),
    ("kwok-gpu-1", GPU, {"nvidia.com/gpu.present": "true"}),
    ("kwok-cpu-0", {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "1Ti"}, {}),
]
STORAGE_CLASS = "standard"
PROVISIONER = "kwok.x-k8s.io/volume"


def create_nodes(api, nodes: list[Node], timeout: float = 60) -> None:
    """Create the nodes and wait until kwok reports them Ready and untainted."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    core = client.CoreV1Api(api)
    for name, capacity, labels in nodes:
        body = {
            "apiVersion": "v1",
            "kind": "Node",
            "metadata": {
                "name": name,
                "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                "labels": {
                    "type": "kwok",
                    "kubernetes.io/hostname": name,
                    "kubernetes.io/os": "linux",
                    "kubernetes.io/arch": "amd64",
                    "kubernetes.io/role": "agent",
                    **labels,
                },
            },
            "spec": {},
            "status": {
                "addresses": [{"type": "InternalIP", "address": "127.0.0.1"}, {"type": "Hostname", "address": name}],
                "capacity": capacity,
                "allocatable": capacity,
                "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": KUBE_VERSION},
            },
        }
        try:
            core.create_node(body)
        except ApiException as e:
            if e.status != 409:
                raise
    deadline = time.monotonic() + timeout
    names = {n for n, _, _ in nodes}
    while True:
        ready = set()
        for n in core.list_node().items:
            conds = {c.type: c.status for c in (n.status.conditions or [])}
            taints = [t for t in (n.spec.taints or []) if t.key.startswith("node.kubernetes.io/")]
            if conds.get("Ready") == "True" and not taints:
                ready.add(n.metadata.name)
        if names <= ready:
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"nodes not ready: {sorted(names - ready)}")
        time.sleep(0.2)


def create_storage_class(api) -> None:
    """The default StorageClass; the KWOK volume stages provision and bind its claims."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    body = {
        "metadata": {"name": STORAGE_CLASS, "annotations": {"storageclass.kubernetes.io/is-default-class": "true"}},
        "provisioner": PROVISIONER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
    }
    try:
        client.StorageV1Api(api).create_storage_class(body)
    except ApiException as e:
        if e.status != 409:
            raise
