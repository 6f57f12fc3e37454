"""The oldest API server supported, Kubernetes 1.32 (hack/k8s/kube-1.32), beside 1.36.

A cluster of its own for this module: kube-apiserver, kube-controller-manager and
kube-scheduler v1.32.2, the same etcd, KWOK and Trainer/JobSet controllers, no real node
(its kubelet 1.36 must not be newer than the API server).

1.32 serves streaming lists (WatchList, beta, on by default): the fixture checks that first,
then restarts the API server with ``WatchList=false`` -- the default of 1.33 and of a cluster
that turned the gate off -- so that every test here runs the launcher's list + watch fallback
against a real server, and checks (the client's ``lists.counts``) that no streaming list got through.
The launcher, lifecycle and log tests below are the 1.36 ones, run again here.
"""

from __future__ import annotations

import os
import time

import pytest
import testcluster
from helpers import wait_for
from k8s_objects import MADE, list_counts
from k8s_objects import kube_client as kube_client_for
from kubernetes import client

# The 1.36 tests run here again (pytest collects what this module imports).
from test_launcher_k8s import (  # noqa: F401  (collected as tests of this module)
    inputs,
    launch,
    test_failure_carries_reason_failed_pod_and_log_tail,
    test_launcher_survives_forced_disconnects,
    test_logs_survive_container_restarts_without_loss_or_repeats,
    test_retry_adopts_the_running_job_without_a_duplicate,
    test_success_streams_logs_and_parses_metrics,
    test_unschedulable_pods_are_reported_after_the_blocker_grace,
)
from test_lifecycle_k8s import (  # noqa: F401
    test_a_terminating_job_is_never_adopted_the_new_one_is_created_once_it_is_gone,
    test_a_watch_from_a_compacted_version_gets_a_real_410_and_relists,
    test_delete_waits_with_watches_until_the_jobs_and_pods_are_gone,
)
from testcluster import PodScript
from testcluster.binaries import OLD_KUBE_VERSION

from kfp_trainer.backends.kube.apierrors import APIError
from kfp_trainer.backends.kube.client import Client
from kfp_trainer.backends.kube.watch import INITIAL_EVENTS, streaming_lists_refused, watch

pytestmark = pytest.mark.timeout(180)
OLD = OLD_KUBE_VERSION
# The tests that run the launcher in this process: their pod and event caches must have listed.
LAUNCHER_TESTS = {
    "test_failure_carries_reason_failed_pod_and_log_tail",
    "test_launcher_survives_forced_disconnects",
    "test_logs_survive_container_restarts_without_loss_or_repeats",
    "test_retry_adopts_the_running_job_without_a_duplicate",
    "test_success_streams_logs_and_parses_metrics",
    "test_unschedulable_pods_are_reported_after_the_blocker_grace",
}
_DEFAULT_GATES: dict[str, object] = {}  # what the 1.32 server did with its own feature gates


def _streaming_list(api) -> dict[str, int]:
    """How a watch with a streaming list listed the default namespace's config maps (counts)."""
    before = dict(api.lists.counts)
    next(e for e in watch(api, "/api/v1/namespaces/default/configmaps", [], initial_events=True, timeout_seconds=5) if e)
    return {k: api.lists.counts[k] - before.get(k, 0) for k in ("streaming", "list", "refused")}


def _launch_with_default_gates(api, kube: Client) -> dict[str, object]:
    """A short job through the launcher; whether it succeeded and how its watches listed."""
    core = client.CoreV1Api(api)
    ns = "v1-32-default-gates"
    core.create_namespace({"metadata": {"name": ns}})
    wait_for(lambda: core.list_namespaced_service_account(ns).items, what="default service account")
    before = dict(kube.lists.counts)
    outcome, out = launch(kube, inputs(ns), PodScript(lines=["step 1", "done"]))
    done = {k: kube.lists.counts[k] - before.get(k, 0) for k in ("streaming", "list", "refused")}
    return {"succeeded": outcome.succeeded, "relayed": "done" in out, **done}


def _wait_ready(c: testcluster.TestCluster, timeout: float = 60) -> None:
    deadline = time.monotonic() + timeout
    while not c.is_running():
        if time.monotonic() > deadline:
            raise testcluster.ClusterError(f"kube-apiserver not ready {timeout}s after its restart")
        time.sleep(0.2)


