"""Faults on the real node while a real trainer runs: the kubelet or containerd restarted, the step's pod lost, the step cut off.

The trainer is the probe test image (hack/k8s/testimage) printing ``line 1`` ... ``line N`` a
tenth of a second apart in a real container on the real node; the step is ``kfp-trainer launch``
as a process, as KFP runs it in a pod. The daemons are restarted as a service manager restarts
them (SIGTERM, then the same command line: ``RealNode.restart``); the step is cut off from the
API server by a proxy between them that drops its connections and holds new ones unanswered. Each test ends as the fault
tests do: the step's outcome, every trainer line relayed once and in order, one TrainJob for the
task, and nothing left in the namespace once the step deleted its job.
"""

from __future__ import annotations

import json
import signal
import time
from urllib.parse import urlparse

import pytest
from faults import Output, kubeconfig_via, list_kind, record, relayed, start_launch, trainjob_name, wait_nothing_left
from testcluster import realnode

from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(420)
LINES, DELAY = 250, 0.1  # 25 s of training


def launch_probe(cluster, namespace: str, real_node, run_id: str, kubeconfig: str = "") -> Output:
    """``kfp-trainer launch`` of the probe trainer on the real node, the job deleted after success."""
    extra = realnode.pod_spec_for_real_node()
    return Output(start_launch(
        kubeconfig or cluster.kubeconfig, namespace, run_id, "--image", real_node.image("probe"), "--command", json.dumps(["/probe"]),
        "--args", json.dumps(["lines", str(LINES), str(DELAY)]), "--node-selector", json.dumps(extra["nodeSelector"]),
        "--tolerations", json.dumps(extra["tolerations"]), "--num-nodes", "1", "--start-timeout", "180", "--run-timeout", "300",
        "--delete-after-success",
    ))  # fmt: skip


def trainer_lines(text: str) -> list[str]:
    return [line for line in relayed(text) if line.startswith("line ")]


EVERY_LINE = [f"line {i}" for i in range(1, LINES + 1)]


@pytest.mark.parametrize("daemon", ["kubelet", "containerd"])
def test_a_node_daemon_restarted_mid_training_loses_no_line_and_the_step_succeeds(cluster, kube_client, namespace, real_node, daemon):
    out = launch_probe(cluster, namespace, real_node, f"run-{time.time_ns()}")
    out.wait_for("line 40", timeout=240)
    back = real_node.restart(daemon)
    print(f"{daemon} back after {back:.1f} s")
    rc = out.finish(timeout=300)
    assert rc == 0, out.text
    assert trainer_lines(out.text) == EVERY_LINE, out.text  # none lost, none twice, in order: the relay reconnected
    assert "completed" in out.text, out.text
    assert len(list_kind(kube_client, namespace, "TrainJob")) <= 1  # never a second job for the task
    left = wait_nothing_left(kube_client, namespace, within=60)
    record({"fault": f"{daemon} restarted on the real node mid-training", "daemon_back_s": round(back, 1), "cleanup_s": round(left, 1)})


def test_the_steps_pod_lost_mid_training_and_kfps_retry_adopts_the_running_job_and_relays_its_whole_log(
    cluster, kube_client, namespace, real_node
):
    run_id = f"run-{time.time_ns()}"
    first = launch_probe(cluster, namespace, real_node, run_id)
    first.wait_for("line 60", timeout=240)
    name = trainjob_name(first.text)
    first.proc.send_signal(signal.SIGKILL)  # the step's pod is gone: no handler runs, the job runs on
    first.finish(timeout=30)
    [job] = list_kind(kube_client, namespace, "TrainJob")
    assert job["metadata"]["name"] == name
    retry = launch_probe(cluster, namespace, real_node, run_id)  # KFP's retry: the same run and task, a new pod
    rc = retry.finish(timeout=300)
    assert rc == 0, retry.text
    assert f"adopted existing TrainJob {namespace}/{name}" in retry.text, retry.text
    assert trainer_lines(retry.text) == EVERY_LINE, retry.text  # the retry's log has the trainer's whole log, once
    assert "created TrainJob" not in retry.text
    left = wait_nothing_left(kube_client, namespace, within=60)
    record({"fault": "the step's pod lost mid-training, KFP's retry adopts", "cleanup_s": round(left, 1)})


def test_a_step_cut_off_from_the_api_server_for_60_s_follows_on_and_ends_with_the_jobs_real_outcome(
    cluster, kube_client, namespace, real_node, tmp_path
):
    """The trainer ends while the step cannot reach the API server; once it can, the step relays the rest and succeeds."""
    server = urlparse(cluster.server)
    with TcpProxy(server.hostname, server.port) as proxy:
        out = launch_probe(cluster, namespace, real_node, f"run-{time.time_ns()}", kubeconfig_via(cluster.kubeconfig, proxy.port,
                           tmp_path / "kubeconfig"))  # fmt: skip
        out.wait_for("line 20", timeout=240)
        cut = time.monotonic()
        proxy.hang()
        proxy.sever()  # its open watches and log stream drop; new connections get no answer
        trainer_done = wait_trainjob_finished(kube_client, namespace, timeout=120)
        time.sleep(max(0.0, 60 - (time.monotonic() - cut)))
        proxy.answer()
        rc = out.finish(timeout=240)
    assert trainer_done - cut < 60, "the trainer was to end while the step was cut off"
    assert rc == 0, out.text
    assert trainer_lines(out.text) == EVERY_LINE, out.text  # what it missed while cut off, relayed once it could
    left = wait_nothing_left(kube_client, namespace, within=60)
    record({"fault": "the step cut off from the API server for 60 s", "cleanup_s": round(left, 1)})


def wait_trainjob_finished(api, namespace: str, timeout: float) -> float:
    """When the namespace's TrainJob reads Complete (seen through the test's own connection)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        for job in list_kind(api, namespace, "TrainJob"):
            if any(c.get("type") == "Complete" and c.get("status") == "True" for c in (job.get("status") or {}).get("conditions") or []):
                return time.monotonic()
        time.sleep(0.5)
    raise AssertionError(f"the TrainJob did not complete within {timeout} s")
