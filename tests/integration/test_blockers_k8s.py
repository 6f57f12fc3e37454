"""Pods refused at creation fail the step within seconds, with the admission's own words.

The refusals are real: the Job controller's ``FailedCreate`` events for pods that PodSecurity
admission, a ResourceQuota or a LimitRange rejects. The Job stands in for what JobSet creates.
"""

from __future__ import annotations

import io
import time

import pytest
from k8s_objects import backend, get_trainjob, inputs, owned_job, trainjobs, wait_for
from kubernetes import client

from kfp_trainer.errors import CannotStartError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare

pytestmark = pytest.mark.timeout(120)
POD = {"restartPolicy": "Never", "containers": [{"name": "node", "image": "busybox"}]}


def quota(api, namespace):
    core = client.CoreV1Api(api)
    core.create_namespaced_resource_quota(namespace, {"metadata": {"name": "no-pods"}, "spec": {"hard": {"pods": "0"}}})
    # Admission enforces a quota once the quota controller has filled in its status.
    wait_for(lambda: (core.read_namespaced_resource_quota("no-pods", namespace).status.hard or {}).get("pods") == "0", what="quota")
    return POD, "exceeded quota"


def limit_range(api, namespace):
    body = {"metadata": {"name": "small"}, "spec": {"limits": [{"type": "Container", "max": {"cpu": "1"}}]}}
    client.CoreV1Api(api).create_namespaced_limit_range(namespace, body)
    pod = {"restartPolicy": "Never", "containers": [{"name": "node", "image": "busybox", "resources": {"limits": {"cpu": "2"}}}]}
    return pod, "maximum cpu usage per Container is 1"


def pod_security(api, namespace):
    labels = {"pod-security.kubernetes.io/enforce": "restricted"}
    client.CoreV1Api(api).patch_namespace(namespace, {"metadata": {"labels": labels}})
    return POD, 'violates PodSecurity "restricted'


@pytest.mark.parametrize("refusal", [quota, limit_range, pod_security], ids=["ResourceQuota", "LimitRange", "PodSecurity"])
def test_pods_refused_at_creation_fail_the_step_within_seconds(kube_client, api_client, namespace, refusal):
    pod_spec, words = refusal(api_client, namespace)
    out = io.StringIO()
    options = LaunchOptions(start_timeout=90, blocker_check_interval=0.5, fatal_blocker_grace=2, logs="0")

    def jobset_stand_in(ref):
        owned_job(api_client, get_trainjob(api_client, namespace, ref.name), pod_spec=pod_spec)

    launcher = Launcher(backend(kube_client, namespace), options, out=out, on_submitted=jobset_stand_in)
    started = time.monotonic()
    with pytest.raises(CannotStartError) as info:
        launcher.run(prepare(launcher.backend, inputs(namespace, suspend=True)))
    took = time.monotonic() - started
    assert took < 30, took
    assert info.value.reason == "FailedCreate"
    assert words in str(info.value)
    assert "not starting yet: FailedCreate: Job" in out.getvalue()  # the Job that refused: <name>-extra-0
    wait_for(lambda: trainjobs(api_client, namespace) == [], timeout=10, what="the TrainJob deleted")
