"""A KFP terminate, as the step's container gets it, leaves nothing in the cluster: every entry point, on the real node.

The step runs in the process tree of a KFP 2.17 step on Argo (``tests/kfp_pod.py``), in a PID
namespace of its own: PID 1 (the emissary) forwards the stop signal to the process group of
KFP's launcher, which holds the step's stdout in a pipe and dies of the signal at once; PID 1
exits 1.7 s later (what a real backend gave the container), and every process left in the
namespace dies with it. The trainer is a real container on the real node: running (it prints a
line every 0.2 s) or still Pending (it asks for more CPU than the node has). After the signal,
nothing of the run may be left: no TrainJob, JobSet, Job or pod.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest
from faults import leftovers, wait_nothing_left
from kubernetes import client
from test_realpods_failures import RUNTIME, runtime
from testcluster import realnode

from tests.entry_points import ENTRY_POINTS, step_argv

pytestmark = pytest.mark.timeout(240)
POD = Path(__file__).resolve().parents[1] / "kfp_pod.py"
LINGER = 1.7  # seconds from the signal to the container's end, on a real KFP 2.17 backend (docs/cancel.md)
CASES = [(entry, state, signal.SIGTERM) for state in ("running", "pending") for entry in ENTRY_POINTS]
# SIGINT from every entry point is tests/local/test_cancel_entry_points_local.py's; here two, one per state
CASES += [("cli-flag-first", "pending", signal.SIGINT), ("python-api", "running", signal.SIGINT)]


@pytest.fixture
def ns(api_client, checked, real_node):
    """A fault test's namespace (``checked``: nothing left, never two TrainJobs of one task) with the probe runtime."""
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        "trainer.kubeflow.org", "v1alpha1", checked, "trainingruntimes", runtime(RUNTIME, checked)
    )
    return checked


def inputs(ns: str, image: str, state: str) -> dict:
    extra = realnode.pod_spec_for_real_node()
    found = {
        "run_id": f"run-{uuid.uuid4().hex[:10]}",
        "task_name": "train",
        "namespace": ns,
        "runtime": RUNTIME,
        "runtime_kind": "TrainingRuntime",
        "image": image,
        "command": ["/probe"],
        "args": ["lines", "1000", "0.2"],
        "node_selector": extra["nodeSelector"],
        "tolerations": extra["tolerations"],
    }
    if state == "pending":  # more than the node has: the pod stays Pending (Unschedulable)
        found["resources_per_node"] = {"requests": {"cpu": "500"}}
    return found


def pid_one(unshare: subprocess.Popen, timeout: float = 10) -> int:
    """The host pid of the namespace's first process (the child ``unshare --fork`` made)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        children = Path(f"/proc/{unshare.pid}/task/{unshare.pid}/children").read_text().split()
        if children:
            return int(children[0])
        time.sleep(0.05)
    raise AssertionError("unshare started no child")


def wait_text(path: Path, text: str, proc: subprocess.Popen, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if path.exists() and text in path.read_text(errors="replace"):
            return
        if proc.poll() is not None:
            break
        time.sleep(0.1)
    raise AssertionError(f"no {text!r} in the step's log: {path.read_text(errors='replace') if path.exists() else '(none)'}")


@pytest.mark.parametrize(("entry", "state", "sig"), CASES, ids=[f"{e}-{s}-{signal.Signals(g).name}" for e, s, g in CASES])
def test_a_kfp_terminate_leaves_no_trainjob_jobset_job_or_pod(cluster, kube_client, ledger, ns, real_node, tmp_path, entry, state, sig):
    argv = step_argv(entry, inputs(ns, real_node.image("probe"), state), {}, backend="kubernetes", folder=tmp_path)
    log, events = tmp_path / "step.log", tmp_path / "events"
    env = {**os.environ, "KUBECONFIG": cluster.kubeconfig, "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}  # fmt: skip
    pod = subprocess.Popen(
        ["unshare", "--pid", "--fork", "--kill-child", sys.executable, str(POD), "pod", "--log", str(log), "--events", str(events),
         "--linger", str(LINGER), "--", *argv],
        env=env,
    )  # fmt: skip
    try:
        emissary = pid_one(pod)
        # running: the trainer's lines reach the step's log; pending: the step says what keeps the pod from starting
        wait_text(log, "line 3" if state == "running" else "not starting yet", pod, timeout=120)
        if state == "pending":
            assert "line 1" not in log.read_text()
        os.kill(emissary, sig)  # what the kubelet does to a terminated run's container
        pod.wait(timeout=30)  # the container is gone: PID 1 exited, the namespace with it
    finally:
        if pod.poll() is None:
            pod.kill()
    text = log.read_text(errors="replace")
    took = wait_nothing_left(kube_client, ns, within=60)
    ledger.wait_caught_up(ns)
    jobs = ledger.created(ns)
    signalled = next(float(line.split()[0]) for line in events.read_text().splitlines() if line.split()[1] == "signal")
    gone = [round(e.deleted - signalled, 2) if e.deleted else None for e in jobs]
    print(f"{entry} {state} {signal.Signals(sig).name}: TrainJob gone {gone} s after the signal, everything {took:.1f} s after "
          f"the container ended\nevents:\n{events.read_text()}\nlog tail:\n{text[-2000:]}")  # fmt: skip
    assert len(jobs) == 1 and jobs[0].deleted is not None, jobs
    assert leftovers(kube_client, ns) == []
