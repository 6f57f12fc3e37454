"""The bench's control plane: a test cluster with the audit log on, launcher identities, CPU counters.

* :func:`start_cluster` starts a cluster of its own (``kfp-trainer-bench-<pid>``) whose API
  server writes the audit log of :mod:`bench.audit`.
* :class:`Identities` makes one service account per launcher in :data:`audit.IDENTITY_NS`
  (cluster-admin through its group), asks a token for it and writes a kubeconfig with that
  token: every request of that launcher carries its name in the audit log.
* :func:`cpu_seconds` reads a process's CPU time (user + system) from ``/proc``.
"""

from __future__ import annotations

import os
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import yaml

from bench import audit, procs

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "hack" / "k8s"))
sys.path.insert(0, str(REPO / "hack" / "sdk"))

import peer_sdk  # noqa: E402  (hack/sdk/peer_sdk.py)
import testcluster  # noqa: E402  (hack/k8s/testcluster)

NS = audit.IDENTITY_NS


def start_cluster(verbose: bool = False) -> testcluster.TestCluster:
    """A new cluster with the bench's audit policy (its own name; stopped by the caller)."""
    policy = Path(tempfile.mkstemp(prefix="kfp-bench-audit-", suffix=".yaml")[1])
    policy.write_text(audit.POLICY)
    try:
        # No real node: its kubelet's requests would count in the audit log, and the pods are KWOK's.
        cluster = testcluster.TestCluster(
            "kfp-trainer-bench", unique=True, reuse=False, verbose=verbose, audit_policy=policy, real_node=False
        )
        cluster.start(build=True)
    finally:
        policy.unlink(missing_ok=True)
    return cluster


def cpu_seconds(pid: int | None) -> float:
    """User + system CPU seconds of process ``pid`` so far (0 when it is gone)."""
    return (procs.cpu_seconds(pid) or 0.0) if pid else 0.0


class Identities:
    """Service accounts (one per launcher), their tokens and kubeconfigs."""

    def __init__(self, cluster: testcluster.TestCluster, workdir: Path) -> None:
        from kubernetes import client

        self.cluster = cluster
        self.api = cluster.api_client()
        self.core = client.CoreV1Api(self.api)
        self.rbac = client.RbacAuthorizationV1Api(self.api)
        self.dir = workdir / "identities"
        self.dir.mkdir(parents=True, exist_ok=True)
        admin = yaml.safe_load(Path(cluster.kubeconfig).read_text())
        self.cluster_entry = admin["clusters"][0]["cluster"]
        self._setup()

    def _setup(self) -> None:
        from kubernetes import client
        from kubernetes.client.exceptions import ApiException

        try:
            self.core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=NS)))
        except ApiException as e:
            if e.status != 409:
                raise
        binding = {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "kfp-bench-launchers"},
            "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": "cluster-admin"},
            "subjects": [{"kind": "Group", "apiGroup": "rbac.authorization.k8s.io", "name": f"system:serviceaccounts:{NS}"}],
        }
        try:
            self.rbac.create_cluster_role_binding(binding)
        except ApiException as e:
            if e.status != 409:
                raise
        deadline = time.monotonic() + 60
        while True:  # the namespace's default service account comes from the controller manager
            try:
                self.core.read_namespaced_service_account("default", NS)
                return
            except ApiException:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.2)

    def make(self, name: str) -> Path:
        """A service account ``name`` and a kubeconfig that authenticates as it (context namespace: NS)."""
        from kubernetes import client

        self.core.create_namespaced_service_account(NS, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name=name)))
        request = client.AuthenticationV1TokenRequest(spec=client.V1TokenRequestSpec(audiences=[], expiration_seconds=4 * 3600))
        token = self.core.create_namespaced_service_account_token(name, NS, request).status.token
        config: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": "Config",
            "clusters": [{"name": "bench", "cluster": self.cluster_entry}],
            "users": [{"name": name, "user": {"token": token}}],
            "contexts": [{"name": name, "context": {"cluster": "bench", "user": name, "namespace": NS}}],
            "current-context": name,
        }
        path = self.dir / f"{name}.kubeconfig"
        path.write_text(yaml.safe_dump(config))
        return path

    def many(self, names: list[str]) -> dict[str, Path]:
        """:meth:`make` for each name."""
        return {n: self.make(n) for n in names}

    def close(self) -> None:
        """Release the admin client."""
        self.api.close()


def make_namespace(api: Any, name: str, timeout: float = 60) -> str:
    """Create namespace ``name`` and wait for its default service account (pods need it)."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    deadline = time.monotonic() + timeout
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            return name
        except ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.2)


def drop_namespace(api: Any, name: str, timeout: float = 180) -> bool:
    """Delete namespace ``name``; wait (bounded) until it is gone. False when it is still there."""
    from kubernetes import client
    from kubernetes.client.exceptions import ApiException

    core = client.CoreV1Api(api)
    core.delete_namespace(name, propagation_policy="Background")
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            core.read_namespace(name)
        except ApiException as e:
            if e.status == 404:
                return True
        time.sleep(1)
    return False


def peer_python() -> Path:
    """The peer SDK's virtualenv interpreter (created on first use)."""
    return peer_sdk.python(create=True)


def loadavg() -> tuple[float, float, float]:
    """The machine's 1, 5 and 15 minute load averages."""
    one, five, fifteen = os.getloadavg()
    return round(one, 2), round(five, 2), round(fifteen, 2)
