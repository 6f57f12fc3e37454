"""Fixtures for the integration tests: a real control plane (hack/k8s/cluster.py)
and the trainer simulator (tests/integration/simulator.py).

* ``cluster`` (session): builds the binaries if needed, starts the cluster,
  yields it (``.kubeconfig``, ``.server``, ``.api_client()``), deletes it at the end.
  When the binaries cannot be had, the tests fail under CI (``CI=true``) and are
  skipped otherwise, with the reason.
* ``namespace`` (function): a fresh namespace, deleted afterwards.
* ``trainer_sim`` (function view of one session-wide simulator): script TrainJobs
  with ``trainer_sim.script(name, Script(...))``; scripts are forgotten after each test.
"""

from __future__ import annotations

import os
import sys
import time
import uuid
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import cluster as _cluster  # noqa: E402  (hack/k8s/cluster.py)
from simulator import Script, TrainerSimulator  # noqa: E402,F401

_IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")


def _unavailable(reason: str):
    if _IN_CI:
        pytest.fail(f"integration control plane unavailable (CI): {reason}", pytrace=False)
    pytest.skip(f"integration control plane unavailable: {reason}")


_BUILD_ERROR: str | None = None


def pytest_collection_modifyitems(session, config, items):
    """Build the control plane binaries before any test runs when a selected test needs them.

    Done here, not in the fixture, so a cold build (~20 min on 2 cores) is not cut short by the
    per-test timeout (pytest-timeout counts fixture setup)."""
    global _BUILD_ERROR
    if not any("cluster" in getattr(i, "fixturenames", ()) for i in items):
        return
    tr = config.pluginmanager.get_plugin("terminalreporter")

    class _Progress:
        def write(self, line: str) -> None:
            if tr is not None and line.strip():
                tr.write_line(f"[control plane build] {line.rstrip()}")

        def flush(self) -> None:
            pass

    try:
        _cluster.bin_dir(build=True, log=_Progress())
    except _cluster.BinariesUnavailable as e:
        _BUILD_ERROR = str(e)


@pytest.fixture(scope="session")
def cluster():
    if _BUILD_ERROR is not None:
        _unavailable(_BUILD_ERROR)
    verbose = os.environ.get("KFP_TRAINER_CLUSTER_VERBOSE", "") == "1"
    reuse = os.environ.get("KFP_TRAINER_REUSE_CLUSTER", "") in ("1", "true", "yes")
    # Without reuse every session runs its own cluster (<name>-<pid>), so parallel sessions
    # never delete each other's; clusters of dead sessions are removed on start.
    c = _cluster.TestCluster(verbose=verbose, reuse=reuse, unique=not reuse)
    try:
        c.start(build=True)
    except _cluster.BinariesUnavailable as e:
        _unavailable(str(e))
    except _cluster.ClusterError as e:
        # A cluster that does not come up is a failure, not a skip: the binaries exist.
        logs = c.component_logs()
        tails = []
        for name, path in sorted(logs.items()):
            try:
                tails.append(f"--- {name}\n" + "".join(path.read_text(errors="replace").splitlines(True)[-20:]))
            except OSError:
                pass
        with_logs = "\n".join(tails)
        try:
            c.stop()
        finally:
            pytest.fail(f"test cluster failed to start: {e}\n{with_logs}", pytrace=False)
    try:
        yield c
    finally:
        if not c.reuse:
            c.stop()


@pytest.fixture(scope="session")
def api_client(cluster):
    client = cluster.api_client()
    yield client
    client.close()


@pytest.fixture
def namespace(cluster, api_client):
    from kubernetes import client

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
def _trainer_sim_session(cluster):
    client = cluster.api_client()
    sim = TrainerSimulator(client, cluster.logs_dir, kwok_port=cluster.kwok_port).start()
    try:
        yield sim
    finally:
        sim.stop()
        client.close()


@pytest.fixture
def trainer_sim(_trainer_sim_session):
    sim = _trainer_sim_session
    sim.reset()
    yield sim
    sim.reset()
    errors, sim.errors[:] = list(sim.errors), []
    if errors:
        pytest.fail("trainer simulator errors:\n" + "\n".join(errors), pytrace=False)