@pytest.fixture(scope="module")
def cluster():
    """A 1.32 cluster (module): streaming lists probed with the default gates, then turned off."""
    c = testcluster.TestCluster(
        "kfp-trainer-v1-32",
        unique=True,
        reuse=False,
        real_node=False,
        kube_version=OLD,
        verbose=os.environ.get("KFP_TRAINER_CLUSTER_VERBOSE") == "1",
    )
    try:
        c.start(build=True)
        c.wait_gc_ready()  # its probe, before the API server restart below would cut its requests
        with c.api_client() as api, kube_client_for(c.kubeconfig) as kube:
            _DEFAULT_GATES["probe"] = _streaming_list(kube)
            _DEFAULT_GATES["version"] = client.VersionApi(api).get_code().git_version
            _DEFAULT_GATES["launch"] = _launch_with_default_gates(api, kube)
        c.restart_api_server("WatchList=false")
        _wait_ready(c)
        # Fresh informers for the Trainer's webhooks (they read runtimes from them): their first
        # list is then the fallback too, and nothing waits out a reconnect backoff.
        c.restart("controllers")
    except testcluster.BinariesUnavailable as e:
        if os.environ.get("CI", "").lower() in ("1", "true", "yes"):
            pytest.fail(f"Kubernetes {OLD} control plane unavailable (CI): {e}", pytrace=False)
        pytest.skip(f"Kubernetes {OLD} control plane unavailable: {e}")
    except testcluster.ClusterError as e:
        logs = "\n".join(f"--- {n}\n{p.read_text(errors='replace')[-2000:]}" for n, p in sorted(c.component_logs().items()))
        c.stop()
        pytest.fail(f"Kubernetes {OLD} cluster failed to start: {e}\n{logs}", pytrace=False)
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def api_client(cluster):
    api = cluster.api_client()
    yield api
    api.close()


@pytest.fixture(scope="module")
def kube_client(cluster):
    api = kube_client_for(cluster.kubeconfig)
    yield api
    api.close()


@pytest.fixture(autouse=True)
def lists_instead_of_streaming_lists(request, cluster, kube_client):
    """No streaming list gets through; the launcher's caches were refused one (this test, or
    an earlier one with the same client: the refusal is remembered per client) and listed.
    A failed test gets this cluster's component log tails (conftest's are the 1.36 cluster's)."""
    before = dict(list_counts())  # every client the tests made: the session's and a test's own (through a proxy)
    yield
    report = getattr(request.node, "report_call", None)  # set by conftest
    if report is not None and report.failed:
        for name, path in sorted(cluster.component_logs().items()):
            if name in ("controllers", "podscript", "kwok-controller", "kube-controller-manager", "kube-apiserver"):
                print(f"--- {name} ({path})\n" + "".join(path.read_text(errors="replace").splitlines(True)[-20:]))
    done = {k: list_counts()[k] - before.get(k, 0) for k in ("streaming", "list", "refused")}
    assert done["streaming"] == 0, done
    if request.node.name in LAUNCHER_TESTS and report is not None and report.passed:
        assert done["list"] >= 1 and (done["refused"] >= 1 or any(streaming_lists_refused(c) for c in list(MADE))), done


def test_the_cluster_runs_kubernetes_1_32(cluster, api_client):
    assert _DEFAULT_GATES["version"] == OLD
    assert client.VersionApi(api_client).get_code().git_version == OLD
    assert not cluster.want_real_node


def test_with_its_default_gates_1_32_serves_streaming_lists():
    assert _DEFAULT_GATES["probe"] == {"streaming": 1, "list": 0, "refused": 0}


def test_with_its_default_gates_1_32_runs_the_launcher_on_streaming_lists():
    launched = _DEFAULT_GATES["launch"]
    assert launched["succeeded"] and launched["relayed"], launched
    assert launched["streaming"] >= 1 and launched["list"] == 0 and launched["refused"] == 0, launched


def test_with_watchlist_off_a_streaming_list_is_refused_with_422_and_the_watch_lists(kube_client):
    query = [("watch", "true"), ("allowWatchBookmarks", "true"), *INITIAL_EVENTS, ("resourceVersion", "")]
    with pytest.raises(APIError) as info:
        kube_client.request("GET", "/api/v1/namespaces/default/configmaps", query=query, timeout=10, stream=True)
    assert (info.value.status, info.value.reason) == (422, "Invalid")
    assert "unless the WatchList feature gate is enabled" in info.value.message
    with cluster_api(kube_client) as fresh:
        assert _streaming_list(fresh) == {"streaming": 0, "list": 1, "refused": 1}
        assert streaming_lists_refused(fresh)


def cluster_api(api: Client) -> Client:
    """A new API client for the same server (the refusal is remembered per client)."""
    return Client(api.credentials)
