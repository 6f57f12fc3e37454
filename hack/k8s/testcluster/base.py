"""A test cluster's names, paths, state, processes and API access (TestCluster's base)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from . import kwok, locks, objects
from .binaries import KUBE_VERSION, KUBE_VERSIONS, Binaries, ClusterError, cache_root
from .components import Controllers, KubeletFront, PodScripting, parse_gates
from .gc import GcProbe
from .procs import read_pid, restart_kwokctl_component, with_feature_gates
from .realnode import RealNode
from .versions import DEFAULT_TRAINER_VERSION, trainer_dirs

DEFAULT_CLUSTER_NAME = "kfp-trainer-test"
KWOKCTL_COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller")


def env_feature_gates() -> dict[str, bool]:
    """Feature gates of the controllers from ``KFP_TRAINER_FEATURE_GATES`` (``Name=true,...``)."""
    return parse_gates(os.environ.get("KFP_TRAINER_FEATURE_GATES", ""))


class ClusterBase:
    """What a TestCluster is made of, without starting or stopping it: its names and
    paths, ports and feature gates, its components (processes) and API access."""

    def __init__(
        self,
        name: str | None = None,
        *,
        root: Path | None = None,
        trainer_dir: Path | None = None,
        nodes: list[objects.Node] | None = None,
        reuse: bool | None = None,
        unique: bool = False,
        verbose: bool = False,
        feature_gates: Mapping[str, bool] | None = None,
        audit_policy: Path | None = None,
        real_node: bool | None = None,
        real_node_wait: float | None = None,
        kube_version: str = KUBE_VERSION,
        kube_feature_gates: str = "",
        trainer_version: str | None = None,
    ) -> None:
        """``unique``: name the cluster ``<name>-<pid>`` so concurrent test sessions never share
        (or delete) each other's cluster; clusters left by dead sessions are removed on start.
        ``feature_gates``: of the Trainer/JobSet controllers (default: ``KFP_TRAINER_FEATURE_GATES``).
        ``audit_policy``: an audit policy file (``audit.k8s.io/v1`` Policy); the API server then
        writes its audit log (JSON lines) to :attr:`audit_log`. Applies to a cluster this object
        creates, not to a reused one.
        ``real_node``: also run the machine's real node (kubelet, containerd, CoreDNS:
        :mod:`.realnode`); default ``KFP_TRAINER_REAL_NODE`` (``0`` turns it off), on.
        ``real_node_wait``: seconds to wait for the real node while another cluster has it
        (default ``KFP_TRAINER_REAL_NODE_WAIT`` or 600), then fail.
        ``kube_version``: of kube-apiserver, kube-controller-manager and kube-scheduler, one of
        ``binaries.KUBE_VERSIONS``; an older one than the kubelet's (``KUBE_VERSION``) runs
        without the real node, as a kubelet must not be newer than its API server.
        ``kube_feature_gates``: ``Name=true,...`` for those three (e.g. ``WatchList=false``).
        ``trainer_version``: the Kubeflow Trainer release the cluster runs (its controllers,
        webhooks, CRDs and runtimes, with the JobSet release it was built with): ``v2.1.0``,
        ``v2.2.1`` or ``v2.3.0`` (default ``KFP_TRAINER_VERSION`` or v2.3.0). ``trainer_dir``
        (v2.3.0 only) overrides where its manifests are."""
        if kube_version not in KUBE_VERSIONS:
            raise ClusterError(f"kube_version {kube_version!r}: not one of the built versions {', '.join(KUBE_VERSIONS)}")
        if kube_version != KUBE_VERSION and real_node:
            raise ClusterError(
                f"kube_version {kube_version}: no real node (its kubelet {KUBE_VERSION} must not be newer than the API server)"
            )
        self.kube_version = kube_version
        self.kube_feature_gates = kube_feature_gates
        self.base_name = name or os.environ.get("KFP_TRAINER_CLUSTER_NAME", DEFAULT_CLUSTER_NAME)
        self.unique = unique
        self.root = Path(root) if root else cache_root() / "clusters"
        self._set_name(f"{self.base_name}-{os.getpid()}" if unique else self.base_name)
        self.trainer_version = trainer_version or os.environ.get("KFP_TRAINER_VERSION") or DEFAULT_TRAINER_VERSION
        self.trainer_dir, self.jobset_dir = trainer_dirs(self.trainer_version)
        if trainer_dir:
            self.trainer_dir = Path(trainer_dir)
        self.nodes = objects.DEFAULT_NODES if nodes is None else nodes
        if reuse is None:
            reuse = os.environ.get("KFP_TRAINER_REUSE_CLUSTER", "") in ("1", "true", "yes")
        self.reuse = reuse
        self.verbose = verbose
        self.feature_gates = dict(env_feature_gates() if feature_gates is None else feature_gates)
        self.audit_policy = Path(audit_policy) if audit_policy else None
        if real_node is None:
            real_node = kube_version == KUBE_VERSION and os.environ.get("KFP_TRAINER_REAL_NODE", "1") not in ("0", "false", "no")
        self.want_real_node = real_node
        self.real_node_wait = float(real_node_wait if real_node_wait is not None else os.environ.get("KFP_TRAINER_REAL_NODE_WAIT", 600))
        self.timings: dict[str, float] = {}
        self.ports = kwok.Ports()
        self._bin: Binaries | None = None
        self._api_client = None
        self._lock_fd: int | None = None
        self._gc: GcProbe | None = None
        self._real_node: RealNode | None = None

    def _set_name(self, name: str) -> None:
        self.name = name
        self.kwok_workdir = self.root / "kwok"
        self.cluster_dir = self.kwok_workdir / "clusters" / name
        self.kubeconfig = str(self.root / f"{name}.kubeconfig")
        self.logs_dir = self.root / f"{name}-podlogs"
        self.state_file = self.root / f"{name}.state.json"
        self.audit_log = self.cluster_dir / "logs" / "audit.log"

    # ------------------------------------------------------------------ helpers
    def _log(self, msg: str) -> None:
        if self.verbose:
            print(f"[cluster] {msg}", file=sys.stderr, flush=True)

    def _env(self) -> dict[str, str]:
        env = dict(os.environ)
        env["KWOK_WORKDIR"] = str(self.kwok_workdir)
        # Keep kwokctl and the components away from any proxy and from the user's kubeconfig.
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

    def _timed(self, key: str, t0: float) -> float:
        now = time.monotonic()
        self.timings[key] = now - t0
        return now

    # ------------------------------------------------------------------ components
    @property
    def front(self) -> KubeletFront:
        return KubeletFront(self.cluster_dir, self.root, self.name, self.ports.front, self.ports.kwok)

    @property
    def podscript(self) -> PodScripting:
        return PodScripting(self.cluster_dir, self.root, self.name, self.logs_dir, self.ports.kwok)

    @property
    def controllers(self) -> Controllers:
        assert self._bin is not None
        p = self.ports
        return Controllers(
            self.cluster_dir,
            self.root,
            self.name,
            self._bin.controllers_for(self.trainer_version),
            p.webhooks,
            p.controllers_health,
            p.status_server,
            self.feature_gates,
        )

    @property
    def real_node(self) -> RealNode:
        """The machine's real node (:class:`.realnode.RealNode`), as this cluster's."""
        assert self._bin is not None
        if self._real_node is None or self._real_node.cluster_name != self.name:
            self._real_node = RealNode(self.name, self.cluster_dir, self._bin, log=self._log)
        return self._real_node

    def restart_controllers(self, feature_gates: Mapping[str, bool] | None = None) -> None:
        """Stop the Trainer/JobSet controllers and start them again (with other feature gates)."""
        if feature_gates is not None:
            self.feature_gates = dict(feature_gates)
            self._save_state()
        self.controllers.stop()
        t0 = time.monotonic()
        self.controllers.start(self._env())
        self._timed("controllers_restart_s", t0)

    def pid(self, component: str) -> int | None:
        """The pid of a component: one of kwokctl's (``etcd``, ``kube-apiserver``,
        ``kube-controller-manager``, ``kube-scheduler``, ``kwok-controller``) or ours
        (``controllers``, ``podscript``, ``logfront``)."""
        if component in KWOKCTL_COMPONENTS:
            return read_pid(self.cluster_dir / "pids" / f"{component}.pid")
        return read_pid(self.root / f"{self.name}.{component}.pid")

    def restart_api_server(self, feature_gates: str) -> None:
        """Restart kube-apiserver with ``--feature-gates=<feature_gates>`` instead of its own."""
        restart_kwokctl_component(self.cluster_dir, "kube-apiserver", args=lambda argv: with_feature_gates(argv, feature_gates))
        self._api_client = None

    def restart(self, component: str, kill: signal.Signals = signal.SIGTERM) -> None:
        """Stop a component (see :meth:`pid`) with ``kill`` and start it again as it was
        (kwokctl's with the same command line; ours with the cluster's settings)."""
        if component in KWOKCTL_COMPONENTS:
            restart_kwokctl_component(self.cluster_dir, component, kill)
            self._api_client = None
            return
        ours = {"controllers": self.controllers, "podscript": self.podscript, "logfront": self.front}[component]
        pid = ours.pid
        if pid is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, kill)
        ours.stop()
        ours.start(self._env())

    @property
    def status_server(self) -> dict[str, Any]:
        """How a test reaches the Trainer status server (TrainJobStatus gate on): the URL in a
        pod's ``KUBEFLOW_TRAINER_SERVER_URL`` names the host ``server_hostname`` at ``port``;
        connect to ``host`` instead, verify with ``ca_file`` and ``server_hostname``."""
        return {
            "enabled": bool(self.feature_gates.get("TrainJobStatus")),
            "host": "127.0.0.1",
            "port": self.ports.status_server,
            "server_hostname": "kubeflow-trainer-controller-manager.kubeflow-system.svc",
            "ca_file": str(self.cluster_dir / Controllers.CERT_DIR / "ca.crt"),
        }

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
        kc = yaml.safe_load(Path(self.kubeconfig).read_text())
        return kc["clusters"][0]["cluster"]["server"]

    @property
    def kwok_port(self) -> int:
        """Port of the kwok controller's server (the fake kubelet) on 127.0.0.1."""
        return self.ports.kwok

    def is_running(self) -> bool:
        if not Path(self.kubeconfig).exists() or not self.cluster_dir.exists():
            return False
        try:
            from kubernetes import client

            resp = client.ApiClient(self._client.configuration).call_api(
                "/readyz", "GET", auth_settings=["BearerToken"], _preload_content=False, _return_http_data_only=True, _request_timeout=3
            )
            return resp.status == 200
        except Exception:  # noqa: BLE001 - anything but a ready answer
            self._api_client = None
            return False

    def _save_state(self) -> None:
        state = {
            "ports": vars(self.ports), "feature_gates": self.feature_gates, "kube_version": self.kube_version,
            "trainer_version": self.trainer_version,
        }  # fmt: skip
        self.state_file.write_text(json.dumps(state))

    def _load_state(self) -> None:
        state = json.loads(self.state_file.read_text())
        running = state.get("trainer_version", DEFAULT_TRAINER_VERSION)
        if running != self.trainer_version:
            raise ClusterError(f"cluster {self.name} runs Trainer {running}, not {self.trainer_version}: stop it or use another name")
        self.ports = kwok.Ports(**state["ports"])
        self.kube_version = state.get("kube_version") or KUBE_VERSION
        if not self.feature_gates:
            self.feature_gates = state.get("feature_gates") or {}

    # ------------------------------------------------------------------ lifecycle

    @property
    def _lock_path(self) -> Path:
        return self.root / f"{self.name}.lock"

    def _lock(self) -> bool:
        """Hold an exclusive lock on this cluster name for as long as this object runs it."""
        if self._lock_fd is None:
            self._lock_fd = locks.acquire(self._lock_path)
        return self._lock_fd is not None

    def _unlock(self) -> None:
        locks.release(self._lock_path, self._lock_fd)
        self._lock_fd = None
