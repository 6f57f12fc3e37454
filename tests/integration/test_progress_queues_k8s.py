"""The trainer's progress and the queue, end to end on the test control plane: the ``train_job``
step against the real Trainer v2.3 status server (``TrainJobStatus`` gate) and a test that
plays Kueue (creates the job suspended with the queue label, says why it waits with a Workload
event, admits it later by setting ``suspend: false``); the real Kueue: test_kueue_k8s.py.
"""

from __future__ import annotations

import contextlib
import datetime
import http.client
import io
import socket
import ssl
import threading
import time
import uuid
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import pytest
from helpers import get_jobset, get_trainjob, pods, wait_for
from kfp import dsl
from kubernetes import client
from testcluster import PodScript
from testcluster.scripting import EXIT_DELAY

from kfp_trainer import spec
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import TimeLimitError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.progress import ProgressReporter
from kfp_trainer.spec import TrainJobInputs

pytestmark = pytest.mark.timeout(240)
QUEUE = "team-gpu"
NO_QUOTA = "couldn't assign flavors to pod set node: insufficient quota for nvidia.com/gpu in flavor a100, 8 more needed"


class Step:
    """The ``train_job`` component run in a thread, as a KFP pod would run it: its log, exit and artifacts."""

    def __init__(self, api, namespace: str, tmp_path: Path, monkeypatch, **inputs: Any) -> None:
        from kfp_trainer.components import train_job

        monkeypatch.setattr(
            "kfp_trainer.backends.select_backend", lambda kind="auto", **kw: KubernetesBackend(api, namespace=namespace, watch_timeout=5)
        )
        self.out = io.StringIO()
        self.error: BaseException | None = None
        self.artifacts = {
            "output_model": self._artifact(dsl.Model, tmp_path / "model"),
            "metrics": self._artifact(dsl.Metrics, tmp_path / "metrics"),
            "report": self._artifact(dsl.HTML, tmp_path / "report.html"),
        }
        self.handle = tmp_path / "trainjob.txt"
        kwargs = dict(
            image="ghcr.io/example/trainer:1", command=["python", "train.py"], run_id=f"run-{uuid.uuid4().hex[:8]}",
            task_name="train", pipeline_name="p", backend="kubernetes", namespace=namespace, **inputs,
        )  # fmt: skip

        def run() -> None:
            try:
                with contextlib.redirect_stdout(self.out):
                    train_job.python_func(**self.artifacts, trainjob=str(self.handle), **kwargs)
            except BaseException as e:  # noqa: BLE001 - SystemExit included: the step's exit
                self.error = e

        self.thread = threading.Thread(target=run, name="train-job-step", daemon=True)
        self.thread.start()

    @staticmethod
    def _artifact(cls, path: Path):
        a = cls(uri=str(path), name=path.name, metadata={})
        a.path = str(path)
        return a

    def name(self) -> str:
        return wait_for(lambda: self.handle.exists() and self.handle.read_text().split("/")[1], 60, what="the step's TrainJob")

    def says(self, text: str, timeout: float = 60) -> None:
        wait_for(lambda: text in self.out.getvalue(), timeout, what=f"{text!r} in the step's log:\n{self.out.getvalue()}")

    def finish(self, timeout: float = 120) -> str:
        self.thread.join(timeout)
        assert not self.thread.is_alive(), "the step did not end:\n" + self.out.getvalue()
        assert self.error is None, f"{self.error!r}\n{self.out.getvalue()}"
        return Path(self.artifacts["report"].path).read_text()

    @property
    def metrics(self) -> dict[str, float]:
        return dict(self.artifacts["metrics"].metadata)


