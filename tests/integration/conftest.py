"""Fixtures for the integration tests: the test control plane (hack/k8s/testcluster) with
the real Kubeflow Trainer and JobSet controllers, pods played by KWOK.

* ``cluster`` (session): builds the binaries if needed, starts the cluster, yields the
  ``TestCluster`` (``.kubeconfig``, ``.server``, ``.api_client()``, ...), deletes it at
  the end. When the binaries cannot be had, the tests fail under CI (``CI=true``) and
  are skipped otherwise, with the reason. Feature gates of the controllers come from
  ``KFP_TRAINER_FEATURE_GATES`` (``TrainJobStatus=true``); a test may switch them with
  ``cluster.restart_controllers(feature_gates=...)``.
* ``real_node`` (session): the machine's real node (a kubelet with containerd and CoreDNS,
  ``testcluster.realnode``), started with the cluster when a selected test asks for it.
* ``namespace`` (function): a fresh namespace, deleted afterwards.
* What a pod does is scripted on the pod: ``PodScript(...).annotations()`` as the
  launcher's ``pod_annotations`` (docs/controlplane.md, "Scripting pods").

A failing test that used the cluster gets the tail of the controllers', kwok's and the
pod scripting process's logs in its report.
"""

from __future__ import annotations

import os
import sys
import threading
import time
import uuid
from pathlib import Path

import pytest
from kubernetes import client

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import testcluster  # noqa: E402  (hack/k8s/testcluster)
from helpers import wait_for  # noqa: E402  (tests/integration/helpers.py)

_IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
_BUILD_ERROR: str | None = None
_BUILD: threading.Thread | None = None  # builds the binaries while the tests that need no cluster run
_BUILD_LOG: list[str] = []
_WANT_REAL_NODE = False  # a selected test runs real pods
_IMPORT_IMAGES = False  # a selected test runs the project's images on the real node
_CLUSTER: testcluster.TestCluster | None = None
# Component logs attached to a failing test's report (last lines of each).
_REPORTED_LOGS = ("controllers", "kueue", "podscript", "kwok-controller", "kube-controller-manager", "kubelet", "containerd", "coredns")


def _unavailable(reason: str):
    if _IN_CI:
        pytest.fail(f"integration control plane unavailable (CI): {reason}", pytrace=False)
    pytest.skip(f"integration control plane unavailable: {reason}")


def _log_tails(c: testcluster.TestCluster, names=None, lines: int = 20) -> str:
    tails = []
    for name, path in sorted(c.component_logs().items()):
        if names is not None and name not in names:
            continue
        try:
            tails.append(f"--- {name} ({path})\n" + "".join(path.read_text(errors="replace").splitlines(True)[-lines:]))
        except OSError:
            pass
    return "\n".join(tails)


def _node_state(c: testcluster.TestCluster) -> str:
    """Each node's taints and its conditions that are not as a healthy node has them: why a pod
    waits unschedulable ("1 node(s) had untolerated taint(s)" names no taint)."""
    from kubernetes import client

    healthy = {"Ready": "True"}
    lines = []
    try:
        for n in client.CoreV1Api(c.api_client()).list_node(_request_timeout=10).items:
            taints = [f"{t.key}={t.value or ''}:{t.effect}" for t in n.spec.taints or []]
            conds = [f"{k.type}={k.status} ({k.reason})" for k in n.status.conditions or [] if k.status != healthy.get(k.type, "False")]
            lines.append(f"{n.metadata.name}: taints {taints or 'none'}; conditions off {conds or 'none'}")
    except Exception as e:  # noqa: BLE001 - the report says it could not look; the test's own failure stands
        lines.append(f"(nodes not readable: {e!r})")
    return "\n".join(lines)


def uses_cluster(item: pytest.Item) -> bool:
    return "cluster" in getattr(item, "fixturenames", ())


def pytest_collection_modifyitems(session, config, items):
    """Start building the control plane binaries when a selected test needs them; run those tests last.

    The tests that need no cluster (unit, local, doctests) run while the build goes on: on a new
    machine it takes about 20 minutes on 2 cores. The first test that needs the cluster waits for
    it in :func:`pytest_runtest_protocol`, outside the per-test timeout (pytest-timeout counts
    fixture setup). build.sh takes a lock, so the build ``make test`` started beside the Python
    setup is waited for, not repeated."""
    global _WANT_REAL_NODE, _IMPORT_IMAGES, _BUILD
    _WANT_REAL_NODE = any("real_node" in getattr(i, "fixturenames", ()) for i in items)
    # a selected real-pod test runs the project's images (its module imports hack/k8s/images.py)
    _IMPORT_IMAGES = any("real_node" in getattr(i, "fixturenames", ()) and hasattr(getattr(i, "module", None), "images") for i in items)
    if not any(uses_cluster(i) for i in items) or config.option.collectonly:
        return
    items[:] = [i for i in items if not uses_cluster(i)] + [i for i in items if uses_cluster(i)]
    _BUILD = threading.Thread(target=_build, name="control-plane-build", daemon=True)
    _BUILD.start()


