"""Cancel-to-gone on the test control plane: SIGTERM to ``kfp-trainer launch`` at random moments.

    .venv/bin/python hack/cancel_timing.py [--runs 20] [--seed 7] [--src DIR]

Starts a test cluster (hack/k8s/testcluster: a real API server, the real Trainer and JobSet
controllers, KWOK pods that print lines), then launches one TrainJob at a time and sends SIGTERM
after a random delay, from process start to well into log streaming. For each it measures how
long the process took to exit and until nothing of its run (TrainJob, JobSet, Jobs, pods) was
left at the API server, and prints the median and the maximum -- of all runs, and of those where
the job had been created. ``--src`` runs the launcher from another copy of the package (e.g. an
earlier commit's, from ``git archive``) to compare.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import statistics
import sys
import time
import uuid
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(REPO / "hack" / "k8s"), str(REPO / "tests" / "integration"), str(REPO)]

import testcluster  # noqa: E402
from faults import Output, leftovers, start_launch  # noqa: E402
from kubernetes import client  # noqa: E402
from testcluster import PodScript  # noqa: E402

from kfp_trainer import spec  # noqa: E402


def namespace(api: client.ApiClient) -> str:
    """A fresh namespace whose default service account exists."""
    core = client.CoreV1Api(api)
    name = f"cancel-{uuid.uuid4().hex[:8]}"
    core.create_namespace({"metadata": {"name": name}})
    deadline = time.monotonic() + 30
    while True:
        try:
            core.read_namespaced_service_account("default", name)
            return name
        except client.ApiException:
            if time.monotonic() > deadline:
                raise
            time.sleep(0.1)


def measure(kubeconfig: str, api: client.ApiClient, ns: str, runs: int, rng: random.Random) -> list[tuple[float, int, bool, float, float]]:
    """(delay, exit code, job created, seconds to exit, seconds until nothing is left) of each run."""
    script = PodScript(lines=[f"step {i}" for i in range(400)], line_delay=0.25, exit_delay=float("inf"), start_delay=1.5)
    extra = ("--pod-annotations", json.dumps(script.annotations()))
    began = time.monotonic()
    out = Output(start_launch(kubeconfig, ns, "calibrate", *extra))
    out.wait_for("step 0")
    span = time.monotonic() - began  # from process start to the first relayed line
    out.proc.send_signal(signal.SIGTERM)
    out.finish()
    rows = []
    for i in range(runs):
        run, delay = f"timing-{i}", rng.uniform(0.3, span * 1.3)
        out = Output(start_launch(kubeconfig, ns, run, *extra))
        time.sleep(delay)
        out.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        rc = out.finish()
        exited = time.monotonic() - sent
        while leftovers(api, ns, selector=f"{spec.LABEL_RUN}={run}"):
            time.sleep(0.05)
        gone = time.monotonic() - sent
        created = "created TrainJob" in out.text or "deleted TrainJob" in out.text
        rows.append((delay, rc, created, exited, gone))
        print(f"SIGTERM after {delay:5.2f}s: exit {rc}, job created: {created}, exit {exited:5.2f}s, all gone {gone:5.2f}s", flush=True)
    return rows


def summary(label: str, rows: list[tuple[float, int, bool, float, float]]) -> str:
    """One line: median and maximum of both times."""
    gone, exited = [r[4] for r in rows], [r[3] for r in rows]
    return (
        f"{label}: n={len(rows)}; cancel-to-gone median {statistics.median(gone):.2f}s, max {max(gone):.2f}s; "
        f"cancel-to-exit median {statistics.median(exited):.2f}s, max {max(exited):.2f}s"
    )


def main() -> int:
    """Run the measurement; exit 1 if a run ended otherwise than cancelled (130, or killed before its handlers)."""
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=20)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--src", help="directory holding the kfp_trainer package to launch (default: this checkout)")
    args = parser.parse_args()
    if args.src:
        os.environ["PYTHONPATH"] = str(Path(args.src).resolve())
        os.chdir(args.src)  # ``python -m`` puts the working directory first on the path
    cluster = testcluster.TestCluster(unique=True).start(build=False)
    try:
        api = cluster.api_client()
        rows = measure(cluster.kubeconfig, api, namespace(api), args.runs, random.Random(args.seed))
    finally:
        cluster.stop()
    print(summary("all runs", rows))
    made = [r for r in rows if r[2]]
    if made:
        print(summary("job created", made))
    return 0 if all(r[1] in (130, -signal.SIGTERM) for r in rows) else 1


if __name__ == "__main__":
    sys.exit(main())
