"""The real node's kubelet: its client certificate, kubeconfig and KubeletConfiguration."""

from __future__ import annotations

import subprocess
from pathlib import Path

import yaml

from .binaries import ClusterError

NODE_NAME = "real-node-0"
LABEL = "kfp-trainer.test/real-node"  # label and taint key: only pods that ask land on the node
TAINT = {"key": LABEL, "value": "true", "effect": "NoSchedule"}


def node_ip() -> str:
    """The machine's non-loopback address (the kubelet refuses a loopback node IP): the
    source address of the default route, else the first global IPv4 address."""
    out = subprocess.run(["ip", "-4", "-o", "route", "get", "192.0.2.255"], capture_output=True, text=True).stdout.split()
    if "src" in out:
        return out[out.index("src") + 1]
    for line in subprocess.run(["ip", "-4", "-o", "addr", "show", "scope", "global"], capture_output=True, text=True).stdout.splitlines():
        return line.split()[3].split("/")[0]
    raise ClusterError("the real node needs a non-loopback IPv4 address; this machine has none")


def node_certificate(pki: Path, ca_crt: Path, ca_key: Path) -> tuple[Path, Path]:
    """A client certificate for the node signed by the cluster's CA (``O=system:nodes``,
    ``CN=system:node:<name>``: the Node authorizer and NodeRestriction apply)."""
    pki.mkdir(parents=True, exist_ok=True)
    key, csr, crt = pki / "node.key", pki / "node.csr", pki / "node.crt"
    steps = [
        ["openssl", "req", "-new", "-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes", "-keyout", str(key)]
        + ["-subj", f"/O=system:nodes/CN=system:node:{NODE_NAME}", "-out", str(csr)],
        ["openssl", "x509", "-req", "-in", str(csr), "-CA", str(ca_crt), "-CAkey", str(ca_key), "-CAcreateserial"]
        + ["-CAserial", str(pki / "ca.srl"), "-days", "30", "-out", str(crt)],
    ]
    for argv in steps:
        proc = subprocess.run(argv, capture_output=True, text=True)
        if proc.returncode != 0:
            raise ClusterError(f"{argv[0]} {argv[1]} failed for the node certificate: {proc.stderr.strip()[-500:]}")
    key.chmod(0o600)
    return crt, key


def kubeconfig(server: str, ca_crt: Path, crt: Path, key: Path) -> dict:
    return {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [{"name": "test", "cluster": {"server": server, "certificate-authority": str(ca_crt)}}],
        "users": [{"name": NODE_NAME, "user": {"client-certificate": str(crt), "client-key": str(key)}}],
        "contexts": [{"name": "node", "context": {"cluster": "test", "user": NODE_NAME}}],
        "current-context": "node",
    }


def configuration(
    *, address: str, port: int, healthz_port: int, client_ca: Path, runtime_endpoint: str, dns_ip: str, pod_logs: Path
) -> dict:
    """The KubeletConfiguration: cgroup v1 with cgroupfs, no swap check, no iptables chains;
    the API server authenticates with a client certificate of the cluster's CA; the pods'
    DNS is our CoreDNS; image garbage collection and disk eviction kept out of the way."""
    return {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": port,
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": False},
            "x509": {"clientCAFile": str(client_ca)},
        },
        "authorization": {"mode": "AlwaysAllow"},
        "cgroupDriver": "cgroupfs",
        "failCgroupV1": False,
        "failSwapOn": False,
        # False: the kubelet sets vm.overcommit_memory, kernel.panic, kernel.panic_on_oops
        # (true would make it refuse to start); the node's teardown restores them.
        "protectKernelDefaults": False,
        "makeIPTablesUtilChains": False,
        "containerRuntimeEndpoint": runtime_endpoint,
        "clusterDNS": [dns_ip],
        "clusterDomain": "cluster.local",
        "resolvConf": "",  # pods get only the cluster's search list, nothing of the host's
        "podLogsDir": str(pod_logs),
        "registerWithTaints": [TAINT],
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "evictionHard": {"memory.available": "100Mi", "nodefs.available": "1%", "imagefs.available": "1%", "nodefs.inodesFree": "1%"},
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "4s",
        "syncFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }


def argv(binary: Path, root: Path, config: Path, kubeconfig_path: Path, ip: str) -> list[str]:
    return [
        str(binary),
        f"--config={config}",
        f"--kubeconfig={kubeconfig_path}",
        f"--root-dir={root / 'kubelet'}",
        f"--cert-dir={root / 'kubelet-pki'}",
        f"--hostname-override={NODE_NAME}",
        f"--node-ip={ip}",
        f"--node-labels={LABEL}=true",
        "--v=2",
    ]


def write(path: Path, doc: dict) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    return path