def trainer_reporter(cluster, api, namespace: str, pod, tmp_path: Path) -> ProgressReporter:
    """The trainer process of ``pod``, reporting with what the Trainer gave the pod: its URL, the CA, a
    projected token (minted here with the TokenRequest API: KWOK's fake kubelet mounts none)."""
    env = {e.name: e.value for e in next(c for c in pod.spec.containers if c.name == "node").env if e.value}
    audience = next(
        s.service_account_token.audience for v in pod.spec.volumes if v.projected for s in v.projected.sources if s.service_account_token
    )
    token = client.CoreV1Api(api).create_namespaced_service_account_token(
        pod.spec.service_account_name or "default",
        namespace,
        {"spec": {"audiences": [audience], "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": pod.metadata.name,
                                                                "uid": pod.metadata.uid}}},
    ).status.token  # fmt: skip
    (tmp_path / "token").write_text(token)
    server = cluster.status_server

    def to_loopback(url: str, body: bytes, headers: dict, ca_file: str | None, timeout: float) -> tuple[int, str]:
        # The service name resolves only in a cluster: connect to 127.0.0.1, verify the certificate for that name.
        ctx = ssl.create_default_context(cafile=ca_file)
        conn = http.client.HTTPSConnection(server["host"], server["port"], context=ctx, timeout=timeout)
        conn.sock = ctx.wrap_socket(socket.create_connection((server["host"], server["port"]), timeout=timeout),
                                    server_hostname=urlsplit(url).hostname)  # fmt: skip
        try:
            conn.request("POST", urlsplit(url).path, body=body, headers=headers)
            response = conn.getresponse()
            return response.status, response.read().decode()
        finally:
            conn.close()

    reporter_env = {
        "KUBEFLOW_TRAINER_SERVER_URL": env["KUBEFLOW_TRAINER_SERVER_URL"],
        "KUBEFLOW_TRAINER_SERVER_CA_CERT": server["ca_file"],  # the file the pod's projected volume holds
        "KUBEFLOW_TRAINER_SERVER_TOKEN": str(tmp_path / "token"),
        "RANK": "0",
    }
    return ProgressReporter(env=reporter_env, transport=to_loopback, min_interval=0)


def trainer_status(api, namespace: str, name: str) -> dict:
    return (get_trainjob(api, namespace, name) or {}).get("status", {}).get("trainerStatus") or {}


def exit_trainer(api, namespace: str, pod) -> None:
    """The trainer process ends: its scripted container exits (KWOK's stages act on the annotation)."""
    client.CoreV1Api(api).patch_namespaced_pod(pod.metadata.name, namespace, {"metadata": {"annotations": {EXIT_DELAY: "0"}}})


def test_trainer_progress_reaches_the_trainjob_the_step_log_and_the_report(
    cluster, api_client, kube_client, namespace, tmp_path, monkeypatch
):
    gates = dict(cluster.feature_gates)
    cluster.restart_controllers(feature_gates={**gates, "TrainJobStatus": True})
    try:
        step = Step(kube_client, namespace, tmp_path, monkeypatch,
                    pod_annotations=PodScript(lines=["training"], exit_delay=float("inf")).annotations())  # fmt: skip
        name = step.name()
        pod = wait_for(lambda: next(iter(pods(api_client, namespace, name, phase="Running")), None), 60, what="trainer pod running")
        reporter = trainer_reporter(cluster, api_client, namespace, pod, tmp_path)
        for done, loss in ((1, 2.5), (3, 1.75), (5, 1.5), (10, 0.625)):
            assert reporter.report_step(done, 10, {"loss": loss}, force=True), reporter.last_error
            wait_for(lambda d=done: trainer_status(api_client, namespace, name).get("progressPercentage") == d * 10, 30,
                     what=f"trainerStatus at {done * 10}%")  # fmt: skip
            if done != 5:  # 30% -> 50% moves enough for a line; 50% is asserted below, once
                step.says(f"progress {done * 10}%")
        stored = trainer_status(api_client, namespace, name)
        assert stored["metrics"] == [{"name": "loss", "value": "0.625"}] and stored["estimatedRemainingSeconds"] == 0
        exit_trainer(api_client, namespace, pod)
        page = step.finish()
    finally:
        cluster.restart_controllers(feature_gates=gates)
    lines = [line for line in step.out.getvalue().splitlines() if "] progress " in line]
    assert [line.split("] ")[1].split(",")[0].split(" (")[0] for line in lines] == [
        "progress 10%", "progress 30%", "progress 50%", "progress 100%"
    ]  # fmt: skip
    assert "(loss=2.5)" in lines[0] and lines[-1].endswith("about 0s left (loss=0.625)")
    section = page.split("Progress (reported by the trainer)")[1].split("<h2>")[0]
    assert "<polyline" in section and "<td>100%</td>" in section and "<td>loss</td><td>0.625</td>" in section
    assert "4 progress update(s) seen" in section
    assert step.metrics["loss"] == 0.625  # trainerStatus metrics join the step's metrics


