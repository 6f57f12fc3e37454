"""Installing CRDs and swapping the TrainJob CRD of a running cluster."""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from .binaries import ClusterError

TRAINER_GROUP = "trainer.kubeflow.org"
MANIFEST_HASH = "kfp-trainer.test/manifest-sha256"
_Loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def load_yaml_docs(path: Path) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.load_all(f, Loader=_Loader) if d]


def crd_docs(paths: list[Path]) -> list[dict]:
    docs = [d for p in paths for d in load_yaml_docs(p) if d.get("kind") == "CustomResourceDefinition"]
    if not docs:
        raise ClusterError(f"no CRDs found in {[str(p) for p in paths]}")
    return docs


def apply_crd(api, doc: dict, wait: bool = True) -> None:
    """Create the CRD, or replace it when its spec differs (create/replace, not client-side
    apply: the Trainer CRDs are far larger than the last-applied annotation allows)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    ext = client.ApiextensionsV1Api(api)
    name = doc["metadata"]["name"]
    body = copy.deepcopy(doc)
    body.pop("status", None)
    body["metadata"].pop("resourceVersion", None)
    digest = hashlib.sha256(json.dumps(doc["spec"], sort_keys=True).encode()).hexdigest()
    body["metadata"].setdefault("annotations", {})[MANIFEST_HASH] = digest
    for _ in range(5):
        try:
            cur = ext.read_custom_resource_definition(name)
        except ApiException as e:
            if e.status != 404:
                raise
            ext.create_custom_resource_definition(body)
            break
        if (cur.metadata.annotations or {}).get(MANIFEST_HASH) == digest:
            break
        body["metadata"]["resourceVersion"] = cur.metadata.resource_version
        try:
            ext.replace_custom_resource_definition(name, body)
            break
        except ApiException as e:
            if e.status != 409:
                raise
    if wait:
        wait_established(api, name)


def wait_established(api, name: str, timeout: float = 60) -> None:
    from kubernetes import client

    ext = client.ApiextensionsV1Api(api)
    deadline = time.monotonic() + timeout
    while True:
        crd = ext.read_custom_resource_definition(name)
        conds = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
        if conds.get("Established") == "True" and conds.get("NamesAccepted") == "True":
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"CRD {name} not Established: {conds}")
        time.sleep(0.1)


def install_crds(api, paths: list[Path]) -> list[str]:
    """Apply every CRD in ``paths`` and wait until all are Established; returns their names."""
    docs = crd_docs(paths)
    for doc in docs:
        apply_crd(api, doc, wait=False)
    names = [d["metadata"]["name"] for d in docs]
    for n in names:
        wait_established(api, n)
    return names


def install_runtimes(api, runtimes_dir: Path, timeout: float = 30) -> list[str]:
    """Create every ClusterTrainingRuntime of ``runtimes_dir`` and its subdirectories (the
    Trainer's webhook validates them)."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    co = client.CustomObjectsApi(api)
    names = []
    for p in sorted(runtimes_dir.rglob("*.yaml")):
        for doc in load_yaml_docs(p):
            if doc.get("kind") != "ClusterTrainingRuntime":
                continue
            version = doc["apiVersion"].split("/", 1)[1]
            deadline = time.monotonic() + timeout
            while True:
                try:
                    co.create_cluster_custom_object(TRAINER_GROUP, version, "clustertrainingruntimes", doc)
                    break
                except ApiException as e:
                    if e.status == 409:
                        break
                    # 404 right after the CRD is established: discovery lags a moment.
                    if e.status == 404 and time.monotonic() < deadline:
                        time.sleep(0.2)
                        continue
                    raise
            names.append(doc["metadata"]["name"])
    return names


@contextlib.contextmanager
def swapped_crd(api, path: Path, original: Path) -> Iterator[dict]:
    """Serve the TrainJob CRD of ``path`` for the block; ``original`` again afterwards."""
    new = crd_docs([path])[0]
    orig = crd_docs([original])[0]
    apply_crd(api, new)
    wait_schema_served(api, new)
    try:
        yield new
    finally:
        apply_crd(api, orig)
        wait_schema_served(api, orig)


def wait_schema_served(api, crd: dict, timeout: float = 30) -> None:
    """Wait until the API server validates TrainJobs with the schema of ``crd``.

    Probes with server-side dry-run creates under strict field validation: a spec field
    only this schema has must be accepted, and one it lacks (but another version has)
    rejected."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
    props = set(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])
    known = {"runtimePatches", "podTemplateOverrides", "podSpecOverrides", "labels", "annotations", "activeDeadlineSeconds"}
    present, absent = sorted(props & known), sorted(known - props)
    co = client.CustomObjectsApi(api)

    def accepted(field: str) -> bool:
        spec: dict[str, Any] = {"runtimeRef": {"name": "torch-distributed"}}
        spec[field] = 1 if field == "activeDeadlineSeconds" else ({} if field in ("labels", "annotations") else [])
        body = {"apiVersion": f"{TRAINER_GROUP}/{version['name']}", "kind": "TrainJob", "metadata": {"name": "schema-probe"}, "spec": spec}
        try:
            co.api_client.call_api(
                f"/apis/{TRAINER_GROUP}/{version['name']}/namespaces/default/trainjobs",
                "POST",
                query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
                header_params={"Content-Type": "application/json", "Accept": "application/json"},
                body=body,
                _preload_content=False,
            )
            return True
        except ApiException as e:
            if e.status in (400, 403, 422):
                # The Trainer's webhook may refuse the probe for its own reasons; only a
                # schema error says the field is unknown.
                body = e.body.decode(errors="replace") if isinstance(e.body, bytes) else str(e.body or "")
                return "unknown field" not in body and "field not declared" not in body
            raise

    deadline = time.monotonic() + timeout
    while True:
        if all(accepted(f) for f in present[:1]) and not any(accepted(f) for f in absent[:1]):
            return
        if time.monotonic() > deadline:
            raise ClusterError(f"API server did not switch to TrainJob schema ({present=} {absent=})")
        time.sleep(0.2)