def _build() -> None:
    global _BUILD_ERROR

    class _Lines:
        def write(self, line: str) -> None:
            if line.strip():
                _BUILD_LOG.append(line.rstrip())

        def flush(self) -> None:
            pass

    try:
        testcluster.binaries(build=True, log=_Lines())
    except testcluster.BinariesUnavailable as e:
        _BUILD_ERROR = str(e)
    except Exception as e:  # noqa: BLE001 - said as the tests' reason, not lost in a thread
        _BUILD_ERROR = f"building the control plane failed: {e!r}"


@pytest.hookimpl(hookwrapper=True, tryfirst=True)
def pytest_runtest_protocol(item, nextitem):
    """The first test that needs the cluster waits here for the build, before its timeout starts."""
    if _BUILD is not None and _BUILD.is_alive() and uses_cluster(item):
        tr = item.config.pluginmanager.get_plugin("terminalreporter")
        started = time.monotonic()
        if tr is not None:
            tr.write_line(f"[control plane build] waiting for it before {item.nodeid}")
        _BUILD.join()
        if tr is not None:
            for line in _BUILD_LOG:
                tr.write_line(f"[control plane build] {line}")
            tr.write_line(f"[control plane build] waited {time.monotonic() - started:.0f} s")
    yield


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    setattr(item, f"report_{report.when}", report)  # the fault check reads the test's own outcome
    # The test's own cluster (another Trainer release's, test_trainer_versions.py) or the session's.
    used = getattr(item, "funcargs", {}).get("cluster") or _CLUSTER
    if report.failed and used is not None and "cluster" in getattr(item, "fixturenames", ()):
        report.sections.append(("nodes", _node_state(used)))
        report.sections.append(("control plane logs", _log_tails(used, _REPORTED_LOGS)))


@pytest.fixture(scope="session")
def cluster():
    global _CLUSTER
    if _BUILD_ERROR is not None:
        _unavailable(_BUILD_ERROR)
    verbose = os.environ.get("KFP_TRAINER_CLUSTER_VERBOSE", "") == "1"
    reuse = os.environ.get("KFP_TRAINER_REUSE_CLUSTER", "") in ("1", "true", "yes")
    # Without reuse every session runs its own cluster (<name>-<pid>), so parallel sessions
    # never delete each other's; clusters of dead sessions are removed on start.
    # The real node (one per machine) only when a selected test runs real pods.
    c = testcluster.TestCluster(verbose=verbose, reuse=reuse, unique=not reuse, real_node=_WANT_REAL_NODE)
    try:
        c.start(build=True)
    except testcluster.BinariesUnavailable as e:
        _unavailable(str(e))
    except testcluster.ClusterError as e:
        # A cluster that does not come up is a failure, not a skip: the binaries exist.
        with_logs = _log_tails(c)
        try:
            c.stop()
        finally:
            pytest.fail(f"test cluster failed to start: {e}\n{with_logs}", pytrace=False)
    _CLUSTER = c
    early = None
    if _IMPORT_IMAGES and c.real_node is not None:  # the project's images reach the node while KWOK tests run
        early = threading.Thread(target=_import_images, args=(c,), name="image-import", daemon=True)
        early.start()
    try:
        yield c
    finally:
        _CLUSTER = None
        if early is not None:
            early.join(600)
        if not c.reuse:
            c.stop()


def _import_images(c: testcluster.TestCluster) -> None:
    """Imports the component and trainer images into the real node (minutes on a new machine's node).

    The real-pod tests import them too (``images.import_into`` skips what is there, under a lock);
    started with the cluster, the import overlaps the tests that need no real pods. A failure
    here is left to those tests to report."""
    import images  # hack/k8s/images.py

    for name in ("component", "trainer"):
        try:
            images.import_into(name, str(c.real_node.containerd.socket))
        except Exception:  # noqa: BLE001, S112 - the test that needs the image says what went wrong
            continue


@pytest.fixture(scope="session")
def real_node(cluster):
    """The real node of the session's cluster (``testcluster.realnode.RealNode``): pods that
    tolerate its taint and select its label (``realnode.pod_spec_for_real_node()``) run there
    as real containers; ``real_node.image("probe")`` is the test image."""
    node = cluster.real_node
    if not node.running():
        pytest.fail(f"the real node is not running (logs: {node.logs_dir})", pytrace=False)
    return node


