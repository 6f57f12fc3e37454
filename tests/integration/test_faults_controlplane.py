"""Faults of the control plane under a running launch: the API server killed, etcd restarted or
stopped, every watch answered ``410 Gone``, and a slow API server (latency from a proxy).

The launcher must still relay the trainer's log exactly (nothing lost, nothing twice), report
the job's real outcome, honour its time limits and cancels, and leave nothing behind.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import threading
import time
from collections.abc import Callable
from urllib.parse import urlparse

import pytest
from faults import Output, api_via, kubeconfig_via, leftovers, relayed, start_launch, trainjob_name
from k8s_objects import recording
from testcluster import PodScript

from kfp_trainer.backends.kube import lifecycle
from kfp_trainer.backends.kube.api import RetryPolicy
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import TimeLimitError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(300)
LINES = [f"step {i:02d} loss={1 / (i + 1):.4f}" for i in range(30)]


def inputs(namespace: str, script: PodScript, **kw) -> TrainJobInputs:
    return TrainJobInputs(
        run_id=f"run-{time.time_ns()}", task_name="train", namespace=namespace, pod_annotations=script.annotations(), **kw
    )


class Run:
    """A launcher running in a thread (the test's main thread injects the fault)."""

    def __init__(self, api, namespace: str, script: PodScript, backend: KubernetesBackend | None = None, **options) -> None:
        self.out = io.StringIO()
        self.backend = backend or KubernetesBackend(api, namespace=namespace, watch_timeout=20)
        self.launcher = Launcher(self.backend, LaunchOptions(**{"logs": "0", "delete_after_success": True, **options}), out=self.out)
        self.result: dict = {}
        self.thread = threading.Thread(target=self._run, args=(inputs(namespace, script),), daemon=True)
        self.thread.start()

    def _run(self, inp: TrainJobInputs) -> None:
        try:
            self.result["outcome"] = self.launcher.run(prepare(self.launcher.backend, inp))
        except Exception as e:  # the test asserts on it
            self.result["error"] = e

    def wait_line(self, text: str, timeout: float = 60) -> None:
        self.wait_until(lambda: text in self.out.getvalue(), f"the line {text!r}", timeout)

    def wait_until(self, check: Callable[[], bool], what: str, timeout: float = 60) -> None:
        """Wait for ``check()``; fail with ``what`` and the launcher's output if it ends or ``timeout`` passes first."""
        deadline = time.monotonic() + timeout
        while not check():
            assert self.thread.is_alive() and time.monotonic() < deadline, (what, self.result, self.out.getvalue())
            time.sleep(0.05)

    def finish(self, timeout: float = 180):
        self.thread.join(timeout)
        assert not self.thread.is_alive(), f"the launcher is still running:\n{self.out.getvalue()}"
        if "error" in self.result:
            raise self.result["error"]
        return self.result["outcome"]


COMPONENTS = ("etcd", "kube-apiserver", "kube-controller-manager", "kube-scheduler", "kwok-controller", "controllers", "podscript")


@pytest.fixture(autouse=True)
def control_plane_survives(cluster):
    """Every component still runs after the fault (a dead one would fail the tests after it)."""
    yield
    dead = []
    for name in COMPONENTS:
        pid = cluster.pid(name)
        try:
            os.kill(pid, 0)
        except (OSError, TypeError):
            dead.append(name)
    assert not dead, f"components gone after the fault: {dead}"


def test_the_api_server_killed_and_restarted_mid_run_loses_nothing(cluster, kube_client, checked):
    run = Run(kube_client, checked, PodScript(lines=LINES, line_delay=0.25))
    run.wait_line("step 03")
    cluster.restart("kube-apiserver", kill=signal.SIGKILL)
    outcome = run.finish()
    assert outcome.succeeded and outcome.reason == "AllJobsCompleted"
    assert relayed(run.out.getvalue()) == LINES
    assert outcome.metrics.final() == {"loss": pytest.approx(1 / 30, abs=1e-4)}


def test_etcd_restarted_mid_run_loses_nothing(cluster, kube_client, checked):
    run = Run(kube_client, checked, PodScript(lines=LINES, line_delay=0.25))
    run.wait_line("step 03")
    cluster.restart("etcd", kill=signal.SIGTERM)
    outcome = run.finish()
    assert outcome.succeeded
    assert relayed(run.out.getvalue()) == LINES


def test_etcd_stopped_and_continued_mid_run_loses_nothing(cluster, kube_client, checked):
    run = Run(kube_client, checked, PodScript(lines=LINES, line_delay=0.25))
    run.wait_line("step 03")
    pid = cluster.pid("etcd")
    os.kill(pid, signal.SIGSTOP)
    try:
        time.sleep(6)  # the fault lasts this long: requests hang, watches go quiet
    finally:
        os.kill(pid, signal.SIGCONT)
    outcome = run.finish()
    assert outcome.succeeded
    assert relayed(run.out.getvalue()) == LINES


def test_a_410_storm_relists_every_watch_and_the_log_is_still_exact(kube_client, cluster, api_client, checked, caplog):
    """Each API server restart starts its watch cache afresh: every watch resuming from an
    older resourceVersion is answered 410 Gone and must relist. Three restarts in one run, each
    after a watch relisted from the one before: restarts that come while every watch still
    waits to reconnect (a starting API server asks for 5 s with its 503s) would be one fault."""
    lines = [f"step {i:02d} loss={1 / (i + 1):.4f}" for i in range(80)]  # 24 s: room for three restarts on a busy machine
    rec = recording(kube_client)
    backend = KubernetesBackend(rec, namespace=checked, watch_timeout=20)
    caplog.set_level(logging.INFO, logger="kfp_trainer")
    run = Run(rec, checked, PodScript(lines=lines, line_delay=0.3), backend=backend)

    def relists() -> int:
        return sum("relisting" in r.getMessage() for r in list(caplog.records))

    run.wait_line("step 03")
    for restart in (1, 2, 3):
        assert lines[-1] not in run.out.getvalue(), f"the log ended before restart {restart}: make it longer"
        before = relists()
        cluster.restart("kube-apiserver", kill=signal.SIGKILL)
        run.wait_until(lambda before=before: relists() > before, f"a watch relisting after restart {restart}")
    outcome = run.finish()
    assert outcome.succeeded
    assert relayed(run.out.getvalue()) == lines


# ----------------------------------------------------------------------------- a slow API server


@pytest.fixture
def slow(cluster):
    """A proxy in front of the API server; set ``.delay`` for latency in both directions."""
    server = urlparse(cluster.server)
    proxy = TcpProxy(server.hostname, server.port)
    yield proxy
    proxy.close()


def test_a_slow_api_server_still_gives_an_exact_log_and_the_right_outcome(cluster, checked, slow):
    slow.delay = 0.3
    api = api_via(cluster.kubeconfig, slow.port)
    run = Run(api, checked, PodScript(lines=LINES, line_delay=0.1))
    outcome = run.finish()
    assert outcome.succeeded
    assert relayed(run.out.getvalue()) == LINES


def test_a_create_slower_than_the_clients_timeout_makes_no_duplicate(cluster, api_client, checked, slow, monkeypatch, ledger):
    """The first create's answer comes after the client gave up (read timeout); the retry is
    told the job exists and follows the one the first request made."""
    monkeypatch.setattr(lifecycle, "CREATE_TIMEOUT", (5, 1.5))
    creates: list[float] = []

    def slow_first_create(request):
        method, path, query = request
        if method == "POST" and path.endswith("/trainjobs") and "dryRun" not in query:
            creates.append(time.monotonic())
            slow.delay = 1.0 if len(creates) == 1 else 0.0  # 2 s there and back: past the 1.5 s read timeout

    proxied = api_via(cluster.kubeconfig, slow.port)
    rec = recording(proxied, before=slow_first_create)
    backend = KubernetesBackend(rec, namespace=checked, watch_timeout=20, policy=RetryPolicy(attempts=4, base=0.5))
    run = Run(rec, checked, PodScript(lines=LINES, line_delay=0.1), backend=backend)
    outcome = run.finish()
    assert outcome.succeeded, run.out.getvalue()
    assert len(creates) == 2 and (409, "POST", f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{checked}/trainjobs") in rec.refused
    assert relayed(run.out.getvalue()) == LINES
    assert f"created TrainJob {outcome.ref}" in run.out.getvalue()  # its own job, not someone else's to adopt
    ledger.wait_caught_up(checked)
    assert len(ledger.created(checked)) == 1


def test_a_cancel_through_a_slow_api_server_still_deletes_everything(kube_client, cluster, api_client, checked, slow, tmp_path):
    slow.delay = 0.4
    kubeconfig = kubeconfig_via(cluster.kubeconfig, slow.port, tmp_path / "kubeconfig")
    script = PodScript(lines=[f"step {i}" for i in range(400)], line_delay=0.25, exit_delay=float("inf"))
    import json

    out = Output(start_launch(kubeconfig, checked, "slow-cancel", "--pod-annotations", json.dumps(script.annotations())))
    out.wait_for("step 1", timeout=120)
    name = trainjob_name(out.text)
    out.proc.send_signal(signal.SIGTERM)
    assert out.finish(timeout=120) == 130, out.text
    assert f"deleting TrainJob {checked}/{name}" in out.text
    assert leftovers(kube_client, checked) == []


def test_time_limits_hold_behind_a_slow_api_server(kube_client, cluster, api_client, checked, slow):
    slow.delay = 0.4
    api = api_via(cluster.kubeconfig, slow.port)
    backend = KubernetesBackend(api, namespace=checked, watch_timeout=20)
    out = io.StringIO()
    launcher = Launcher(backend, LaunchOptions(start_timeout=4, blocker_grace=600, logs="0", blocker_check_interval=1), out=out)
    started = time.monotonic()
    with pytest.raises(TimeLimitError, match="did not start within start_timeout=4s"):
        launcher.run(prepare(launcher.backend, inputs(checked, PodScript(start_delay=float("inf")))))
    took = time.monotonic() - started
    # Everything before the create, the limit, the deletion and its wait, each request 0.8 s slower.
    assert took < 40, took
    assert leftovers(kube_client, checked) == []
