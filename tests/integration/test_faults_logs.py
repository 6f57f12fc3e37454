"""Faults of the long and quiet parts of a run: log streams that end, stall or are forbidden,
watches that reconnect for hours, and a cancel that lands while a failure is being explained.
"""

from __future__ import annotations

import copy
import io
import logging
import os
import signal
import threading
import time
import uuid
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from faults import api_via, leftovers, relayed
from helpers import condition, get_trainjob, wait_for
from k8s_objects import Recording, recording
from kubernetes import client
from testcluster import PodScript

from kfp_trainer import spec
from kfp_trainer.backends.kube.api import RetryPolicy
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.cancel import stopping
from kfp_trainer.errors import CancelledError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs
from tests.tcp_proxy import TcpProxy

pytestmark = pytest.mark.timeout(240)
RBAC = Path(__file__).resolve().parents[2] / "deploy" / "rbac.yaml"
LINES = [f"epoch {i} loss={1 / (i + 1):.3f}" for i in range(8)]


def inputs(namespace: str, script: PodScript, **kw) -> TrainJobInputs:
    return TrainJobInputs(
        run_id=f"run-{time.time_ns()}", task_name="train", namespace=namespace, pod_annotations=script.annotations(), **kw
    )


def log_requests(rec) -> list[dict]:
    return [q for m, p, q in rec.requests if m == "GET" and p.endswith("/log")]


def test_a_stream_the_server_does_not_end_after_the_container_exits_is_cut_and_read_once(kube_client, cluster, api_client, checked):
    """The kubelet front is frozen after the last line: the follow stream stays open while the pod
    exits and the TrainJob completes. The launcher cuts it and reads the rest once."""
    rec = recording(kube_client)
    front = cluster.pid("logfront")
    frozen = threading.Event()

    class Tap(io.StringIO):
        def write(self, text: str) -> int:
            n = super().write(text)
            if LINES[-1] in text.splitlines() and not frozen.is_set():
                os.kill(front, signal.SIGSTOP)  # the server can no longer end the stream
                frozen.set()
            return n

    out = Tap()
    backend = KubernetesBackend(rec, namespace=checked, watch_timeout=20)
    launcher = Launcher(backend, LaunchOptions(logs="0", delete_after_success=True), out=out)
    result: dict = {}
    inp = inputs(checked, PodScript(lines=LINES, line_delay=0.2, exit_delay=1.0))
    name = spec.render(inp)["metadata"]["name"]
    thread = threading.Thread(target=lambda: result.update(outcome=launcher.run(prepare(launcher.backend, inp))), daemon=True)
    thread.start()
    try:
        assert frozen.wait(60), out.getvalue()
        wait_for(lambda: condition(get_trainjob(api_client, checked, name), "Complete"), 60, what="the TrainJob complete")
        time.sleep(1.0)  # the launcher has seen it by now and is cutting the stream
    finally:
        os.kill(front, signal.SIGCONT)
    thread.join(60)
    assert result["outcome"].succeeded
    assert relayed(out.getvalue()) == LINES
    logs = log_requests(rec)
    assert logs[0].get("follow") is True or str(logs[0].get("follow")).lower() == "true", logs
    assert any("follow" not in q and "sinceTime" in q for q in logs[1:]), logs  # the rest, read once from the cursor


def test_a_stalled_log_stream_resumes_from_its_cursor_without_loss_or_repeats(kube_client, cluster, api_client, checked):
    rec = recording(kube_client)
    backend = KubernetesBackend(rec, namespace=checked, watch_timeout=20, log_read_timeout=1.5)
    out = io.StringIO()
    lines = LINES[:4]
    inp = inputs(checked, PodScript(lines=lines, line_delay=3.0))
    outcome = Launcher(backend, LaunchOptions(logs="0", delete_after_success=True), out=out).run(prepare(backend, inp))
    assert outcome.succeeded
    assert relayed(out.getvalue()) == lines
    resumed = [q for q in log_requests(rec) if "sinceTime" in q]
    assert len(resumed) >= 2, log_requests(rec)  # one per quiet gap longer than the read timeout


