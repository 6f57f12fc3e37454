"""Faults: jobs the cluster will not run, refused by the real controllers and admission.

* pods refused at creation (PodSecurity ``restricted``, a ResourceQuota, a LimitRange): the
  job controller's ``FailedCreate`` on the Jobs the real JobSet controller made;
* Jobs refused (a quota of zero Jobs): the JobSet controller's ``JobCreationFailed``;
* the JobSet refused: the Trainer's ``TrainJobResourcesCreationFailed``;
* a job too large for the API server, the Trainer webhooks' answers to the version probe and
  to a create they deny.

Each fails the step within seconds with the refusal's own words and leaves nothing behind.
"""

from __future__ import annotations

import json
import time

import pytest
from faults import Output, leftovers, start_launch
from helpers import wait_for
from k8s_objects import recording
from kubernetes import client

from kfp_trainer import spec
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import RejectedError

pytestmark = pytest.mark.timeout(180)


def quota(api, namespace: str, hard: dict[str, str]) -> None:
    core = client.CoreV1Api(api)
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "limit"}, "spec": {"hard": hard}})
    # Admission enforces a quota once the quota controller has filled in its status.
    wait_for(lambda: (core.read_namespaced_resource_quota("limit", namespace).status.hard or {}) == hard, what="quota in force")


def pod_security(api, namespace: str) -> tuple[tuple[str, ...], str, str]:
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": {"pod-security.kubernetes.io/enforce": "restricted"}}})
    return (), "FailedCreate", 'violates PodSecurity "restricted:latest"'


def pod_quota(api, namespace: str) -> tuple[tuple[str, ...], str, str]:
    quota(api, namespace, {"pods": "0"})
    return (), "FailedCreate", "exceeded quota: limit"


def limit_range(api, namespace: str) -> tuple[tuple[str, ...], str, str]:
    body = {"metadata": {"name": "small"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "1"}}]}}
    client.CoreV1Api(api).create_namespaced_limit_range(namespace, body)
    resources = json.dumps({"limits": {"cpu": "2"}, "requests": {"cpu": "2"}})
    return ("--resources-per-node", resources), "FailedCreate", "maximum cpu usage per Container is 1"


def job_quota(api, namespace: str) -> tuple[tuple[str, ...], str, str]:
    quota(api, namespace, {"count/jobs.batch": "0"})
    return (), "JobCreationFailed", "exceeded quota: limit"


def jobset_quota(api, namespace: str) -> tuple[tuple[str, ...], str, str]:
    quota(api, namespace, {"count/jobsets.jobset.x-k8s.io": "0"})
    return (), "TrainJobResourcesCreationFailed", "exceeded quota: limit"


@pytest.mark.parametrize(
    "refusal",
    [pod_security, pod_quota, limit_range, job_quota, jobset_quota],
    ids=["PodSecurity-restricted", "ResourceQuota-pods", "LimitRange", "JobSet-JobCreationFailed", "Trainer-ResourcesCreationFailed"],
)
def test_a_job_the_cluster_refuses_to_run_fails_within_seconds_with_the_refusals_words(kube_client, cluster, api_client, checked, refusal):
    extra, reason, words = refusal(api_client, checked)
    started = time.monotonic()
    out = Output(start_launch(cluster.kubeconfig, checked, "refused", "--num-nodes", "2", *extra))
    rc = out.finish(timeout=120)
    took = time.monotonic() - started
    assert rc == 1, out.text
    assert f"cannot start: {reason}: " in out.text and words in out.text, out.text
    assert f"not starting yet: {reason}: " in out.text
    assert "CannotStartError: deleting TrainJob" in out.text
    assert took < 45, took  # the default start_timeout is an hour; the fatal grace is 10 s
    assert leftovers(kube_client, checked) == []


# ----------------------------------------------------------------------------- too large, webhooks


def test_an_oversized_job_is_refused_before_any_write_with_a_size_message(cluster, api_client, checked, tmp_path, ledger):
    inputs_file = tmp_path / "inputs.json"
    inputs_file.write_text(json.dumps({"env": {"BLOB": "x" * (2 * 1024 * 1024)}}))
    out = Output(start_launch(cluster.kubeconfig, checked, "big", "--inputs-file", str(inputs_file)))
    assert out.finish() == 2, out.text[:2000]
    assert "env[0].value: got '2.0 MiB'; expected at most 128.0 KiB (larger values cannot reach a process)" in out.text
    assert len(out.text) < 2000  # the value is not echoed back
    ledger.wait_caught_up(checked)
    assert ledger.created(checked) == []


def test_an_object_the_api_server_finds_too_large_is_the_users_error_and_not_retried(kube_client, api_client, checked):
    rec = recording(kube_client)
    backend = KubernetesBackend(rec, namespace=checked)
    manifest = spec.render(spec.TrainJobInputs(run_id="big", task_name="train", namespace=checked))
    manifest["spec"]["trainer"] = {"env": [{"name": "BLOB", "value": "x" * 1_600_000}]}  # past our checks: the server's answer
    with pytest.raises(RejectedError, match="too large") as info:
        backend.submit(manifest)
    assert info.value.exit_code == 2
    assert rec.count("POST", f"/{spec.PLURAL}") == 1


def test_the_trainer_webhook_answers_the_version_probe_and_nothing_is_stored(kube_client, api_client, checked, ledger):
    rec = recording(kube_client)
    assert KubernetesBackend(rec, namespace=checked).detect_api_version() == "v2.2"
    probes = [r for r in rec.requests if r[0] == "POST"]
    assert len(probes) == 1 and probes[0][2].get("dryRun") == "All"
    # The Trainer's validating webhook refuses the probe's runtime (it does not exist): a v2.2+ API.
    assert rec.refused == [(422, "POST", f"/apis/{spec.GROUP}/{spec.VERSION}/namespaces/{checked}/{spec.PLURAL}")] or rec.refused == [
        (403, "POST", f"/apis/{spec.GROUP}/{spec.VERSION}/namespaces/{checked}/{spec.PLURAL}")
    ], rec.refused
    assert rec.count("GET", "/openapi/") == 0
    ledger.wait_caught_up(checked)
    assert ledger.created(checked) == []


def test_a_create_the_trainer_webhook_denies_is_a_clear_user_error(cluster, api_client, checked, ledger):
    out = Output(
        start_launch(
            cluster.kubeconfig, checked, "denied", "--runtime", "torchtune-llama3.2-1b", "--num-nodes", "2", "--command", "tune,run"
        )
    )
    assert out.finish() == 2, out.text
    assert 'admission webhook "validator.trainjob.trainer.kubeflow.org" denied the request' in out.text
    assert "must be 1 for llama3_2/1B model" in out.text and "rbac" not in out.text.lower()
    ledger.wait_caught_up(checked)
    assert ledger.created(checked) == []
