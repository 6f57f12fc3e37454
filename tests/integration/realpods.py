"""Helpers for tests that run real containers on the test cluster's real node
(``testcluster.realnode``): pods of the probe image, waiting for their phase, their logs."""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator
from typing import Any

from helpers import wait_for
from kubernetes import client
from testcluster import realnode


def on_real_node(spec: dict[str, Any]) -> dict[str, Any]:
    """``spec`` with what lands a pod on the real node (its label selected, its taint tolerated)."""
    extra = realnode.pod_spec_for_real_node()
    return {
        **spec,
        "nodeSelector": {**spec.get("nodeSelector", {}), **extra["nodeSelector"]},
        "tolerations": [*spec.get("tolerations", []), *extra["tolerations"]],
    }


def probe_pod(name: str, image: str, args: list[str], *, labels: dict | None = None, volumes: dict | None = None, **spec: Any) -> dict:
    """A pod running the probe test image (hack/k8s/testimage) with ``args`` on the real node;
    ``volumes``: ``{claim name: mount path}``."""
    container: dict[str, Any] = {"name": "probe", "image": image, "imagePullPolicy": "Never", "args": args}
    pod_spec: dict[str, Any] = {"restartPolicy": "Never", "terminationGracePeriodSeconds": 1, "automountServiceAccountToken": False, **spec}
    if volumes:
        container["volumeMounts"] = [{"name": f"v{i}", "mountPath": path} for i, path in enumerate(volumes.values())]
        pod_spec["volumes"] = [{"name": f"v{i}", "persistentVolumeClaim": {"claimName": c}} for i, c in enumerate(volumes)]
    pod_spec["containers"] = [container]
    return {"apiVersion": "v1", "kind": "Pod", "metadata": {"name": name, "labels": labels or {}}, "spec": on_real_node(pod_spec)}


def wait_phase(core: client.CoreV1Api, ns: str, name: str, phases: tuple[str, ...] = ("Succeeded",), timeout: float = 60):
    """Wait until the pod reaches one of ``phases`` (fails at once when it reaches another final one)."""

    def reached():
        pod = core.read_namespaced_pod(name, ns)
        phase = pod.status.phase
        if phase in ("Succeeded", "Failed") and phase not in phases:
            log = core.read_namespaced_pod_log(name, ns)
            raise AssertionError(f"pod {name} ended {phase}: {pod.status.container_statuses}\nlog:\n{log}")
        return pod if phase in phases else None

    return wait_for(reached, timeout=timeout, what=f"pod {name} {'/'.join(phases)}", interval=0.2)


def prepare_claim(core: client.CoreV1Api, ns: str, image: str, dataset_uri: str, model_uri: str) -> None:
    """A ReadWriteMany claim ``workspace`` holding ``dataset/``, ``model/`` (builtin URIs, fetched by a pod of
    the trainer ``image``) and an empty ``output/``, all writable by the trainer's user."""
    core.create_namespaced_persistent_volume_claim(
        ns, {"metadata": {"name": "workspace"}, "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}
    )
    script = (
        f"python -m kfp_trainer.trainers.builtin {dataset_uri} /workspace/dataset && "
        f"python -m kfp_trainer.trainers.builtin {model_uri} /workspace/model && "
        "mkdir /workspace/output && chmod -R a+rwX /workspace"
    )
    spec = {
        "restartPolicy": "Never",
        "automountServiceAccountToken": False,
        "containers": [{"name": "prepare", "image": image, "imagePullPolicy": "Never", "command": ["sh", "-c", script],
                        "securityContext": {"runAsUser": 0},  # the host directory of the volume belongs to root
                        "volumeMounts": [{"name": "workspace", "mountPath": "/workspace"}]}],
        "volumes": [{"name": "workspace", "persistentVolumeClaim": {"claimName": "workspace"}}],
    }  # fmt: skip
    core.create_namespaced_pod(ns, {"metadata": {"name": "prepare"}, "spec": on_real_node(spec)})
    wait_phase(core, ns, "prepare", timeout=120)


def claim_folder(core: client.CoreV1Api, ns: str, path: str = "output"):
    """The host directory behind the claim ``workspace`` (a host-path volume of the test cluster), joined with ``path``."""
    from pathlib import Path

    claim = core.read_namespaced_persistent_volume_claim("workspace", ns)
    return Path(core.read_persistent_volume(claim.spec.volume_name).spec.host_path.path) / path


@contextlib.contextmanager
def real_node_queue(api_client: Any, namespace: str, cpu: int) -> Iterator[tuple[dict[str, Any], str]]:
    """Kueue on the real node: a flavor of it, a ClusterQueue of ``cpu`` CPUs, the LocalQueue ``real`` in ``namespace``, and
    a high WorkloadPriorityClass; yields the real node's placement and that class's name. Removed, with every TrainJob of
    ``namespace``, at the end."""
    from helpers import list_trainjobs
    from testcluster import queues
    from testcluster.kueue import MANAGED_NAMESPACES

    from kfp_trainer import spec

    client.CoreV1Api(api_client).patch_namespace(namespace, {"metadata": {"labels": MANAGED_NAMESPACES}})
    tag = uuid.uuid4().hex[:6]
    flavor, cq, high = f"real-{tag}", f"cq-real-{tag}", f"high-{tag}"
    placement = realnode.pod_spec_for_real_node()
    queues.resource_flavor(api_client, flavor, placement["nodeSelector"])
    queues.cluster_queue(api_client, cq, flavor, {"cpu": cpu})
    queues.local_queue(api_client, namespace, "real", cq)
    queues.priority_class(api_client, high, 1000)
    try:
        queues.wait_active(api_client, cq)
        yield placement, high
    finally:
        for job in list_trainjobs(api_client, namespace):
            client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
                spec.GROUP, spec.VERSION, namespace, spec.PLURAL, job["metadata"]["name"]
            )
        queues.delete(api_client, "localqueues", "real", namespace)
        queues.delete(api_client, "clusterqueues", cq)
        queues.delete(api_client, "resourceflavors", flavor)
        queues.delete(api_client, "workloadpriorityclasses", high)
