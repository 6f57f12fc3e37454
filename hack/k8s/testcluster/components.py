"""The test cluster's processes besides kwokctl's: the kubelet front, the pod scripting
process and the Trainer/JobSet controllers."""

from __future__ import annotations

import sys
import urllib.request
from collections.abc import Mapping
from pathlib import Path

from .binaries import K8S_DIR, ClusterError
from .procs import pid_alive, port_open, read_pid, start_daemon, terminate, wait_until


class Component:
    """A process of the cluster: started detached, found again by its pid file."""

    name = ""

    def __init__(self, cluster_dir: Path, state_dir: Path, cluster_name: str) -> None:
        self.cluster_dir = cluster_dir
        self.pid_file = state_dir / f"{cluster_name}.{self.name}.pid"
        self.log_file = cluster_dir / "logs" / f"{self.name}.log"
        self.kubeconfig = cluster_dir / "kubeconfig.yaml"  # kwokctl's admin kubeconfig

    @property
    def pid(self) -> int | None:
        return read_pid(self.pid_file)

    def running(self) -> bool:
        pid = self.pid
        return pid is not None and pid_alive(pid)

    def argv(self) -> list[str]:
        raise NotImplementedError

    def ready(self) -> bool:
        raise NotImplementedError

    def start(self, env: Mapping[str, str], timeout: float = 60) -> None:
        """Start the process unless it runs; wait until it is ready."""
        if not self.running():
            start_daemon(self.argv(), self.log_file, self.pid_file, env)
        wait_until(self.ready, timeout, f"{self.name} not ready (log: {self.log_file})", alive=self.running)

    def stop(self) -> None:
        pid = self.pid
        if pid is not None:
            left = terminate([pid])
            if left:
                raise ClusterError(f"{self.name} (pid {pid}) did not stop")
        self.pid_file.unlink(missing_ok=True)


class KubeletFront(Component):
    """hack/k8s/logfront.py: the nodes' kubelet port, forwarding to the kwok controller."""

    name = "logfront"

    def __init__(self, cluster_dir: Path, state_dir: Path, cluster_name: str, port: int, kwok_port: int) -> None:
        super().__init__(cluster_dir, state_dir, cluster_name)
        self.port, self.kwok_port = port, kwok_port

    def argv(self) -> list[str]:
        pki = self.cluster_dir / "pki"
        return [
            sys.executable,
            str(K8S_DIR / "logfront.py"),
            "--listen-port",
            str(self.port),
            "--upstream-port",
            str(self.kwok_port),
            "--kubeconfig",
            str(self.kubeconfig),
            "--cert",
            str(pki / "admin.crt"),
            "--key",
            str(pki / "admin.key"),
        ]

    def ready(self) -> bool:
        return port_open(self.port)


class PodScripting(Component):
    """hack/k8s/podscript.py: writes the scripted logs of the pods."""

    name = "podscript"

    def __init__(self, cluster_dir: Path, state_dir: Path, cluster_name: str, logs_dir: Path, kwok_port: int) -> None:
        super().__init__(cluster_dir, state_dir, cluster_name)
        self.logs_dir, self.kwok_port = logs_dir, kwok_port

    def argv(self) -> list[str]:
        return [
            sys.executable,
            str(K8S_DIR / "podscript.py"),
            "--kubeconfig",
            str(self.kubeconfig),
            "--logs-dir",
            str(self.logs_dir),
            "--kwok-port",
            str(self.kwok_port),
        ]

    def ready(self) -> bool:
        try:
            return "pod scripting started" in self.log_file.read_text(errors="replace")
        except OSError:
            return False


def format_gates(gates: Mapping[str, bool]) -> str:
    """``{"TrainJobStatus": True}`` -> ``"TrainJobStatus=true"``.

    Example:
        >>> format_gates({"TrainJobStatus": True, "RestartJob": False})
        'RestartJob=false,TrainJobStatus=true'
    """
    return ",".join(f"{k}={'true' if v else 'false'}" for k, v in sorted(gates.items()))


def parse_gates(text: str) -> dict[str, bool]:
    """``"TrainJobStatus=true"`` -> ``{"TrainJobStatus": True}``.

    Example:
        >>> parse_gates("TrainJobStatus=true, RestartJob=false")
        {'TrainJobStatus': True, 'RestartJob': False}
    """
    gates = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        key, sep, value = item.partition("=")
        if not sep or value.lower() not in ("true", "false"):
            raise ValueError(f"feature gate {item!r}: expected Name=true or Name=false")
        gates[key.strip()] = value.lower() == "true"
    return gates


class Controllers(Component):
    """The real Kubeflow Trainer and JobSet controllers with their webhooks (hack/k8s/controllers)."""

    name = "controllers"
    CERT_DIR = "controllers-pki"  # in the cluster's directory: the CA and serving certificate, kept across restarts

    def __init__(
        self,
        cluster_dir: Path,
        state_dir: Path,
        cluster_name: str,
        binary: Path,
        webhook_port: int,
        health_port: int,
        status_server_port: int,
        feature_gates: Mapping[str, bool],
    ) -> None:
        super().__init__(cluster_dir, state_dir, cluster_name)
        self.binary = binary
        self.webhook_port, self.health_port, self.status_server_port = webhook_port, health_port, status_server_port
        self.feature_gates = dict(feature_gates)
        self.cert_dir = cluster_dir / self.CERT_DIR

    def argv(self) -> list[str]:
        argv = [
            str(self.binary),
            "--kubeconfig",
            str(self.kubeconfig),
            "--cert-dir",
            str(self.cert_dir),
            "--webhook-port",
            str(self.webhook_port),
            "--health-port",
            str(self.health_port),
            "--status-server-port",
            str(self.status_server_port),
        ]
        if self.feature_gates:
            argv += ["--feature-gates", format_gates(self.feature_gates)]
        return argv

    def ready(self) -> bool:
        """Ready once its webhooks are served and registered (its /readyz)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as resp:
            return resp.status == 200

    @property
    def ca_file(self) -> Path:
        """The CA of the webhook and status server certificate (made at the first start)."""
        return self.cert_dir / "ca.crt"