def test_a_queue_wait_longer_than_start_timeout_is_not_a_failure(api_client, kube_client, namespace, tmp_path, monkeypatch):
    step = Step(kube_client, namespace, tmp_path, monkeypatch, suspend=True, queue_name=QUEUE, start_timeout=4.0,
                pod_annotations=PodScript(lines=["epoch 1 loss=0.5"]).annotations())  # fmt: skip
    name = step.name()
    step.says(f"TrainJob is queued in LocalQueue {QUEUE} (Suspended: ")
    step.says("waiting for Kueue to admit it (no queue_timeout)")
    queued_at = time.monotonic()
    # Kueue says why: an event on the job's Workload (the name Kueue derives from the TrainJob's).
    uid = get_trainjob(api_client, namespace, name)["metadata"]["uid"]
    workload_event(api_client, namespace, f"trainjob-{name}-{uid[:5]}", "Pending", NO_QUOTA)
    step.says(f"queue {QUEUE}: Pending: {NO_QUOTA}")
    assert wait_for(lambda: get_jobset(api_client, namespace, name), 30, what="the suspended JobSet")["spec"]["suspend"] is True
    # The queue holds the job past start_timeout; only then does it admit it.
    time.sleep(max(0.0, 7.0 - (time.monotonic() - queued_at)))
    workload_event(api_client, namespace, f"trainjob-{name}-{uid[:5]}", "Admitted", f"Admitted by ClusterQueue {QUEUE}-cq")
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, spec.PLURAL, name, {"spec": {"suspend": False}}
    )
    page = step.finish()
    text = step.out.getvalue()
    assert "admitted after" in text and f"in {QUEUE}" in text and "epoch 1 loss=0.5" in text
    assert step.metrics["queued_seconds"] >= 7.0 > 4.0  # longer than start_timeout, and still a success
    assert 0 < step.metrics["starting_seconds"] < 4.0 and step.metrics["running_seconds"] >= 0
    assert f"<td>Kueue LocalQueue</td><td>{QUEUE}</td>" in page and "<h2>Time</h2>" in page


def test_queue_timeout_deletes_a_job_the_queue_never_admits(kube_client, api_client, namespace):
    backend = KubernetesBackend(kube_client, namespace=namespace, watch_timeout=5)
    out = io.StringIO()
    inp = TrainJobInputs(run_id=f"run-{uuid.uuid4().hex[:8]}", task_name="train", namespace=namespace, suspend=True, queue_name=QUEUE)
    launcher = Launcher(backend, LaunchOptions(queue_timeout=3, start_timeout=3600, blocker_check_interval=1.0), out=out)
    with pytest.raises(TimeLimitError, match=f"waited in queue {QUEUE} longer than queue_timeout=3s") as info:
        launcher.run(prepare(launcher.backend, inp))
    assert info.value.reason == "QueueTimeout"
    name = prepare(launcher.backend, inp).manifest["metadata"]["name"]
    assert get_trainjob(api_client, namespace, name) is None and get_jobset(api_client, namespace, name) is None
    assert f"deleting TrainJob {namespace}/{name}" in out.getvalue()


def workload_event(api, namespace: str, workload: str, reason: str, message: str) -> None:
    """An event on a Kueue Workload, as Kueue's scheduler records it."""
    now = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")
    client.CoreV1Api(api).create_namespaced_event(
        namespace,
        {
            "metadata": {"name": f"{workload}.{uuid.uuid4().hex[:10]}"},
            "involvedObject": {"kind": "Workload", "apiVersion": "kueue.x-k8s.io/v1beta2", "name": workload, "namespace": namespace},
            "reason": reason,
            "message": message,
            "type": "Warning" if reason == "Pending" else "Normal",
            "source": {"component": "kueue-admission"},
            "firstTimestamp": now,
            "lastTimestamp": now,
            "count": 1,
        },
    )
