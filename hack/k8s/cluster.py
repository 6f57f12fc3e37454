#!/usr/bin/env python3
"""A real Kubernetes control plane for the integration tests.

etcd, kube-apiserver, kube-controller-manager and kube-scheduler (built from
the upstream Go modules by ``hack/k8s/build.sh``) run as local processes under
``kwokctl --runtime binary``; a kwok controller plays the kubelet of a few fake
nodes.  Everything listens on 127.0.0.1 only.  The Kubeflow Trainer CRDs and
ClusterTrainingRuntimes are installed so TrainJobs are validated by the real
schema and CEL rules.

Command line::

    python hack/k8s/cluster.py up       # build if needed, start (or reuse), print the kubeconfig path
    python hack/k8s/cluster.py status   # print state and kubeconfig path; exit 1 if not running
    python hack/k8s/cluster.py down     # delete the cluster, verify no process is left
    python hack/k8s/cluster.py build    # only build the binaries

Environment:
    KFP_TRAINER_CACHE            cache root (default ~/.cache/kfp-trainer): binaries, cluster state
    KFP_TRAINER_CRDS_DIR         Trainer manifests (default: ../shared/kubeflow-trainer-v2.3.0 next to the repo)
    KFP_TRAINER_REUSE_CLUSTER=1  start() reuses a running cluster of the same name instead of recreating it
    KFP_TRAINER_CLUSTER_NAME     cluster name (default kfp-trainer-test)
"""

from __future__ import annotations

import contextlib
import copy
import hashlib
import json
import os
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import yaml

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
BUILD_SH = HERE / "build.sh"

DEFAULT_CLUSTER_NAME = "kfp-trainer-test"
TRAINER_GROUP = "trainer.kubeflow.org"
TRAINJOB_CRD = "trainjobs.trainer.kubeflow.org"
MANIFEST_HASH = "kfp-trainer.test/manifest-sha256"

# Pods whose annotations match this selector are ignored by the kwok controller:
# the trainer simulator (tests/integration/simulator.py) drives their status.
SIM_ANNOTATION = "sim.kfp-trainer.test/driven"

# Fake nodes: (name, capacity, extra labels)
DEFAULT_NODES: list[tuple[str, dict[str, str], dict[str, str]]] = [
    (
        "kwok-gpu-0",
        {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "1Ti"},
        {"nvidia.com/gpu.present": "true"},
    ),
    (
        "kwok-gpu-1",
        {"cpu": "64", "memory": "512Gi", "pods": "110", "nvidia.com/gpu": "8", "ephemeral-storage": "1Ti"},
        {"nvidia.com/gpu.present": "true"},
    ),
    (
        "kwok-cpu-0",
        {"cpu": "32", "memory": "128Gi", "pods": "110", "ephemeral-storage": "1Ti"},
        {},
    ),
]


class ClusterError(RuntimeError):
    pass


class BinariesUnavailable(ClusterError):
    """The control plane binaries are missing and could not be built."""


def cache_root() -> Path:
    return Path(os.environ.get("KFP_TRAINER_CACHE") or Path.home() / ".cache" / "kfp-trainer")


def crds_dir() -> Path:
    env = os.environ.get("KFP_TRAINER_CRDS_DIR")
    if env:
        return Path(env).resolve()
    return (REPO / ".." / "shared" / "kubeflow-trainer-v2.3.0").resolve()


def bin_dir(build: bool = False, log=None) -> Path:
    """The directory holding the binaries; builds them first when ``build`` is true.

    ``log``: a text stream that gets build.sh's progress.  Raises
    BinariesUnavailable when the binaries are missing (and the build failed)."""
    args = ["bash", str(BUILD_SH)] + ([] if build else ["--print"])
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines: list[str] = []

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            if log is not None and hasattr(log, "write"):
                log.write(line)
                log.flush()

    import threading

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    out = proc.stdout.read() if proc.stdout else ""
    rc = proc.wait()
    t.join(5)
    lines = out.strip().splitlines()
    if rc != 0 or not lines:
        where = lines[-1] if lines else "(unknown)"
        tail = "".join(err_lines[-15:]).strip()
        raise BinariesUnavailable(
            f"control plane binaries not available in {where} (hack/k8s/build.sh exited {rc})" + (f":\n{tail}" if tail else "")
        )
    return Path(lines[-1])


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


