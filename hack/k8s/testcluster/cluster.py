"""TestCluster: one test control plane, started, reused and stopped as a whole."""

from __future__ import annotations

import contextlib
import os
import shutil
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

from . import crds, kueue, kwok, objects, realnode
from .base import DEFAULT_CLUSTER_NAME, ClusterBase, env_feature_gates
from .binaries import BinariesUnavailable, ClusterError, binaries
from .gc import GcProbe, restart_controller_manager
from .procs import pid_alive, processes_under, terminate

__all__ = ["DEFAULT_CLUSTER_NAME", "TestCluster", "env_feature_gates"]
# Processes a cluster may leave: kwokctl's components and ours (matched by program name).
OUR_PROGRAMS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller", "kwok")
OUR_SCRIPTS = ("logfront.py", "podscript.py", "controllers", "kueue")


class TestCluster(ClusterBase):
    """etcd, kube-apiserver, kube-controller-manager, kube-scheduler and kwok (under
    ``kwokctl --runtime binary``), the real Trainer and JobSet controllers, the kubelet
    front and the pod scripting process; the Trainer and JobSet CRDs and the Trainer's
    ClusterTrainingRuntimes installed. See :class:`ClusterBase` for its parts."""

    __test__ = False  # not a pytest test class

    def start(self, build: bool = True) -> TestCluster:
        t0 = self._started_at = time.monotonic()
        self._bin = binaries(build=build, log=sys.stderr if self.verbose else None)
        t = self._timed("binaries_s", t0)
        if self.reuse and self.is_running() and self.state_file.exists():
            self._log(f"reusing running cluster {self.name}")
            self.timings["reused"] = 1
            self._load_state()
            self._start_components()
            if self.want_real_node and not self.real_node.running():
                self._start_real_node()
            self._gc = GcProbe(self.api_client, self._started_at)
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        if self.unique:
            self.remove_stale_clusters()
        if not self._lock():
            raise ClusterError(
                f"cluster {self.name} is in use by another process (lock {self._lock_path}); "
                "use KFP_TRAINER_REUSE_CLUSTER=1 to share it or another KFP_TRAINER_CLUSTER_NAME"
            )
        if self.cluster_dir.exists():
            self._log(f"removing stale cluster {self.name}")
            self.stop(keep_lock=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        self.ports = kwok.Ports.pick()
        try:
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, dir=self.root) as f:
                yaml.safe_dump_all(
                    kwok.config(
                        self._bin,
                        self.ports,
                        self.cluster_dir,
                        audit_policy=self.audit_policy,
                        kube_version=self.kube_version,
                        kube_feature_gates=self.kube_feature_gates,
                    ),
                    f,
                )
            try:
                self._kwokctl(
                    "create",
                    "cluster",
                    "--config",
                    f.name,
                    "--runtime",
                    "binary",
                    "--kubeconfig",
                    self.kubeconfig,
                    "--wait",
                    "120s",
                    "--timeout",
                    "300s",
                )
            finally:
                os.unlink(f.name)
            t = self._timed("kwokctl_create_s", t)
            self._api_client = None
            self._save_state()
            self.front.start(self._env())
            self._wait_ready()
            objects.create_nodes(self._client, self.nodes)
            objects.create_storage_class(self._client)
            self._install_crds()
            restart_controller_manager(self.cluster_dir)
            t = self._timed("nodes_crds_kcm_s", t)
            self._start_components()
            if self.want_real_node:
                self._start_real_node()
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise
        self._timed("start_total_s", t0)
        self._gc = GcProbe(self.api_client, self._started_at)
        return self

    def _start_real_node(self) -> None:
        t = time.monotonic()
        node = self.real_node
        node.start(self.server, wait=self.real_node_wait)
        self.timings.update({f"real_node_{k}": v for k, v in node.timings.items()})
        self._timed("real_node_s", t)

    def _install_crds(self) -> None:
        paths = sorted((self.trainer_dir / "crds").glob("*.yaml")) + sorted(self.jobset_dir.glob("*.yaml"))
        crds.install_crds(self._client, paths)

    def _start_components(self) -> None:
        """Start whatever of ours is not running (kubelet front, controllers, pod scripting)
        and install the runtimes (validated by the Trainer's webhook)."""
        env = self._env()
        t = time.monotonic()
        self.front.start(env)
        self.controllers.start(env)
        t = self._timed("controllers_start_s", t)
        crds.install_runtimes(self._client, self.trainer_dir / "runtimes")
        self.podscript.start(env)
        self._timed("runtimes_podscript_s", t)

    def start_kueue(self) -> kueue.KueueManager:
        """Kueue in this cluster (once; a no-op while it runs): its CRDs, its manager (its
        TrainJob integration on) and its webhooks. Stopped with the cluster."""
        if self._bin is None or self._bin.kueue is None:
            raise ClusterError("Kueue's manager is not built (hack/k8s/build.sh)")
        t = time.monotonic()
        manager = kueue.KueueManager(self.cluster_dir, self.root, self.name, self._bin.kueue, self.controllers.cert_dir)
        kueue.install(self._client, self._bin.kueue)
        manager.start(self._env())
        kueue.register_webhooks(self._client, self._bin.kueue, manager.webhook_port, self.controllers.ca_file)
        kueue.wait_webhooks(self._client)
        self._timed("kueue_start_s", t)
        return manager

    def _wait_ready(self, timeout: float = 120) -> None:
        from kubernetes import client

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                # The default service account comes from the controller manager; pods
                # cannot be created in 'default' before it exists.
                client.CoreV1Api(self._client).read_namespaced_service_account("default", "default")
                return
            except Exception as e:  # noqa: BLE001
                last = e
                time.sleep(0.25)
        raise ClusterError(f"cluster not ready after {timeout}s: {last}")

    def remove_stale_clusters(self) -> list[str]:
        """Delete ``<base>-<pid>`` clusters whose session is gone (their lock is free)."""
        removed = []
        clusters = self.kwok_workdir / "clusters"
        candidates = {p.name for p in clusters.iterdir()} if clusters.is_dir() else set()
        candidates |= {p.name[: -len(".lock")] for p in self.root.glob(f"{self.base_name}-*.lock")}
        for n in sorted(candidates):
            rest = n[len(self.base_name) + 1 :]
            if not n.startswith(self.base_name + "-") or not rest.isdigit() or n == self.name:
                continue
            other = TestCluster(self.base_name, root=self.root, reuse=False, verbose=self.verbose)
            other._set_name(n)
            if not other._lock():
                continue  # its session is alive
            self._log(f"removing stale cluster {n}")
            try:
                other._bin = self._bin
                other.stop()
                removed.append(n)
            finally:
                other._unlock()
        return removed

    def stop(self, keep_lock: bool = False) -> None:
        """Delete the cluster; make sure no process of it is left."""
        if self._bin is None:
            with contextlib.suppress(BinariesUnavailable):
                self._bin = binaries(build=False)
        if self._api_client is not None:
            with contextlib.suppress(Exception):
                self._api_client.close()
            self._api_client = None
        # The real node first, if this cluster owns it (it checks that it left nothing behind).
        real_node_error: ClusterError | None = None
        if self._bin is not None and (realnode.owner_of() or {}).get("cluster") == self.name:
            try:
                self.real_node.stop(forget_pods=False)
            except ClusterError as e:
                real_node_error = e
        # Our components first (they would only retry against a stopping API server).
        components = [int(p.read_text()) for p in self.root.glob(f"{self.name}.*.pid") if p.read_text().strip().isdigit()]
        left = terminate(components)
        kwokctl_pids = self._kwokctl_pids()
        if self._bin is not None and (self._bin / "kwokctl").exists():
            with contextlib.suppress(Exception):
                self._kwokctl("delete", "cluster", "--kubeconfig", self.kubeconfig, check=False, timeout=120)
        strays = [
            p for p, cmd in processes_under(self.cluster_dir) if any(Path(a).name in OUR_PROGRAMS + OUR_SCRIPTS for a in cmd.split()[:2])
        ]
        left += terminate([p for p in kwokctl_pids if pid_alive(p)] + strays)
        if left:
            raise ClusterError(f"processes left behind: {left}")
        if real_node_error is not None:
            raise real_node_error
        if not keep_lock:
            if self._lock_fd is None and self.root.is_dir():
                self._lock()  # best effort: removes a lock file left by `cluster.py up`
            self._unlock()
        for f in [self.kubeconfig, self.state_file, *self.root.glob(f"{self.name}.*.pid")]:
            Path(f).unlink(missing_ok=True)
        for d in (self.cluster_dir, self.logs_dir):
            shutil.rmtree(d, ignore_errors=True)

    def _kwokctl_pids(self) -> list[int]:
        piddir = self.cluster_dir / "pids"
        out = []
        for p in piddir.glob("*.pid") if piddir.is_dir() else []:
            with contextlib.suppress(ValueError, OSError):
                out.append(int(p.read_text().strip()))
        return out

    def leftover_processes(self) -> list[tuple[int, str]]:
        return processes_under(self.cluster_dir)

    # ------------------------------------------------------------------ Trainer CRDs
    def trainjob_crd_path(self) -> Path:
        return self.trainer_dir / "crds" / "trainer.kubeflow.org_trainjobs.yaml"

    @contextlib.contextmanager
    def use_trainjob_crd(self, path: str | os.PathLike) -> Iterator[dict]:
        """Swap the TrainJob CRD to the one in ``path`` for the block (waits until the API
        server validates with it); the cluster's own CRD again afterwards, and the
        controllers restarted. Yields the CRD."""
        try:
            with crds.swapped_crd(self._client, Path(path), self.trainjob_crd_path()) as doc:
                yield doc
        finally:
            # The controllers' TrainJob watches may still decode with the swapped schema
            # (pruning fields it lacks, such as runtimePatches): give them fresh ones.
            self.restart("controllers")

    def wait_gc_ready(self, timeout: float = 60) -> None:
        """Wait until the garbage collector handles TrainJob owners (normally at once)."""
        if self._gc is None:
            self._gc = GcProbe(self.api_client, time.monotonic())
        self._gc.wait(timeout)
        if self._gc.seconds_after_start is not None:
            self.timings["gc_ready_after_start_s"] = self._gc.seconds_after_start

    # ------------------------------------------------------------------ misc
    def component_logs(self) -> dict[str, Path]:
        """Every component's log file (kwokctl's, the controllers', the front's, pod scripting's;
        the real node's kubelet, containerd and CoreDNS while this cluster owns it)."""
        d = self.cluster_dir / "logs"
        logs = {p.stem: p for p in d.glob("*.log")} if d.is_dir() else {}
        if (realnode.owner_of() or {}).get("cluster") == self.name:
            logs.update({p.stem: p for p in (realnode.base_dir() / "logs").glob("*.log")})
        return logs

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kubeconfig": self.kubeconfig,
            "server": self.server if Path(self.kubeconfig).exists() else None,
            "workdir": str(self.cluster_dir),
            "bin_dir": str(self._bin.bin_dir) if self._bin else None,
            "trainer_version": self.trainer_version,
            "controllers": str(self._bin.controllers_for(self.trainer_version)) if self._bin else None,
            "feature_gates": self.feature_gates,
            "kube_version": self.kube_version,
            "trainer_dir": str(self.trainer_dir),
            "timings": {k: round(v, 2) for k, v in self.timings.items()},
            "real_node": self.real_node.describe() if self._bin and self.real_node.running() else None,
        }

    def __enter__(self) -> TestCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
