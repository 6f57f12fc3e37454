"""The real node: a kubelet with containerd and CoreDNS beside the KWOK nodes, running real
containers. One per machine (host-wide cgroups, sysctls, the pods' bridge): a machine-wide
file lock, held by the process that starts it and by the node's daemons (they inherit it),
so it stays taken while the node runs, even after ``cluster.py up`` has exited.

Everything lives under ``$KFP_TRAINER_CACHE/realnode``: ``owner.json`` (the cluster that owns
the node and the host state recorded before it started), ``containerd/root`` (the image
store, kept between runs), the per-run state, sockets, kubelet directories and ``logs/``.
:meth:`RealNode.stop` ends every process, removes containers, mounts, cgroups, links,
iptables rules and directories, restores sysctls, and fails if anything differs from the
recorded state. A node left by a dead session is cleaned the same way when the next one
takes the lock.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

from . import hostguard, kubelet
from .binaries import Binaries, ClusterError, cache_root
from .containerd import BRIDGE, GATEWAY, Containerd, ensure_bridge, forget_cni_results
from .dns import CoreDNS
from .procs import free_port, pid_alive, processes_under, read_pid, start_daemon, terminate, wait_until

NODE_NAME = kubelet.NODE_NAME
LABEL = kubelet.LABEL
TAINT = kubelet.TAINT
DAEMONS = ("kubelet", "coredns", "containerd")  # in stopping order
# Directories of one run (the image store, containerd/root, is kept).
RUN_DIRS = ("kubelet", "kubelet-pki", "pki", "pod-logs", "run", "cni", "coredns", "containerd/state", "containerd/runc", "containerd/opt")


def base_dir() -> Path:
    return cache_root() / "realnode"


def owner_of(base: Path | None = None) -> dict | None:
    """The owner record of the machine's real node (``cluster``, ``pid``, ...), or None."""
    try:
        return json.loads(((base or base_dir()) / "owner.json").read_text())
    except (OSError, ValueError):
        return None


def pod_spec_for_real_node() -> dict:
    """What a pod spec needs to run on the real node: its label as node selector, its taint tolerated."""
    return {
        "nodeSelector": {LABEL: "true"},
        "tolerations": [{"key": LABEL, "operator": "Equal", "value": "true", "effect": "NoSchedule"}],
    }


