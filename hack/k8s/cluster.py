#!/usr/bin/env python3
"""The test cluster from the command line (the code is in hack/k8s/testcluster/).

python hack/k8s/cluster.py up       # build if needed, start (or reuse), print the kubeconfig path
python hack/k8s/cluster.py status   # print state and kubeconfig path; exit 1 if not running
python hack/k8s/cluster.py down     # delete the cluster, verify no process is left
python hack/k8s/cluster.py build    # only build the binaries
"""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from testcluster.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