@pytest.fixture(scope="session")
def kueue(cluster):
    """Kueue v0.17.0 in the session's cluster (``testcluster.kueue.KueueManager``), started by the
    first test that asks; its queue objects are made with ``testcluster.queues``."""
    try:
        return cluster.start_kueue()
    except testcluster.ClusterError as e:
        pytest.fail(f"Kueue did not start: {e}\n{_log_tails(cluster, ['kueue'])}", pytrace=False)


@pytest.fixture(scope="session")
def api_client(cluster):
    """The ``kubernetes`` library's client for the admin kubeconfig: the tests' own hands (set-up, what was stored)."""
    client = cluster.api_client()
    yield client
    client.close()


@pytest.fixture(scope="session")
def kube_client(cluster):
    """The backend's own client (``kfp_trainer.backends.kube.client``) for the admin kubeconfig, its credentials read
    as a launch reads them: every backend a test builds runs on it."""
    from k8s_objects import kube_client as make

    api = make(cluster.kubeconfig)
    yield api
    api.close()


@pytest.fixture
def namespace(cluster, api_client):
    core = client.CoreV1Api(api_client)
    name = f"it-{uuid.uuid4().hex[:10]}"
    core.create_namespace({"metadata": {"name": name, "labels": {"kfp-trainer.test/integration": "true"}}})
    # Pods need the namespace's default service account (the controller manager makes it).
    deadline = time.monotonic() + 30
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            break
        except client.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)
    yield name
    try:
        core.delete_namespace(name, propagation_policy="Background")
    except client.ApiException as e:
        if e.status != 404:
            raise


@pytest.fixture(scope="session")
def ledger(cluster):
    """Every TrainJob the API server stores during the session (tests/integration/faults.py)."""
    from faults import Ledger
    from k8s_objects import kube_client as make

    api = make(cluster.kubeconfig)
    ledger = Ledger(api).start()
    yield ledger
    ledger.close()
    api.close()


@pytest.fixture
def checked(request, kube_client, namespace, ledger):
    """A fault test's namespace, checked when the test ends: no TrainJob, JobSet, Job or pod is
    left (within ``LEFT_WITHIN`` s) and no two TrainJobs of one run and task were ever alive at
    once, counted by the session's own watch (the ledger), not by the launcher's output."""
    from faults import record, wait_nothing_left

    started = time.monotonic()
    yield namespace
    leaked: list[str] = []
    try:
        wait_nothing_left(kube_client, namespace, within=LEFT_WITHIN)
    except AssertionError as e:
        leaked = [str(e)]
    ledger.wait_caught_up(namespace)
    created = ledger.created(namespace)
    duplicated = ledger.duplicates(namespace)
    call = getattr(request.node, "report_call", None)
    record(
        {
            "test": request.node.nodeid,
            "passed": bool(call and call.passed),
            "trainjobs": len(created),
            "leaked": len({e.uid for e in created if e.deleted is None}),
            "leftovers": leaked,
            "duplicated": len(duplicated),
            "seconds": round(time.monotonic() - started, 2),
        }
    )
    assert not leaked, leaked[0]
    assert not duplicated, [(a.name, a.uid, b.name, b.uid) for a, b in duplicated]


LEFT_WITHIN = 30.0


# Argo's Workflow kind, served without its controller: what `kfp-trainer gc` reads to tell a run gone.
WORKFLOW_CRD = {
    "apiVersion": "apiextensions.k8s.io/v1",
    "kind": "CustomResourceDefinition",
    "metadata": {"name": "workflows.argoproj.io"},
    "spec": {
        "group": "argoproj.io",
        "names": {"kind": "Workflow", "plural": "workflows", "singular": "workflow", "listKind": "WorkflowList"},
        "scope": "Namespaced",
        "versions": [
            {
                "name": "v1alpha1",
                "served": True,
                "storage": True,
                "subresources": {"status": {}},
                "schema": {"openAPIV3Schema": {"type": "object", "x-kubernetes-preserve-unknown-fields": True}},
            }
        ],
    },
}


@pytest.fixture
def workflows(api_client):
    ext = client.ApiextensionsV1Api(api_client)
    try:
        ext.create_custom_resource_definition(WORKFLOW_CRD)
    except client.ApiException as e:
        if e.status != 409:
            raise
    custom = client.CustomObjectsApi(api_client)

    def served():
        try:
            custom.list_cluster_custom_object("argoproj.io", "v1alpha1", "workflows")
            return True
        except client.ApiException:
            return False

    wait_for(served, what="the Workflow kind served")
    yield custom
    ext.delete_custom_resource_definition("workflows.argoproj.io")
