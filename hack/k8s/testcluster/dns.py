"""CoreDNS for the real node's pods: ``cluster.local`` served from the API server (Services,
headless Services' pod hostnames, pods), listening on the pods' bridge gateway address,
which is the kubelet's ``clusterDNS``. No forwarding: nothing leaves the machine."""

from __future__ import annotations

import urllib.request
from pathlib import Path

CLUSTER_DOMAIN = "cluster.local"


class CoreDNS:
    """One CoreDNS process; its Corefile, log and readiness port under ``base``."""

    def __init__(self, base: Path, binary: Path, kubeconfig: Path, listen_ip: str, ready_port: int) -> None:
        self.base = base
        self.binary = binary
        self.kubeconfig = kubeconfig
        self.listen_ip = listen_ip
        self.ready_port = ready_port
        self.corefile = base / "coredns" / "Corefile"
        self.log_file = base / "logs" / "coredns.log"

    def corefile_text(self) -> str:
        """One server block for the cluster domain: ``bind`` to the gateway only, ``ready``
        on loopback, the ``kubernetes`` plugin reading the cluster with the admin kubeconfig
        (``pods insecure``: ``a-b-c-d.<ns>.pod.cluster.local`` names too)."""
        return (
            f"{CLUSTER_DOMAIN}:53 {{\n"
            f"    bind {self.listen_ip}\n"
            f"    ready 127.0.0.1:{self.ready_port}\n"
            "    errors\n"
            "    log\n"
            f"    kubernetes {CLUSTER_DOMAIN} {{\n"
            f"        kubeconfig {self.kubeconfig}\n"
            "        pods insecure\n"
            "        ttl 5\n"
            "    }\n"
            "}\n"
        )

    def write_config(self) -> None:
        self.corefile.parent.mkdir(parents=True, exist_ok=True)
        self.corefile.write_text(self.corefile_text())

    def argv(self) -> list[str]:
        return [str(self.binary), "-conf", str(self.corefile)]

    def ready(self) -> bool:
        """CoreDNS's ``/ready``: OK once the kubernetes plugin has synced with the API server."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{self.ready_port}/ready", timeout=2) as resp:
            return resp.status == 200