class RealNode:
    """The machine's real node, owned by the cluster ``cluster_name`` while it runs."""

    def __init__(
        self, cluster_name: str, cluster_dir: Path, bins: Binaries, base: Path | None = None, log: Callable[[str], None] | None = None
    ) -> None:
        self.cluster_name = cluster_name
        self.cluster_dir = cluster_dir
        self.bins = bins
        self.base = base or base_dir()
        self._log = log or (lambda _msg: None)
        self._fd: int | None = None
        self.timings: dict[str, float] = {}
        self._kubelet_started = 0.0
        self.images: dict[str, str] = {}  # tar stem -> image name (pause, probe)
        self.containerd = Containerd(self.base, "")

    # ------------------------------------------------------------------ paths
    def _pid_file(self, name: str) -> Path:
        return self.base / "pids" / f"{name}.pid"

    def pid(self, name: str) -> int | None:
        """The pid of ``kubelet``, ``containerd`` or ``coredns``."""
        return read_pid(self._pid_file(name))

    @property
    def owner_file(self) -> Path:
        return self.base / "owner.json"

    @property
    def logs_dir(self) -> Path:
        return self.base / "logs"

    def running(self) -> bool:
        owner = owner_of(self.base)
        return bool(owner and owner.get("cluster") == self.cluster_name) and all(
            (p := self.pid(n)) is not None and pid_alive(p) for n in DAEMONS
        )

    # ------------------------------------------------------------------ lock
    def _acquire(self, wait: float) -> None:
        """Take the machine's real-node lock, waiting up to ``wait`` seconds for its holder."""
        self.base.mkdir(parents=True, exist_ok=True)
        fd = os.open(self.base / "lock", os.O_RDWR | os.O_CREAT, 0o644)
        deadline = time.monotonic() + wait
        told = 0.0
        orphan_stopped = False
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                self._fd = fd
                return
            except OSError:
                pass
            owner = owner_of(self.base) or {}
            if owner.get("cluster") and not (self.cluster_dir.parent / owner["cluster"]).exists() and not orphan_stopped:
                orphan_stopped = True
                # Its cluster is gone (deleted without it, or its session killed): an orphan.
                self._log(f"stopping the real node of cluster {owner['cluster']}, which is gone")
                self._teardown(owner.get("before"))
                continue
            holder = f"cluster {owner.get('cluster', '?')} (started by pid {owner.get('pid', '?')})"
            if time.monotonic() >= deadline:
                os.close(fd)
                raise ClusterError(
                    f"the real node of this machine is in use by {holder}; waited {wait:.0f} s. Stop that cluster "
                    f"(hack/k8s/cluster.py down --name {owner.get('cluster', '<name>')}) or start this one without "
                    "a real node (TestCluster(real_node=False), cluster.py up --no-real-node)"
                )
            if time.monotonic() - told > 30:
                self._log(f"waiting for the real node, in use by {holder}")
                told = time.monotonic()
            time.sleep(1)

    def _release(self) -> None:
        if self._fd is not None:
            os.close(self._fd)
            self._fd = None

    # ------------------------------------------------------------------ start
    def start(self, server: str, wait: float = 600) -> None:
        """Start containerd, CoreDNS and the kubelet; wait until the Node is Ready."""
        t0 = time.monotonic()
        self._acquire(wait)
        t = self._timed("lock_s", t0)
        try:
            stale = owner_of(self.base)
            if stale is not None:
                self._log(f"cleaning up the real node left by cluster {stale.get('cluster')}")
                left = self._teardown(stale.get("before"))
                if left:
                    raise ClusterError(f"the real node left by cluster {stale.get('cluster')} could not be cleaned: " + "; ".join(left))
            for old in self.logs_dir.glob("*.log"):
                old.unlink()
            before = hostguard.snapshot()
            self.owner_file.write_text(
                json.dumps({"cluster": self.cluster_name, "pid": os.getpid(), "started": time.time(), "before": before})
            )
            t = self._timed("cleanup_snapshot_s", t)
            self._start_containerd()
            t = self._timed("containerd_s", t)
            self._start_coredns()
            t = self._timed("coredns_s", t)
            self._start_kubelet(server)
            self._timed("kubelet_ready_s", t)
        except BaseException:
            with contextlib.suppress(Exception):
                self.stop(forget_pods=False)
            raise
        finally:
            # The daemons hold the lock now (they inherited it); it is free once they are gone.
            self._release()
        self._timed("start_total_s", t0)

    def _timed(self, key: str, t0: float) -> float:
        now = time.monotonic()
        self.timings[key] = round(now - t0, 2)
        return now

    def _env(self) -> dict[str, str]:
        env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "kubeconfig")}
        env["PATH"] = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"
        return env

    def _daemon(self, name: str, argv: list[str], log_file: Path) -> None:
        self._pid_file(name).parent.mkdir(parents=True, exist_ok=True)
        assert self._fd is not None
        start_daemon(argv, log_file, self._pid_file(name), self._env(), pass_fds=(self._fd,))

    def _alive(self, name: str) -> Callable[[], bool]:
        return lambda: (p := self.pid(name)) is not None and pid_alive(p)

    def _start_containerd(self) -> None:
        images = {p.stem: p for p in sorted(self.bins.node_images.glob("*.tar"))} if self.bins.node_images else {}
        if "pause" not in images:
            raise ClusterError(f"the pause image is missing in {self.bins.node_images} (hack/k8s/build.sh)")
        from .containerd import image_ref

        self.containerd = Containerd(self.base, image_ref(images["pause"])[0])
        ensure_bridge()
        self.containerd.write_config()
        self._daemon("containerd", self.containerd.argv(), self.containerd.log_file)
        wait_until(self.containerd.ready, 60, f"containerd (log: {self.containerd.log_file})", alive=self._alive("containerd"))
        for stem, tar in images.items():
            self.images[stem] = self.containerd.import_image(tar)

    def _start_coredns(self) -> None:
        dns = CoreDNS(self.base, self.bins.coredns, self.cluster_dir / "kubeconfig.yaml", GATEWAY, free_port())
        dns.write_config()
        self._daemon("coredns", dns.argv(), dns.log_file)
        wait_until(dns.ready, 60, f"CoreDNS (log: {dns.log_file})", alive=self._alive("coredns"))

    def _start_kubelet(self, server: str) -> None:
        pki = self.cluster_dir / "pki"
        ca_crt, ca_key = pki / "ca.crt", pki / "ca.key"
        crt, key = kubelet.node_certificate(self.base / "pki", ca_crt, ca_key)
        kubeconfig = kubelet.write(self.base / "kubelet.kubeconfig", kubelet.kubeconfig(server, ca_crt, crt, key))
        ip = kubelet.node_ip()
        config = kubelet.configuration(
            address=ip,
            port=free_port(),
            healthz_port=free_port(),
            client_ca=ca_crt,
            runtime_endpoint=self.containerd.endpoint,
            dns_ip=GATEWAY,
            pod_logs=self.base / "pod-logs",
        )
        config_path = kubelet.write(self.base / "kubelet-config.yaml", config)
        self._kubelet_started = time.time()
        self._daemon("kubelet", kubelet.argv(self.bins.kubelet, self.base, config_path, kubeconfig, ip), self.logs_dir / "kubelet.log")
        wait_until(self._node_ready, 90, f"node {NODE_NAME} Ready (log: {self.logs_dir / 'kubelet.log'})", alive=self._alive("kubelet"))

    def _api(self):
        from kubernetes import client, config

        return client.CoreV1Api(config.new_client_from_config(config_file=str(self.cluster_dir / "kubeconfig.yaml")))

    def _node_ready(self) -> bool:
        """Ready, as reported by this kubelet (a heartbeat since it started: the Node may still
        show an earlier kubelet's Ready)."""
        node = self._api().read_node(NODE_NAME)
        since = int(self._kubelet_started)
        return any(
            c.type == "Ready" and c.status == "True" and c.last_heartbeat_time and c.last_heartbeat_time.timestamp() >= since
            for c in node.status.conditions or []
        )

    # ------------------------------------------------------------------ faults
    def restart(self, name: str, down: float = 0.0) -> float:
        """Restart the daemon ``name`` (``kubelet`` or ``containerd``) as a service manager does:
        SIGTERM, ``down`` seconds without it, then the same command line again. The pods'
        containers run on (their shims are not the daemon's children). Returns the seconds from
        the SIGTERM until the daemon is back (containerd: answering; the kubelet: the Node Ready
        by a heartbeat of the new process)."""
        if name not in ("kubelet", "containerd"):
            raise ValueError(f"restart: {name!r} is not kubelet or containerd")
        pid = self.pid(name)
        if pid is None or not pid_alive(pid):
            raise ClusterError(f"restart: {name} is not running")
        argv = [a.decode() for a in Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[:-1]]
        t0 = time.monotonic()
        terminate([pid], grace=30)
        time.sleep(down)
        log_file = self.containerd.log_file if name == "containerd" else self.logs_dir / "kubelet.log"
        if name == "kubelet":
            self._kubelet_started = time.time()
        # No lock descriptor to pass: the other daemons hold the machine's real-node lock meanwhile.
        start_daemon(argv, log_file, self._pid_file(name), self._env())
        ready = self.containerd.ready if name == "containerd" else self._node_ready
        wait_until(ready, 90, f"{name} back after a restart (log: {log_file})", alive=self._alive(name))
        return time.monotonic() - t0

    # ------------------------------------------------------------------ stop
    def stop(self, forget_pods: bool = True) -> None:
        """Stop the node and put the host back as it was; raises ClusterError listing
        whatever is left (processes, mounts, cgroups, links, iptables rules, sysctls).
        ``forget_pods``: delete the pods bound to it from the API (not needed when the
        cluster goes too)."""
        owner = owner_of(self.base)
        if forget_pods:
            with contextlib.suppress(Exception):
                self._forget_pods()
        left = self._teardown(owner.get("before") if owner else None)
        if not left:
            self.owner_file.unlink(missing_ok=True)
        self._release()
        if left:
            raise ClusterError("the real node left behind: " + "; ".join(left))

    def _forget_pods(self) -> None:
        """Delete the pods bound to the node from the API (the next kubelet would run them again)."""
        api = self._api()
        for p in api.list_pod_for_all_namespaces(field_selector=f"spec.nodeName={NODE_NAME}", _request_timeout=3).items:
            api.delete_namespaced_pod(p.metadata.name, p.metadata.namespace, grace_period_seconds=0, _request_timeout=3)

    def _teardown(self, before: dict | None) -> list[str]:
        """End every process of the node, remove its containers and run state, undo its host
        changes against ``before``; returns what is still left."""
        for name in ("kubelet", "coredns"):
            pid = self.pid(name)
            if pid is not None:
                terminate([pid], grace=5)
        self._kill_strays(only_containers=True)  # what runs in the pods: then their tasks go at once
        if self._alive("containerd")():
            with contextlib.suppress(Exception):
                self.containerd.remove_all_containers()
        pid = self.pid("containerd")
        if pid is not None:
            terminate([pid], grace=10)
        self._kill_strays()
        forget_cni_results()
        roots = (str(self.base),)
        if before is not None:
            hostguard.restore(before, roots, links_ours=(BRIDGE,))
        else:
            hostguard.unmount([m for m in hostguard.mounts() if m.startswith(str(self.base) + "/")])
            for d in hostguard.CGROUP_ROOT.glob("*/kubepods"):
                hostguard.remove_cgroup(d)
            subprocess.run(["ip", "link", "delete", BRIDGE], capture_output=True)
        for d in RUN_DIRS + ("containerd/root/io.containerd.grpc.v1.cri",):
            p = self.base / d
            if p.exists():
                subprocess.run(["rm", "-rf", "--one-file-system", str(p)], capture_output=True, timeout=120)
        for name in DAEMONS:
            self._pid_file(name).unlink(missing_ok=True)
        left = [f"process {p} {cmd[:100]}" for p, cmd in processes_under(self.base)]
        left += [f"process {p} in /kubepods" for p in sorted(hostguard.cgroup_pids("kubepods"))]
        if before is not None:
            left += hostguard.leftovers(before, roots)
        return left

    def _kill_strays(self, only_containers: bool = False) -> None:
        """Whatever still runs: containers' processes in /kubepods, and unless
        ``only_containers`` shims (their command line names our socket) and anything started
        from our directory."""
        for _ in range(3):
            pids = hostguard.cgroup_pids("kubepods")
            if not only_containers:
                pids |= {p for p, _ in processes_under(self.base)}
            pids.discard(os.getpid())
            if not pids:
                return
            for p in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(p, signal.SIGKILL)
            deadline = time.monotonic() + 5
            while time.monotonic() < deadline and any(pid_alive(p) for p in pids):
                time.sleep(0.05)

    # ------------------------------------------------------------------ info
    def image(self, stem: str) -> str:
        """The name of a node image (``pause``, ``probe``): what a pod's ``image`` says."""
        from .containerd import image_ref

        if self.bins.node_images is None:
            raise ClusterError("the node images are not built (hack/k8s/build.sh)")
        return image_ref(self.bins.node_images / f"{stem}.tar")[0]

    def describe(self) -> dict:
        return {
            "node": NODE_NAME,
            "base": str(self.base),
            "pids": {n: self.pid(n) for n in DAEMONS},
            "images": self.images,
            "logs": str(self.logs_dir),
            "timings": self.timings,
        }
