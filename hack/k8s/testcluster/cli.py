"""``python hack/k8s/cluster.py up|down|status|build``: the test cluster from the command line."""

from __future__ import annotations

import argparse
import json
import sys

from . import realnode
from .binaries import KUBE_VERSION, KUBE_VERSIONS, ClusterError, binaries
from .cluster import DEFAULT_CLUSTER_NAME, TestCluster
from .components import parse_gates

USAGE = """\
    python hack/k8s/cluster.py up       # build if needed, start (or reuse), print the kubeconfig path
    python hack/k8s/cluster.py status   # print state and kubeconfig path; exit 1 if not running
    python hack/k8s/cluster.py down     # delete the cluster (and its real node), verify nothing is left
    python hack/k8s/cluster.py build    # only build the binaries

    up --feature-gates TrainJobStatus=true   # gates of the Trainer/JobSet controllers
    up --no-real-node                        # without the real node (kubelet, containerd, CoreDNS)
    up --kube-version v1.32.2                # the oldest API server tested (no real node), cluster
                                             # name kfp-trainer-test-v1-32 unless --name is given
    up --kube-version v1.32.2 --kube-feature-gates WatchList=false   # gates of the Kubernetes components
    up --kueue                               # also Kueue v0.17.0 (namespaces labelled kfp-trainer.test/kueue=true)
    up --trainer-version v2.1.0              # another Kubeflow Trainer release (v2.1.0, v2.2.1, v2.3.0)

Environment: KFP_TRAINER_CACHE, KFP_TRAINER_CRDS_DIR, KFP_TRAINER_JOBSET_DIR,
KFP_TRAINER_CLUSTER_NAME, KFP_TRAINER_FEATURE_GATES, KFP_TRAINER_VERSION (see docs/controlplane.md).
"""


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=USAGE, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("command", choices=["up", "down", "status", "build"])
    ap.add_argument("--name", default=None)
    ap.add_argument("--feature-gates", default=None, help="Name=true,... for the Trainer/JobSet controllers")
    ap.add_argument("--no-real-node", action="store_true", help="up: start the cluster without the real node")
    ap.add_argument("--trainer-version", default=None, help="up: the Kubeflow Trainer release (default KFP_TRAINER_VERSION or v2.3.0)")
    ap.add_argument("--kube-version", default=KUBE_VERSION, choices=KUBE_VERSIONS, help="of kube-apiserver, controller manager, scheduler")
    ap.add_argument("--kube-feature-gates", default="", help="Name=true,... for kube-apiserver, controller manager and scheduler")
    ap.add_argument("--kueue", action="store_true", help="up: also start Kueue (its CRDs, manager and webhooks)")
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args(argv)
    gates = parse_gates(args.feature_gates) if args.feature_gates is not None else None
    real_node = False if args.no_real_node or args.kube_version != KUBE_VERSION else None
    name = args.name
    if name is None and args.kube_version != KUBE_VERSION:
        name = f"{DEFAULT_CLUSTER_NAME}-{'-'.join(args.kube_version.split('.')[:2])}"
    c = TestCluster(
        name,
        reuse=True,
        verbose=args.verbose or args.command == "up",
        feature_gates=gates,
        real_node=real_node,
        kube_version=args.kube_version,
        kube_feature_gates=args.kube_feature_gates,
        trainer_version=args.trainer_version,
    )
    if args.command == "build":
        b = binaries(build=True, log=sys.stderr)
        print(b.bin_dir)
        print(b.controllers)
        return 0
    if args.command == "up":
        c.start()
        if gates is not None and c.timings.get("reused") and gates != c.feature_gates:
            c.restart_controllers(gates)
        if args.kueue:
            c.start_kueue()
        print(json.dumps(c.describe(), indent=2), file=sys.stderr)
        print(c.kubeconfig)
        return 0
    if args.command == "down":
        try:
            c.stop()
        except ClusterError as e:
            print(f"cluster {c.name}: {e}", file=sys.stderr)
            return 1
        left = c.leftover_processes()
        if left:
            print(f"left behind: {left}", file=sys.stderr)
            return 1
        print(f"cluster {c.name} deleted", file=sys.stderr)
        return 0
    running = c.is_running()
    print(f"cluster {c.name}: {'running' if running else 'not running'}", file=sys.stderr)
    owner = realnode.owner_of()
    if owner:
        print(
            f"real node {realnode.NODE_NAME}: owned by cluster {owner.get('cluster')} (logs: {realnode.base_dir() / 'logs'})",
            file=sys.stderr,
        )
    if running:
        print(f"server: {c.server}", file=sys.stderr)
        for p, cmd in c.leftover_processes():
            print(f"  {p} {cmd[:120]}", file=sys.stderr)
    print(c.kubeconfig)
    return 0 if running else 1