def runner_without_log_access(api_client, kube_client, namespace: str) -> tuple[Recording, list]:
    """deploy/rbac.yaml in ``namespace`` with the ``pods/log`` rule taken out; a client impersonating the runner."""
    rbac = client.RbacAuthorizationV1Api(api_client)
    client.CoreV1Api(api_client).create_namespaced_service_account(namespace, {"metadata": {"name": "pipeline-runner"}})
    suffix = uuid.uuid4().hex[:8]
    cleanup = []
    for doc in (copy.deepcopy(d) for d in yaml.safe_load_all(RBAC.read_text()) if d):
        doc["metadata"].pop("namespace", None)
        for subject in doc.get("subjects") or []:
            subject["namespace"] = namespace
        if doc["kind"] == "Role":
            doc["rules"] = [r for r in doc["rules"] if r["resources"] != ["pods/log"]]
            rbac.create_namespaced_role(namespace, doc)
        elif doc["kind"] == "RoleBinding":
            rbac.create_namespaced_role_binding(namespace, doc)
        elif doc["kind"] == "ClusterRole":
            doc["metadata"]["name"] += f"-{suffix}"
            rbac.create_cluster_role(doc)
            cleanup.append((rbac.delete_cluster_role, doc["metadata"]["name"]))
        else:
            doc["metadata"]["name"] += f"-{suffix}"
            doc["roleRef"]["name"] += f"-{suffix}"
            rbac.create_cluster_role_binding(doc)
            cleanup.append((rbac.delete_cluster_role_binding, doc["metadata"]["name"]))
    runner = recording(kube_client)
    runner.set_default_header("Impersonate-User", f"system:serviceaccount:{namespace}:pipeline-runner")
    return runner, cleanup


def test_a_forbidden_log_is_reported_once_and_the_job_still_followed_to_its_end(api_client, kube_client, checked, caplog):
    runner, cleanup = runner_without_log_access(api_client, kube_client, checked)
    caplog.set_level(logging.WARNING, logger="kfp_trainer")
    try:
        backend = KubernetesBackend(runner, namespace=checked, watch_timeout=20)
        out = io.StringIO()
        started = time.monotonic()
        inp = inputs(checked, PodScript(lines=LINES, line_delay=0.3))
        outcome = Launcher(backend, LaunchOptions(logs="0", delete_after_success=True), out=out).run(prepare(backend, inp))
        took = time.monotonic() - started
    finally:
        for delete, name in cleanup:
            delete(name)
    assert outcome.succeeded and relayed(out.getvalue()) == []
    warnings = [r.getMessage() for r in caplog.records if "pods/log" in r.getMessage()]
    assert len(warnings) == 1 and "lacks the permission get on pods/log" in warnings[0], warnings
    assert len([r for r in runner.refused if r[0] == 403 and r[2].endswith("/log")]) == 1, runner.refused
    assert took < 60


def test_a_cancel_while_a_failure_is_being_explained_is_a_cancel(kube_client, api_client, checked):
    """SIGTERM lands on the diagnosis's request for the namespace's events (the only unfiltered one)."""

    def sigterm_on_diagnosis(request):
        method, path, query = request
        if method == "GET" and path.endswith("/events") and not query:
            os.kill(os.getpid(), signal.SIGTERM)

    rec = recording(kube_client, before=sigterm_on_diagnosis)
    backend = KubernetesBackend(rec, namespace=checked, watch_timeout=20)
    out = io.StringIO()
    inp = inputs(checked, PodScript(lines=["NaN loss"], exit_code=1, crash_backoff=0.1))
    with pytest.raises(CancelledError) as info, stopping() as stop:  # as the entry points do
        Launcher(backend, LaunchOptions(logs="none"), out=out, stop=stop).run(prepare(backend, inp, stop=stop))
    assert info.value.exit_code == 130
    assert "CancelledError: deleting TrainJob" in out.getvalue()
    assert leftovers(kube_client, checked) == []


def test_a_quiet_job_outlasts_many_routine_reconnects(cluster, api_client, checked):
    """Every watch is ended by the server each second and every connection cut every 1.5 s for
    20 s of silence; a watch gives up only after 3 failures in a row, never on their sum."""
    server = urlparse(cluster.server)
    proxy = TcpProxy(server.hostname, server.port)
    cutting = threading.Event()

    def cutter():
        while not cutting.wait(1.5):
            proxy.sever()

    threading.Thread(target=cutter, daemon=True).start()
    try:
        api = api_via(cluster.kubeconfig, proxy.port)
        backend = KubernetesBackend(api, namespace=checked, watch_timeout=1, policy=RetryPolicy(attempts=3, base=0.2))
        out = io.StringIO()
        inp = inputs(checked, PodScript(lines=["started"], exit_delay=20))
        outcome = Launcher(backend, LaunchOptions(logs="0", delete_after_success=True), out=out).run(prepare(backend, inp))
    finally:
        cutting.set()
        proxy.close()
    assert outcome.succeeded, out.getvalue()
    assert relayed(out.getvalue()) == ["started"]
    assert proxy.severed >= 10
