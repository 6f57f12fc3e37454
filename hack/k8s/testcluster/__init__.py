"""The test control plane: a real Kubernetes API server with the real Kubeflow Trainer and
JobSet controllers, pods played by KWOK (see docs/controlplane.md).

    >>> from testcluster import TestCluster          # doctest: +SKIP
    >>> with TestCluster() as c:                      # doctest: +SKIP
    ...     print(c.kubeconfig)
"""

from .binaries import Binaries, BinariesUnavailable, ClusterError, binaries, cache_root, jobset_manifests, trainer_manifests
from .cluster import DEFAULT_CLUSTER_NAME, TestCluster, env_feature_gates
from .components import format_gates, parse_gates
from .scripting import PodScript

__all__ = [
    "DEFAULT_CLUSTER_NAME",
    "Binaries",
    "BinariesUnavailable",
    "ClusterError",
    "PodScript",
    "TestCluster",
    "binaries",
    "cache_root",
    "env_feature_gates",
    "format_gates",
    "jobset_manifests",
    "parse_gates",
    "trainer_manifests",
]
