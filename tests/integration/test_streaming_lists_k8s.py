"""Kubernetes 1.36 serves streaming lists: the launcher's watches use them (one request where
list + watch took two) and never fall back to listing. test_k8s_v1_32.py has the other side:
a server that refuses them."""

from __future__ import annotations

import pytest
from k8s_objects import kube_client
from kubernetes import client
from test_launcher_k8s import inputs, launch
from testcluster import PodScript
from testcluster.binaries import KUBE_VERSION

from kfp_trainer.backends.kube.watch import streaming_lists_refused, watch

pytestmark = pytest.mark.timeout(120)


def counts_since(api, before: dict[str, int]) -> dict[str, int]:
    """How the watches on ``api`` listed since ``before`` (its counts then)."""
    return {k: api.lists.counts[k] - before.get(k, 0) for k in ("streaming", "list", "refused")}


def test_the_session_cluster_runs_kubernetes_1_36(api_client):
    assert client.VersionApi(api_client).get_code().git_version == KUBE_VERSION


def test_a_watch_with_initial_events_gets_a_streaming_list(cluster):
    with kube_client(cluster.kubeconfig) as api:
        before = dict(api.lists.counts)
        next(e for e in watch(api, "/api/v1/namespaces/default/configmaps", [], initial_events=True, timeout_seconds=5) if e)
        assert counts_since(api, before) == {"streaming": 1, "list": 0, "refused": 0}
        assert not streaming_lists_refused(api)


def test_the_launcher_follows_a_job_with_streaming_lists_only(cluster, namespace):
    with kube_client(cluster.kubeconfig) as api:
        before = dict(api.lists.counts)
        outcome, out = launch(api, inputs(namespace), PodScript(lines=["step 1", "done"]))
        assert outcome.succeeded and "done" in out
        done = counts_since(api, before)
        assert done["streaming"] >= 1 and done["list"] == 0 and done["refused"] == 0, done