_YamlLoader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def _load_yaml_docs(path: Path) -> list[dict]:
    with open(path) as f:
        return [d for d in yaml.load_all(f, Loader=_YamlLoader) if d]


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # A zombie is not alive for our purposes.
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ", 1)[1][0] != "Z"
    except OSError:
        return False


def processes_under(path: Path) -> list[tuple[int, str]]:
    """Processes whose command line mentions ``path`` (the cluster's workdir)."""
    needle = str(path)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        pid = int(entry)
        if pid == os.getpid():
            continue
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if needle in cmd and _pid_alive(pid):
            found.append((pid, cmd))
    return found


class TestCluster:
    """One kwokctl cluster (binary runtime) with the Trainer CRDs installed."""

    __test__ = False  # not a pytest test class

    def __init__(
        self,
        name: str | None = None,
        *,
        root: Path | None = None,
        trainer_dir: Path | None = None,
        nodes: list[tuple[str, dict[str, str], dict[str, str]]] | None = None,
        reuse: bool | None = None,
        unique: bool = False,
        verbose: bool = False,
    ) -> None:
        """``unique``: name the cluster ``<name>-<pid>`` so concurrent test sessions never share
        (or delete) each other's cluster; clusters left by dead sessions are removed on start."""
        self.base_name = name or os.environ.get("KFP_TRAINER_CLUSTER_NAME", DEFAULT_CLUSTER_NAME)
        self.name = f"{self.base_name}-{os.getpid()}" if unique else self.base_name
        self.unique = unique
        self._lock_fd: int | None = None
        self.root = Path(root) if root else cache_root() / "clusters"
        self.kwok_workdir = self.root / "kwok"
        self.cluster_dir = self.kwok_workdir / "clusters" / self.name
        self.kubeconfig = str(self.root / f"{self.name}.kubeconfig")
        self.logs_dir = self.root / f"{self.name}-podlogs"
        self.trainer_dir = Path(trainer_dir) if trainer_dir else crds_dir()
        self.nodes = DEFAULT_NODES if nodes is None else nodes
        if reuse is None:
            reuse = os.environ.get("KFP_TRAINER_REUSE_CLUSTER", "") in ("1", "true", "yes")
        self.reuse = reuse
        self.verbose = verbose
        self.timings: dict[str, float] = {}
        self._api_client = None
        self._bin: Path | None = None
        self.front_port = 0
        self.state_file = self.root / f"{self.name}.state.json"

    # ------------------------------------------------------------------ helpers
    def _log(self, msg: str) -> None:
        if self.verbose:
            print(f"[cluster] {msg}", file=sys.stderr, flush=True)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KWOK_WORKDIR"] = str(self.kwok_workdir)
        # Keep kwokctl away from any proxy and from the user's kubeconfig.
        for k in ("HTTP_PROXY", "HTTPS_PROXY", "http_proxy", "https_proxy", "ALL_PROXY", "all_proxy"):
            env.pop(k, None)
        env["NO_PROXY"] = env["no_proxy"] = "127.0.0.1,localhost"
        env["KUBECONFIG"] = self.kubeconfig
        return env

    def _kwokctl(self, *args: str, check: bool = True, timeout: float = 300) -> subprocess.CompletedProcess:
        assert self._bin is not None
        cmd = [str(self._bin / "kwokctl"), "--name", self.name, *args]
        self._log("$ " + " ".join(cmd))
        proc = subprocess.run(cmd, env=self._env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            raise ClusterError(f"{' '.join(cmd)} failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
        return proc

    def kwokctl_config(self) -> list[dict]:
        """The kwokctl/kwok configuration documents for this cluster."""
        b = self._bin
        assert b is not None
        self.front_port = _free_port()
        self._kwok_port = _free_port()
        options = {
            "runtime": "binary",
            "bindAddress": "127.0.0.1",
            "securePort": True,
            "kubeAuthorization": True,  # --authorization-mode=Node,RBAC
            "kubeAdmission": True,
            "quietPull": True,
            "enableCRDs": ["Logs", "ClusterLogs"],
            # Every port explicit: kwokctl's own port probe would also bind the wildcard address.
            "kubeApiserverPort": _free_port(),
            "etcdPort": _free_port(),
            "etcdPeerPort": _free_port(),
            "kubeControllerManagerPort": _free_port(),
            "kubeSchedulerPort": _free_port(),
            "kwokControllerPort": self._kwok_port,
            "kubeApiserverBinary": str(b / "kube-apiserver"),
            "kubeControllerManagerBinary": str(b / "kube-controller-manager"),
            "kubeSchedulerBinary": str(b / "kube-scheduler"),
            "kwokControllerBinary": str(b / "kwok"),
            "etcdBinary": str(b / "etcd"),
            "etcdctlBinary": str(b / "etcdctl"),
            "kubectlBinary": "/usr/bin/kubectl",
            "kubeVersion": "v1.36.3",
            "nodeLeaseDurationSeconds": 40,
        }
        kwokctl = {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokctlConfiguration",
            "options": options,
            "componentsPatches": [
                {
                    "name": "kube-apiserver",
                    "extraArgs": [
                        # Otherwise the API server advertises the host's default interface address.
                        {"key": "advertise-address", "value": "127.0.0.1"},
                        # Reach "kubelets" (the kubelet front) by the node's InternalIP only,
                        # never by resolving the node's host name.
                        {"key": "kubelet-preferred-address-types", "value": "InternalIP"},
                    ],
                },
                {
                    "name": "kube-controller-manager",
                    "extraArgs": [
                        # One instance only; lets start() restart it at once (see _restart_controller_manager).
                        {"key": "leader-elect", "value": "false"},
                    ],
                },
                {
                    "name": "kwok-controller",
                    "extraArgs": [
                        # kwokctl passes an empty --node-ip in binary mode; the API server
                        # reaches the fake kubelet (pod logs) at the node's InternalIP.
                        {"key": "node-ip", "value": "127.0.0.1"},
                        # Nodes advertise the kubelet front (logfront.py) as their kubelet port.
                        {"key": "node-port", "value": str(self.front_port)},
                    ],
                },
            ],
        }
        kwok = {
            "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
            "kind": "KwokConfiguration",
            "options": {
                # The API server reaches the fake kubelet (logs) at this address.
                "nodeIP": "127.0.0.1",
                "cidr": "10.0.0.0/16",
                "disregardStatusWithAnnotationSelector": f"{SIM_ANNOTATION}=true",
                # A KwokConfiguration document replaces kwok's defaults: restate them.
                "enableDebuggingHandlers": True,
                "enableProfilingHandler": False,
                "podPlayStageParallelism": 4,
                "nodePlayStageParallelism": 4,
                "nodeLeaseParallelism": 4,
                "podsOnNodeSyncParallelism": 1,
                "enablePodsOnNodeSyncListPager": True,
                "enablePodsOnNodeSyncStreamWatch": False,
            },
        }
        return [kwokctl, kwok]

    # ------------------------------------------------------------------ API access
    def api_client(self):
        """A new kubernetes.client.ApiClient for the admin kubeconfig."""
        from kubernetes import config

        return config.new_client_from_config(config_file=self.kubeconfig)

    @property
    def _client(self):
        if self._api_client is None:
            self._api_client = self.api_client()
        return self._api_client

    @property
    def server(self) -> str:
        with open(self.kubeconfig) as f:
            kc = yaml.safe_load(f)
        for c in kc.get("clusters", []):
            if c.get("name") in (f"kwok-{self.name}", self.name) or len(kc["clusters"]) == 1:
                return c["cluster"]["server"]
        return kc["clusters"][0]["cluster"]["server"]

    @property
    def kwok_port(self) -> int:
        """Port of the kwok controller's server (the fake kubelet) on 127.0.0.1."""
        return int(json.loads(self.state_file.read_text())["kwok_port"])

    def is_running(self) -> bool:
        if not Path(self.kubeconfig).exists() or not self.cluster_dir.exists():
            return False
        try:
            from kubernetes import client

            api = client.ApiClient(self._client.configuration)
            resp = api.call_api(
                "/readyz",
                "GET",
                auth_settings=["BearerToken"],
                _preload_content=False,
                _return_http_data_only=True,
                _request_timeout=3,
            )
            return resp.status == 200
        except Exception:
            self._api_client = None
            return False

    # ------------------------------------------------------------------ lifecycle
    def start(self, build: bool = True) -> TestCluster:
        t0 = self._started_at = time.monotonic()
        self._bin = bin_dir(build=build, log=sys.stderr if self.verbose else None)
        self.timings["binaries_s"] = time.monotonic() - t0
        if self.reuse and self.is_running():
            self._log(f"reusing running cluster {self.name}")
            self.timings["reused"] = 1
            self._start_front()
            self._install_trainer()
            self.start_gc_probe()
            return self
        self.root.mkdir(parents=True, exist_ok=True)
        if self.unique:
            self.remove_stale_clusters()
        if not self._lock():
            raise ClusterError(
                f"cluster {self.name} is in use by another process (lock {self._lock_path}); "
                "use KFP_TRAINER_REUSE_CLUSTER=1 to share it or another KFP_TRAINER_CLUSTER_NAME"
            )
        # A half-dead or stale cluster of the same name: remove it first.
        if self.cluster_dir.exists():
            self._log(f"removing stale cluster {self.name}")
            self.stop(keep_lock=True)
        self.logs_dir.mkdir(parents=True, exist_ok=True)
        t1 = time.monotonic()
        with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False, dir=self.root) as f:
            yaml.safe_dump_all(self.kwokctl_config(), f)
            config_path = f.name
        try:
            self._kwokctl(
                "create",
                "cluster",
                "--config",
                config_path,
                "--runtime",
                "binary",
                "--kubeconfig",
                self.kubeconfig,
                "--wait",
                "120s",
                "--timeout",
                "300s",
            )
        except Exception:
            with contextlib.suppress(Exception):
                self.stop()
            raise
        finally:
            os.unlink(config_path)
        self.timings["kwokctl_create_s"] = time.monotonic() - t1
        self._api_client = None
        self.state_file.write_text(json.dumps({"front_port": self.front_port, "kwok_port": self._kwok_port}))
        t2 = time.monotonic()
        try:
            self._start_front()
            self._wait_ready()
            self.create_nodes()
            self._install_trainer()
            t3 = time.monotonic()
            self._restart_controller_manager()
            self.timings["kcm_restart_s"] = time.monotonic() - t3
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop()
            raise
        self.timings["setup_s"] = time.monotonic() - t2
        self.timings["start_total_s"] = time.monotonic() - t0
        self.start_gc_probe()
        return self

    @property
    def _lock_path(self) -> Path:
        return self.root / f"{self.name}.lock"

    def _lock(self) -> bool:
        """Hold an exclusive lock on this cluster name for as long as this object runs it."""
        import fcntl

        if self._lock_fd is not None:
            return True
        fd = os.open(self._lock_path, os.O_RDWR | os.O_CREAT, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except OSError:
            os.close(fd)
            return False
        self._lock_fd = fd
        return True

    def _unlock(self) -> None:
        if self._lock_fd is not None:
            os.close(self._lock_fd)
            self._lock_fd = None
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self._lock_path)

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
            other.name = n
            other.cluster_dir = self.kwok_workdir / "clusters" / n
            other.kubeconfig = str(self.root / f"{n}.kubeconfig")
            other.logs_dir = self.root / f"{n}-podlogs"
            other.state_file = self.root / f"{n}.state.json"
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
                self._bin = bin_dir(build=False)
        if self._api_client is not None:
            with contextlib.suppress(Exception):
                self._api_client.close()
            self._api_client = None
        pids = self._recorded_pids()
        if self._bin is not None and (self._bin / "kwokctl").exists():
            with contextlib.suppress(Exception):
                self._kwokctl("delete", "cluster", "--kubeconfig", self.kubeconfig, check=False, timeout=120)
        # Anything still alive that belongs to this cluster goes now.
        deadline = time.monotonic() + 10
        # Only processes this cluster started: recorded pids, and our binaries / the front
        # running with this cluster's workdir on their command line.
        ours = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller", "kwok", "logfront.py")
        strays = [p for p, cmd in processes_under(self.cluster_dir) if any(Path(a).name in ours for a in cmd.split()[:2])]
        left = [p for p in pids if _pid_alive(p)] + strays
        for sig in (signal.SIGTERM, signal.SIGKILL):
            for p in set(left):
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, sig)
            while time.monotonic() < deadline and any(_pid_alive(p) for p in left):
                time.sleep(0.1)
            left = [p for p in left if _pid_alive(p)]
            if not left:
                break
            deadline = time.monotonic() + 5
        if left:
            raise ClusterError(f"processes left behind: {left}")
        kcm = getattr(self, "_kcm", None)
        if kcm is not None:
            with contextlib.suppress(Exception):
                kcm.wait(5)
        if not keep_lock:
            if self._lock_fd is None and self.root.is_dir():
                self._lock()  # best effort: removes a lock file left by `cluster.py up`
            self._unlock()
        for f in (self.kubeconfig, self._front_pid_file, self.state_file):
            with contextlib.suppress(FileNotFoundError):
                os.unlink(f)
        import shutil

        for d in (self.cluster_dir, self.logs_dir):
            if d.exists():
                shutil.rmtree(d, ignore_errors=True)

    @property
    def _front_pid_file(self) -> Path:
        return self.root / f"{self.name}.logfront.pid"

    def _start_front(self) -> None:
        """Start the kubelet front (hack/k8s/logfront.py) unless it is running."""
        with contextlib.suppress(ValueError, OSError):
            if _pid_alive(int(self._front_pid_file.read_text())):
                return
        state = json.loads(self.state_file.read_text())
        self.front_port, self._kwok_port = state["front_port"], state["kwok_port"]
        pki = self.cluster_dir / "pki"
        logf = open(self.cluster_dir / "logs" / "logfront.log", "ab")
        proc = subprocess.Popen(
            [
                sys.executable,
                str(HERE / "logfront.py"),
                "--listen-port",
                str(self.front_port),
                "--upstream-port",
                str(self._kwok_port),
                "--kubeconfig",
                str(self.cluster_dir / "kubeconfig.yaml"),
                "--cert",
                str(pki / "admin.crt"),
                "--key",
                str(pki / "admin.key"),
            ],
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=self._env(),
        )
        logf.close()
        self._front_pid_file.write_text(str(proc.pid))
        deadline = time.monotonic() + 20
        while True:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", self.front_port), timeout=0.5).close()
                return
            if proc.poll() is not None or time.monotonic() > deadline:
                raise ClusterError(f"kubelet front did not start (see {self.cluster_dir}/logs/logfront.log)")
            time.sleep(0.05)

    def _recorded_pids(self) -> list[int]:
        pids = []
        with contextlib.suppress(ValueError, OSError):
            pids.append(int(self._front_pid_file.read_text().strip()))
        piddir = self.cluster_dir / "pids"
        if piddir.is_dir():
            for p in piddir.glob("*.pid"):
                with contextlib.suppress(ValueError, OSError):
                    pids.append(int(p.read_text().strip()))
        return pids

    def leftover_processes(self) -> list[tuple[int, str]]:
        return processes_under(self.cluster_dir)

    def _wait_ready(self, timeout: float = 120) -> None:
        from kubernetes import client

        deadline = time.monotonic() + timeout
        last: Exception | None = None
        while time.monotonic() < deadline:
            try:
                core = client.CoreV1Api(self._client)
                # The default service account is created by the controller manager;
                # pods cannot be created in 'default' before it exists.
                core.read_namespaced_service_account("default", "default")
                return
            except Exception as e:  # noqa: BLE001
                last = e
                time.sleep(0.25)
        raise ClusterError(f"cluster not ready after {timeout}s: {last}")

    # ------------------------------------------------------------------ nodes
    def create_nodes(self) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        core = client.CoreV1Api(self._client)
        for name, capacity, labels in self.nodes:
            body = {
                "apiVersion": "v1",
                "kind": "Node",
                "metadata": {
                    "name": name,
                    "annotations": {"kwok.x-k8s.io/node": "fake", "node.alpha.kubernetes.io/ttl": "0"},
                    "labels": {
                        "type": "kwok",
                        "kubernetes.io/hostname": name,
                        "kubernetes.io/os": "linux",
                        "kubernetes.io/arch": "amd64",
                        "kubernetes.io/role": "agent",
                        **labels,
                    },
                },
                "spec": {},
                "status": {
                    "addresses": [
                        {"type": "InternalIP", "address": "127.0.0.1"},
                        {"type": "Hostname", "address": name},
                    ],
                    "capacity": capacity,
                    "allocatable": capacity,
                    "nodeInfo": {"architecture": "amd64", "operatingSystem": "linux", "kubeletVersion": "v1.36.3"},
                },
            }
            try:
                core.create_node(body)
            except ApiException as e:
                if e.status != 409:
                    raise
        # Wait until kwok reports them Ready (and the node lifecycle controller drops its taints).
        deadline = time.monotonic() + 60
        names = {n for n, _, _ in self.nodes}
        while True:
            ready = set()
            for n in core.list_node().items:
                conds = {c.type: c.status for c in (n.status.conditions or [])}
                taints = [t for t in (n.spec.taints or []) if t.key.startswith("node.kubernetes.io/")]
                if conds.get("Ready") == "True" and not taints:
                    ready.add(n.metadata.name)
            if names <= ready:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"nodes not ready: {sorted(names - ready)}")
            time.sleep(0.2)

    # ------------------------------------------------------------------ Trainer CRDs
    def _crd_paths(self) -> list[Path]:
        d = self.trainer_dir / "crds"
        paths = sorted(d.glob("*.yaml"))
        if not paths:
            raise ClusterError(f"no CRDs found in {d} (set KFP_TRAINER_CRDS_DIR)")
        return paths

    def _install_trainer(self) -> None:
        names = []
        for p in self._crd_paths():
            for doc in _load_yaml_docs(p):
                if doc.get("kind") == "CustomResourceDefinition":
                    self.apply_crd(doc, wait=False)
                    names.append(doc["metadata"]["name"])
        for n in names:
            self.wait_crd_established(n)
        self._install_runtimes()

    def _install_runtimes(self) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        co = client.CustomObjectsApi(self._client)
        rdir = self.trainer_dir / "runtimes"
        for p in sorted(rdir.glob("*.yaml")):
            for doc in _load_yaml_docs(p):
                if doc.get("kind") != "ClusterTrainingRuntime":
                    continue
                version = doc["apiVersion"].split("/", 1)[1]
                deadline = time.monotonic() + 30
                while True:
                    try:
                        co.create_cluster_custom_object(TRAINER_GROUP, version, "clustertrainingruntimes", doc)
                        break
                    except ApiException as e:
                        if e.status == 409:
                            break
                        # 404 right after the CRD is established: discovery lags a moment.
                        if e.status == 404 and time.monotonic() < deadline:
                            time.sleep(0.2)
                            continue
                        raise

    def apply_crd(self, doc: dict, wait: bool = True) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        ext = client.ApiextensionsV1Api(self._client)
        name = doc["metadata"]["name"]
        body = copy.deepcopy(doc)
        body.pop("status", None)
        body["metadata"].pop("resourceVersion", None)
        digest = hashlib.sha256(json.dumps(doc["spec"], sort_keys=True).encode()).hexdigest()
        body["metadata"].setdefault("annotations", {})[MANIFEST_HASH] = digest
        for _ in range(5):
            try:
                cur = ext.read_custom_resource_definition(name)
            except ApiException as e:
                if e.status != 404:
                    raise
                ext.create_custom_resource_definition(body)
                break
            if (cur.metadata.annotations or {}).get(MANIFEST_HASH) == digest:
                break  # already this manifest
            body["metadata"]["resourceVersion"] = cur.metadata.resource_version
            try:
                ext.replace_custom_resource_definition(name, body)
                break
            except ApiException as e:
                if e.status != 409:
                    raise
        if wait:
            self.wait_crd_established(name)

    def wait_crd_established(self, name: str, timeout: float = 60) -> None:
        from kubernetes import client

        ext = client.ApiextensionsV1Api(self._client)
        deadline = time.monotonic() + timeout
        while True:
            crd = ext.read_custom_resource_definition(name)
            conds = {c.type: c.status for c in (crd.status.conditions or [])} if crd.status else {}
            if conds.get("Established") == "True" and conds.get("NamesAccepted") == "True":
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"CRD {name} not Established: {conds}")
            time.sleep(0.1)

    def trainjob_crd_path(self) -> Path:
        return self.trainer_dir / "crds" / "trainer.kubeflow.org_trainjobs.yaml"

    @contextlib.contextmanager
    def use_trainjob_crd(self, path: str | os.PathLike) -> Iterator[dict]:
        """Swap the TrainJob CRD to the one in ``path`` for the duration of the block.

        Waits until the API server validates with the new schema; restores the
        cluster's default CRD afterwards.  Yields the CRD document."""
        new = next(d for d in _load_yaml_docs(Path(path)) if d.get("kind") == "CustomResourceDefinition")
        orig = next(d for d in _load_yaml_docs(self.trainjob_crd_path()) if d.get("kind") == "CustomResourceDefinition")
        self.apply_crd(new)
        self._wait_schema_served(new)
        try:
            yield new
        finally:
            self.apply_crd(orig)
            self._wait_schema_served(orig)

    def _wait_schema_served(self, crd: dict, timeout: float = 30) -> None:
        """Wait until the TrainJob schema the API server uses is the one of ``crd``.

        Probes with server-side dry-run creates under strict field validation: a
        spec field only this schema has must be accepted, and one it lacks (but
        another known version has) rejected."""
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        version = next(v for v in crd["spec"]["versions"] if v.get("storage"))
        props = set(version["schema"]["openAPIV3Schema"]["properties"]["spec"]["properties"])
        known = {"runtimePatches", "podTemplateOverrides", "podSpecOverrides", "labels", "annotations", "activeDeadlineSeconds"}
        present = sorted(props & known)
        absent = sorted(known - props)
        if not present and not absent:
            time.sleep(2)
            return
        co = client.CustomObjectsApi(self._client)

        def accepted(field: str) -> bool:
            spec: dict[str, Any] = {"runtimeRef": {"name": "torch-distributed"}}
            spec[field] = 1 if field == "activeDeadlineSeconds" else ({} if field in ("labels", "annotations") else [])
            body = {
                "apiVersion": f"{TRAINER_GROUP}/{version['name']}",
                "kind": "TrainJob",
                "metadata": {"name": "schema-probe"},
                "spec": spec,
            }
            try:
                co.api_client.call_api(
                    f"/apis/{TRAINER_GROUP}/{version['name']}/namespaces/default/trainjobs",
                    "POST",
                    query_params=[("dryRun", "All"), ("fieldValidation", "Strict")],
                    header_params={"Content-Type": "application/json", "Accept": "application/json"},
                    body=body,
                    _preload_content=False,
                )
                return True
            except ApiException as e:
                if e.status in (400, 422):
                    return False
                raise

        deadline = time.monotonic() + timeout
        while True:
            ok = all(accepted(f) for f in present[:1]) and not any(accepted(f) for f in absent[:1])
            if ok:
                return
            if time.monotonic() > deadline:
                raise ClusterError(f"API server did not switch to TrainJob schema ({present=} {absent=})")
            time.sleep(0.2)

    def _restart_controller_manager(self) -> None:
        """Restart kube-controller-manager with the same command line.

        Its garbage collector discovers resource kinds at start and then only every 30 s; a
        restart after the Trainer CRDs are installed makes it handle TrainJob owners at once."""
        pidfile = self.cluster_dir / "pids" / "kube-controller-manager.pid"
        pid = int(pidfile.read_text().strip())
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            argv = [a.decode() for a in f.read().split(b"\0") if a]
        cwd = os.readlink(f"/proc/{pid}/cwd")
        os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + 10
        while _pid_alive(pid):
            if time.monotonic() > deadline:
                os.kill(pid, signal.SIGKILL)
            time.sleep(0.05)
        with open(self.cluster_dir / "logs" / "kube-controller-manager.log", "ab") as log:
            self._kcm = subprocess.Popen(
                argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True
            )
        pidfile.write_text(str(self._kcm.pid))
        # Healthy again: its secure port answers.
        port = next((a.split("=", 1)[1] for a in argv if a.startswith("--secure-port=")), None)
        deadline = time.monotonic() + 30
        while port:
            with contextlib.suppress(OSError):
                socket.create_connection(("127.0.0.1", int(port)), timeout=0.5).close()
                break
            if self._kcm.poll() is not None or time.monotonic() > deadline:
                raise ClusterError("kube-controller-manager did not come back after its restart")
            time.sleep(0.05)

    # ------------------------------------------------------------------ garbage collector
    def start_gc_probe(self) -> None:
        """Find out in the background when the garbage collector handles TrainJob owners.

        The controller manager's garbage collector rediscovers API resources every 30 s, so
        for up to ~30 s after the TrainJob CRD is installed, deleting a TrainJob does not yet
        remove its children.  ``wait_gc_ready()`` waits for this probe."""
        import threading

        if getattr(self, "_gc_thread", None) is not None:
            return
        self._gc_ready = threading.Event()
        self._gc_error: BaseException | None = None

        def probe() -> None:
            try:
                self._gc_probe()
            except BaseException as e:  # noqa: BLE001
                self._gc_error = e
            finally:
                self._gc_ready.set()

        self._gc_thread = threading.Thread(target=probe, name="gc-probe", daemon=True)
        self._gc_thread.start()

    def wait_gc_ready(self, timeout: float = 60) -> None:
        self.start_gc_probe()
        if not self._gc_ready.wait(timeout):
            raise ClusterError(f"garbage collector not handling TrainJobs after {timeout}s")
        if self._gc_error is not None:
            raise ClusterError(f"garbage collector probe failed: {self._gc_error!r}")

    def _gc_probe(self, timeout: float = 90) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = self.api_client()
        try:
            core, co = client.CoreV1Api(api), client.CustomObjectsApi(api)
            ns = "kfp-trainer-gc-probe"
            with contextlib.suppress(ApiException):
                core.create_namespace({"metadata": {"name": ns}})
            name = f"gc-probe-{os.getpid()}-{int(time.time())}"
            # A runtime that does not exist: a trainer (or the simulator) only emits an event.
            tj = co.create_namespaced_custom_object(
                TRAINER_GROUP,
                "v1alpha1",
                ns,
                "trainjobs",
                {
                    "apiVersion": f"{TRAINER_GROUP}/v1alpha1",
                    "kind": "TrainJob",
                    "metadata": {"name": name},
                    "spec": {"runtimeRef": {"name": "kfp-trainer-gc-probe-none"}},
                },
            )
            owner = {"apiVersion": f"{TRAINER_GROUP}/v1alpha1", "kind": "TrainJob", "name": name, "uid": tj["metadata"]["uid"]}
            core.create_namespaced_config_map(ns, {"metadata": {"name": name, "ownerReferences": [owner]}})
            co.delete_namespaced_custom_object(TRAINER_GROUP, "v1alpha1", ns, "trainjobs", name)
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    core.read_namespaced_config_map(name, ns)
                except ApiException as e:
                    if e.status == 404:
                        self.timings["gc_ready_after_start_s"] = time.monotonic() - self._started_at
                        return
                    raise
                time.sleep(0.5)
            raise ClusterError("garbage collector did not delete the probe's child")
        finally:
            api.close()

    # ------------------------------------------------------------------ misc
    def component_logs(self) -> dict[str, Path]:
        d = self.cluster_dir / "logs"
        return {p.stem: p for p in d.glob("*.log")} if d.is_dir() else {}

    def describe(self) -> dict[str, Any]:
        return {
            "name": self.name,
            "kubeconfig": self.kubeconfig,
            "server": self.server if Path(self.kubeconfig).exists() else None,
            "workdir": str(self.cluster_dir),
            "bin_dir": str(self._bin) if self._bin else None,
            "trainer_dir": str(self.trainer_dir),
            "timings": {k: round(v, 2) for k, v in self.timings.items()},
        }

    def __enter__(self) -> TestCluster:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()


def main(argv: list[str]) -> int:
    import argparse

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "status", "build"])
    ap.add_argument("--name", default=None)
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    c = TestCluster(args.name, reuse=True, verbose=args.verbose or args.command == "up")
    if args.command == "build":
        print(bin_dir(build=True, log=sys.stderr))
        return 0
    if args.command == "up":
        c.start()
        print(json.dumps(c.describe(), indent=2), file=sys.stderr)
        print(c.kubeconfig)
        return 0
    if args.command == "down":
        c.stop()
        left = c.leftover_processes()
        if left:
            print(f"left behind: {left}", file=sys.stderr)
            return 1
        print(f"cluster {c.name} deleted", file=sys.stderr)
        return 0
    # status
    running = c.is_running()
    print(f"cluster {c.name}: {'running' if running else 'not running'}", file=sys.stderr)
    if running:
        print(f"server: {c.server}", file=sys.stderr)
        for p, cmd in c.leftover_processes():
            print(f"  {p} {cmd[:120]}", file=sys.stderr)
    print(c.kubeconfig)
    return 0 if running else 1


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
