"""Helpers for tests that run real containers on the test cluster's real node
(``testcluster.realnode``): pods of the probe image, waiting for their phase, their logs."""

from __future__ import annotations

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
