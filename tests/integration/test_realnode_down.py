"""Deleting a cluster with a real node leaves the host as it was: no process, mount, cgroup,
network link, iptables rule or changed sysctl; a node whose processes all died is cleaned up by
the next start. The session's own real node is stopped for the test (one per machine) and
started again afterwards."""

from __future__ import annotations

import os
import signal
import time

import pytest
from helpers import wait_for
from kubernetes import client
from realpods import probe_pod, wait_phase
from testcluster import TestCluster, hostguard, realnode
from testcluster.procs import pid_alive, processes_under


@pytest.fixture
def session_node_stopped(cluster, real_node):
    real_node.stop()
    try:
        yield
    finally:
        cluster.real_node.start(cluster.server, wait=cluster.real_node_wait)


def test_cluster_down_leaves_nothing_of_the_real_node(session_node_stopped):
    roots = (str(realnode.base_dir()),)
    before = hostguard.snapshot()
    c = TestCluster(f"kfp-trainer-down-{os.getpid()}", reuse=False, real_node=True)
    stopped = False
    try:
        t0 = time.monotonic()
        c.start()
        started = time.monotonic() - t0
        api = c.api_client()
        core = client.CoreV1Api(api)
        core.create_namespace({"metadata": {"name": "down"}})
        time.sleep(0.5)  # the namespace's default service account
        core.create_namespaced_persistent_volume_claim(
            "down",
            {"metadata": {"name": "data"}, "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}},
        )
        body = probe_pod("busy", c.real_node.image("probe"), ["write", "/data/x", "x", "+", "sleep", "inf"], volumes={"data": "/data"})
        body["spec"]["automountServiceAccountToken"] = True  # a projected token volume: a tmpfs mount of the kubelet
        core.create_namespaced_pod("down", body)
        wait_phase(core, "down", "busy", ("Running",))
        api.close()
        # While the node runs, the check sees what it changed (so it could see a leftover).
        changed = hostguard.leftovers(before, roots)
        assert any(x.startswith("cgroup ") for x in changed), changed
        assert any(x.startswith("mount ") for x in changed), changed
        assert any(x.startswith("link veth") for x in changed), changed
        assert any(x.startswith("sysctl ") for x in changed), changed
        assert processes_under(realnode.base_dir())
        # A crash: every process of the node killed at once; its mounts, cgroups, bridge and
        # sysctls stay. The next start takes the free lock and cleans up first.
        crashed = hostguard.cgroup_pids("kubepods") | {p for p, _ in processes_under(realnode.base_dir())}
        for pid in crashed:
            os.kill(pid, signal.SIGKILL)
        wait_for(lambda: not any(pid_alive(p) for p in crashed), what="the node's processes killed")
        assert any(x.startswith("mount ") for x in hostguard.leftovers(before, roots))
        c.real_node.start(c.server, wait=10)
        assert c.real_node.running()
        t0 = time.monotonic()
        c.stop()  # what `cluster.py down` and the end of a session do; raises if the node left anything
        stopped = True
        print(f"cluster with real node: up {started:.1f} s, down {time.monotonic() - t0:.1f} s")
    finally:
        if not stopped:
            c.stop()
    assert hostguard.leftovers(before, roots) == []
    assert processes_under(realnode.base_dir()) == []
    assert hostguard.cgroup_pids("kubepods") == set()
    assert realnode.owner_of() is None
    # The image store stays for the next run.
    assert (realnode.base_dir() / "containerd" / "root" / "io.containerd.content.v1.content").is_dir()
