"""Small helpers shared by the integration tests (TrainJob bodies, waiting, pods, logs)."""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from typing import Any, TypeVar

from kubernetes import client
from kubernetes.client.rest import ApiException

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
JOBSET_GROUP, JOBSET_VERSION = "jobset.x-k8s.io", "v1alpha2"
MANAGER = "kfp-trainer.test/integration"
T = TypeVar("T")


def wait_for(pred: Callable[[], T], timeout: float = 30, what: str = "condition", interval: float = 0.1) -> T:
    """Poll ``pred`` until it returns something truthy; fail with ``what`` after ``timeout`` s."""
    deadline = time.monotonic() + timeout
    last = None
    while time.monotonic() < deadline:
        last = pred()
        if last:
            return last
        time.sleep(interval)
    raise AssertionError(f"timed out after {timeout}s waiting for {what}; last={last!r}")


def pod_patch(
    jobs: Sequence[str] = ("node",),
    annotations: Mapping[str, str] | None = None,
    labels: Mapping[str, str] | None = None,
    spec: Mapping[str, Any] | None = None,
) -> list[dict]:
    """``spec.runtimePatches`` that put pod metadata and spec fields on ``jobs``' pods."""
    template: dict[str, Any] = {"metadata": {}}
    if annotations:
        template["metadata"]["annotations"] = dict(annotations)
    if labels:
        template["metadata"]["labels"] = dict(labels)
    if spec:
        template["spec"] = dict(spec)
    replicated = [{"name": j, "template": {"spec": {"template": template}}} for j in jobs]
    return [{"manager": MANAGER, "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": replicated}}}}]


def trainjob(name: str, runtime: str = "torch-distributed", **spec: Any) -> dict:
    """A TrainJob body on ``runtime`` (a cluster runtime) with a small trainer."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name},
        "spec": {
            "runtimeRef": {"name": runtime},
            "trainer": {"image": "python:3.11", "command": ["python", "-c", "print('hi')"]},
        },
    }
    body["spec"].update(spec)
    return body


def create_trainjob(api, ns: str, body: dict, strict: bool = True) -> dict:
    kw = {"field_validation": "Strict"} if strict else {}
    return client.CustomObjectsApi(api).create_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", body, **kw)


def get_trainjob(api, ns: str, name: str) -> dict | None:
    try:
        return client.CustomObjectsApi(api).get_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs", name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def list_trainjobs(api, ns: str) -> list[dict]:
    return client.CustomObjectsApi(api).list_namespaced_custom_object(GROUP, VERSION, ns, "trainjobs")["items"]


def get_jobset(api, ns: str, name: str) -> dict | None:
    try:
        return client.CustomObjectsApi(api).get_namespaced_custom_object(JOBSET_GROUP, JOBSET_VERSION, ns, "jobsets", name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


def condition(obj: dict | None, typ: str) -> dict | None:
    for c in ((obj or {}).get("status") or {}).get("conditions") or []:
        if c["type"] == typ:
            return c
    return None


def finished_condition(api, ns: str, name: str) -> dict | None:
    """The TrainJob's Complete or Failed condition once it is True."""
    tj = get_trainjob(api, ns, name)
    for t in ("Complete", "Failed"):
        c = condition(tj, t)
        if c and c["status"] == "True":
            return c
    return None


def pods(api, ns: str, trainjob_name: str, job: str = "node", index: int | None = None, phase: str | None = None) -> list:
    """Pods of a TrainJob's replicated job (optionally one completion index / phase)."""
    selector = f"jobset.sigs.k8s.io/jobset-name={trainjob_name},jobset.sigs.k8s.io/replicatedjob-name={job}"
    if index is not None:
        selector += f",batch.kubernetes.io/job-completion-index={index}"
    items = client.CoreV1Api(api).list_namespaced_pod(ns, label_selector=selector).items
    return [p for p in items if phase is None or p.status.phase == phase]


def pod(api, ns: str, trainjob_name: str, job: str = "node", index: int = 0, phase: str | None = None):
    found = pods(api, ns, trainjob_name, job, index, phase)
    return found[0] if found else None


def follow_log(api, ns: str, pod_name: str, container: str = "node", timeout: float = 60) -> list[str]:
    """Follow a pod's log through the API server until the server ends the stream."""
    resp = client.CoreV1Api(api).read_namespaced_pod_log(
        pod_name, ns, container=container, follow=True, _preload_content=False, _request_timeout=timeout
    )
    try:
        data = b"".join(resp.stream(1024))
    finally:
        resp.release_conn()
    return data.decode().splitlines()


def events(api, ns: str, name: str, reason: str | None = None) -> list:
    evs = client.CoreV1Api(api).list_namespaced_event(ns, field_selector=f"involvedObject.name={name}").items
    return [e for e in evs if reason is None or e.reason == reason]
