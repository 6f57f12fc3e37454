"""Hostile inputs against the real API server with the Trainer CRDs.

* every case the launcher accepts passes the server's own schema (``dryRun=All``, strict
  field validation), still holds what the unit suite asserted once the server defaulted it,
  and the object the server returns carries no secret;
* a sample of the rejected cases, each through the launcher on the real backend, fails with
  the field named and leaves no TrainJob anywhere;
* host access is granted by an annotated ClusterTrainingRuntime, never by a namespaced
  TrainingRuntime.
"""

from __future__ import annotations

import io
import json
import sys
import uuid
from pathlib import Path

import pytest
from kubernetes import client

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "unit"))

from hostile_cases import BASE, CANARIES, CASES, Case  # noqa: E402

from kfp_trainer import spec  # noqa: E402
from kfp_trainer.backends.kubernetes import KubernetesBackend  # noqa: E402
from kfp_trainer.errors import UserError  # noqa: E402
from kfp_trainer.launcher import Launcher, LaunchOptions  # noqa: E402
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import ALLOW_HOST_ACCESS_ANNOTATION, TrainJobInputs, render  # noqa: E402

pytestmark = pytest.mark.timeout(300)

# The test cluster serves the Trainer v2.3 CRDs: the v2.2+ API.
ACCEPTED = [c for c in CASES if c.accepted and c.api_version == "v2.2"]
REJECTED = [c for c in CASES if not c.accepted and c.api_version == "v2.2" and "launcher" in c.layers]
SAMPLE = REJECTED[::3]  # every third: each kind of input and every patch policy


def _inputs(case: Case, namespace: str) -> dict:
    return {**BASE, "namespace": namespace, **case.inputs}  # the case's own namespace or run id wins


def _all_trainjobs(api_client) -> set[str]:
    items = client.CustomObjectsApi(api_client).list_cluster_custom_object(spec.GROUP, spec.VERSION, spec.PLURAL)["items"]
    return {i["metadata"]["uid"] for i in items}


@pytest.mark.parametrize("case", ACCEPTED, ids=[c.id for c in ACCEPTED])
def test_accepted_hostile_input_passes_the_servers_strict_dry_run_with_no_secret_in_what_it_returns(case, api_client, namespace):
    manifest = render(TrainJobInputs.parse(**_inputs(case, namespace)), allow_host_access=case.allow_host_access)
    stored = client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, spec.PLURAL, manifest, dry_run="All", field_validation="Strict"
    )
    shown = json.dumps(stored)
    assert not [c for c in CANARIES if c in shown]
    assert case.check(stored), "the server changed what was rendered"  # type: ignore[misc]
    assert (
        client.CustomObjectsApi(api_client).list_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL)["items"] == []
    )


def test_rejected_hostile_inputs_name_the_field_and_leave_no_trainjob_anywhere(kube_client, api_client, namespace):
    before = _all_trainjobs(api_client)
    backend = KubernetesBackend(kube_client, namespace=namespace)
    wrong = []
    for case in SAMPLE:
        out = io.StringIO()
        try:
            inputs = TrainJobInputs.parse(**_inputs(case, namespace))
            Launcher(backend, LaunchOptions(start_timeout=5, logs="none"), out=out).run(prepare(backend, inputs))
            wrong.append(f"{case.id}: accepted")
        except UserError as e:
            shown = str(e) + out.getvalue()
            if case.field not in shown or any(c in shown for c in CANARIES):  # type: ignore[operator]
                wrong.append(f"{case.id}: {shown[:200]}")
    assert wrong == []
    assert len(SAMPLE) >= 40
    assert _all_trainjobs(api_client) - before == set()


def _runtime(kind: str, name: str, namespace: str | None, allow: bool) -> dict:
    metadata: dict = {"name": name, "annotations": {ALLOW_HOST_ACCESS_ANNOTATION: "true"} if allow else {}}
    if namespace:
        metadata["namespace"] = namespace
    node = {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [{"name": "node", "image": "busybox:1"}]}}}}}
    return {
        "apiVersion": spec.API_VERSION,
        "kind": kind,
        "metadata": metadata,
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [node]}}},
    }


def test_host_access_is_granted_by_an_annotated_cluster_runtime_and_never_by_a_namespaced_one(kube_client, api_client, namespace):
    custom = client.CustomObjectsApi(api_client)
    cluster_name = f"host-ok-{uuid.uuid4().hex[:8]}"
    custom.create_cluster_custom_object(
        spec.GROUP, spec.VERSION, "clustertrainingruntimes", _runtime("ClusterTrainingRuntime", cluster_name, None, True)
    )
    custom.create_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, "trainingruntimes", _runtime("TrainingRuntime", "team-host", namespace, True)
    )
    host = {"volumes": [{"name": "shm", "hostPath": {"path": "/dev/shm"}}], "volume_mounts": [{"name": "shm", "mountPath": "/dev/shm"}]}
    backend = KubernetesBackend(kube_client, namespace=namespace)
    try:
        allowed = TrainJobInputs(run_id="r", task_name="t", namespace=namespace, runtime=cluster_name, **host)
        info = backend.resolve_runtime(allowed)
        assert info.allow_host_access is True
        manifest = render(allowed, api_version=info.api_version, runtime_jobs=info.job_names, allow_host_access=info.allow_host_access)
        stored = custom.create_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, manifest, dry_run="All")
        node = stored["spec"]["runtimePatches"][0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]
        assert node["template"]["spec"]["template"]["spec"]["volumes"][0]["hostPath"] == {"path": "/dev/shm"}

        refused = TrainJobInputs(
            run_id="r", task_name="t", namespace=namespace, runtime="team-host", runtime_kind="TrainingRuntime", **host
        )
        with pytest.raises(UserError, match=r"volumes\[0\]\.hostPath"):
            Launcher(backend, LaunchOptions(start_timeout=5, logs="none"), out=io.StringIO()).run(prepare(backend, refused))
        plain = TrainJobInputs(run_id="r", task_name="t", namespace=namespace, runtime="torch-distributed", **host)
        with pytest.raises(UserError, match=r"volumes\[0\]\.hostPath"):
            Launcher(backend, LaunchOptions(start_timeout=5, logs="none"), out=io.StringIO()).run(prepare(backend, plain))
        assert custom.list_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL)["items"] == []
    finally:
        custom.delete_cluster_custom_object(spec.GROUP, spec.VERSION, "clustertrainingruntimes", cluster_name)
