"""The kwokctl and kwok configuration of a test cluster, with our KWOK stages."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import yaml

from . import scripting
from .binaries import KUBE_VERSION, Binaries
from .procs import free_port

STAGES_DIR = Path(__file__).resolve().parent / "stages"
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"  # "fake" on the KWOK nodes; the real node has none

_A = "(.metadata.annotations // {})"
_INSTANCE = "(.status.containerStatuses[0].restartCount // 0)"
_ATTEMPT = '(.metadata.labels["jobset.sigs.k8s.io/restart-attempt"] // "0" | tonumber)'
# jq expressions the pod stages share (written @name@ in stages/pod.yaml).
JQ_MACROS = {
    "crashing": (
        f'({_A} as $a | {_INSTANCE} as $n | ($a["{scripting.CRASHES}"] // "0") as $c'
        ' | if $c == "always" then true else $n < ($c | tonumber) end)'
    ),
    "exit_code": (
        f'({_A} as $a | if ($a["{scripting.FAILING_ATTEMPTS}"] // null) != null'
        f' and {_ATTEMPT} >= ($a["{scripting.FAILING_ATTEMPTS}"] | tonumber)'
        f' then 0 else ($a["{scripting.EXIT_CODE}"] // "0" | tonumber) end)'
    ),
    "may_exit": f'({_A}["{scripting.EXIT_DELAY}"] != "never")',
    "log_done": f'({_A}["{scripting.LOG_DONE}"] == ({_INSTANCE} | tostring))',
}


@dataclasses.dataclass
class Ports:
    """Loopback ports of one cluster (kept in its state file, reused when it is restarted)."""

    apiserver: int = 0
    etcd: int = 0
    etcd_peer: int = 0
    controller_manager: int = 0
    scheduler: int = 0
    kwok: int = 0  # the kwok controller's server (fake kubelet)
    front: int = 0  # the kubelet front (logfront.py), advertised as the nodes' kubelet port
    webhooks: int = 0  # the Trainer/JobSet controllers' webhook server
    controllers_health: int = 0
    status_server: int = 0  # the Trainer status server (TrainJobStatus gate)

    @classmethod
    def pick(cls) -> Ports:
        return cls(**{f.name: free_port() for f in dataclasses.fields(cls)})


DEFAULT_VOLUMES_DIR = Path("/var/lib/kfp-trainer-test/volumes")


def stages(volumes_dir: Path = DEFAULT_VOLUMES_DIR) -> list[dict]:
    """Every KWOK stage of the cluster (nodes, pods, volumes); they replace kwok's defaults.
    ``volumes_dir``: where the provisioner's host-path volumes live (made when a pod of the
    real node mounts one)."""
    docs: list[dict] = []
    for path in sorted(STAGES_DIR.glob("*.yaml")):
        text = path.read_text()
        for name, expression in {**JQ_MACROS, "volumes_dir": str(volumes_dir)}.items():
            text = text.replace(f"@{name}@", expression)
        docs += yaml.safe_load(text)
    return docs


def config(
    b: Binaries,
    ports: Ports,
    cluster_dir: Path,
    audit_policy: Path | None = None,
    kube_version: str = KUBE_VERSION,
    kube_feature_gates: str = "",
) -> list[dict]:
    """The kwokctl configuration documents (KwokctlConfiguration, KwokConfiguration, Stages).

    ``cluster_dir``: the cluster's directory (kwokctl's certificates in ``pki/``; the
    volumes the provisioner gives claims in ``volumes/``).
    ``audit_policy``: kwokctl copies it into the cluster's directory and starts the API server
    with ``--audit-policy-file`` and ``--audit-log-path=<cluster dir>/logs/audit.log``.
    ``kube_version``: of kube-apiserver, kube-controller-manager and kube-scheduler (one of
    ``binaries.KUBE_VERSIONS``). ``kube_feature_gates``: ``Name=true,...`` for those three.
    """
    pki = cluster_dir / "pki"
    options = {
        "runtime": "binary",
        "bindAddress": "127.0.0.1",
        "securePort": True,
        "kubeAuthorization": True,  # --authorization-mode=Node,RBAC
        "kubeAdmission": True,
        "quietPull": True,
        "enableCRDs": ["Logs", "ClusterLogs"],
        # Every port explicit: kwokctl's own port probe would also bind the wildcard address.
        "kubeApiserverPort": ports.apiserver,
        "etcdPort": ports.etcd,
        "etcdPeerPort": ports.etcd_peer,
        "kubeControllerManagerPort": ports.controller_manager,
        "kubeSchedulerPort": ports.scheduler,
        "kwokControllerPort": ports.kwok,
        "kubeApiserverBinary": str(b.kube("kube-apiserver", kube_version)),
        "kubeControllerManagerBinary": str(b.kube("kube-controller-manager", kube_version)),
        "kubeSchedulerBinary": str(b.kube("kube-scheduler", kube_version)),
        "kwokControllerBinary": str(b / "kwok"),
        "etcdBinary": str(b / "etcd"),
        "etcdctlBinary": str(b / "etcdctl"),
        "kubectlBinary": "/usr/bin/kubectl",
        "kubeVersion": kube_version,
        "nodeLeaseDurationSeconds": 40,
    }
    if kube_feature_gates:
        options["kubeFeatureGates"] = kube_feature_gates
    if audit_policy is not None:
        options["kubeAuditPolicy"] = str(audit_policy)
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
                    # Reach "kubelets" (the kubelet front) by the node's InternalIP only.
                    {"key": "kubelet-preferred-address-types", "value": "InternalIP"},
                    # A real kubelet (the real node) authenticates the API server by a client
                    # certificate of the cluster's CA (logs, exec).
                    {"key": "kubelet-client-certificate", "value": str(pki / "admin.crt")},
                    {"key": "kubelet-client-key", "value": str(pki / "admin.key")},
                ],
            },
            {
                "name": "kube-controller-manager",
                # One instance only; lets the cluster restart it at once.
                "extraArgs": [{"key": "leader-elect", "value": "false"}],
            },
            {
                "name": "kube-scheduler",
                # Likewise: a scheduler that loses its lease while the API server is down exits,
                # and nothing here restarts it (a kubelet would).
                "extraArgs": [{"key": "leader-elect", "value": "false"}],
            },
            {
                "name": "kwok-controller",
                "extraArgs": [
                    # kwokctl passes an empty --node-ip in binary mode; the API server
                    # reaches the fake kubelet (pod logs) at the node's InternalIP.
                    {"key": "node-ip", "value": "127.0.0.1"},
                    # Nodes advertise the kubelet front (logfront.py) as their kubelet port.
                    {"key": "node-port", "value": str(ports.front)},
                    # Only the fake nodes (annotated so): never the real node's pods.
                    {"key": "manage-all-nodes", "value": "false", "override": True},
                    {"key": "manage-nodes-with-annotation-selector", "value": f"{FAKE_NODE_ANNOTATION}=fake"},
                ],
            },
        ],
    }
    kwok = {
        "apiVersion": "config.kwok.x-k8s.io/v1alpha1",
        "kind": "KwokConfiguration",
        "options": {
            "nodeIP": "127.0.0.1",
            "cidr": "10.0.0.0/16",
            # A KwokConfiguration document replaces kwok's defaults: restate them.
            "enableDebuggingHandlers": True,
            "enableProfilingHandler": False,
            "podPlayStageParallelism": 8,
            "nodePlayStageParallelism": 4,
            "nodeLeaseParallelism": 4,
            "podsOnNodeSyncParallelism": 1,
            "enablePodsOnNodeSyncListPager": True,
            "enablePodsOnNodeSyncStreamWatch": False,
        },
    }
    return [kwokctl, kwok, *stages(cluster_dir / "volumes")]
