"""Faults: a TrainJob deleted by someone else while the step follows it, on the real Trainer and JobSet
controllers, with pods running (KWOK plays them from a ``PodScript``).

Someone runs ``kubectl delete trainjob <name> --cascade=foreground`` (or orphan, or background)
while the step relays the trainer's log. The step ends, failed (exit 1, ``DeletedWhileRunning``),
within a few seconds; it relays each line once, even while the controllers re-make the JobSet of
a job held by the foreground-deletion finalizer; and it leaves the deletion to its owner: the
launcher's own client sends no DELETE, PATCH or PUT (counted on that client). A retry of the step
never adopts the job being deleted. Each test finishes the deletion itself (as the owner would),
then its namespace is checked (the ``checked`` fixture): nothing left, no duplicate TrainJobs.
"""

from __future__ import annotations

import io
import json
import threading
import time

import pytest
from faults import Output, Seen, start_launch, trainjob_name
from helpers import get_trainjob, wait_for
from k8s_objects import recording
from kubernetes import client
from testcluster import PodScript

from kfp_trainer import spec
from kfp_trainer.backends.deletion import DELETED_WHILE_RUNNING
from kfp_trainer.backends.kube.api import RetryPolicy
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import DeletionTimeoutError, JobFailedError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

pytestmark = pytest.mark.timeout(240)
LINES = ["line 0", "line 1", "line 2"]
SCRIPT = PodScript(lines=LINES, line_delay=0.1, exit_delay=float("inf"))  # three lines, then runs until deleted
HOLD = "kfp-trainer.test/hold"
BOUND = 10.0  # seconds from the DELETE request to the step's end (the launcher sees it within a heartbeat)
REMADE_WINDOW = 4.0  # seconds to look on after the step ended: the controllers re-make a JobSet every 1-3 s
WORDS = {
    "Foreground": "with foreground propagation",
    "Orphan": "with orphan propagation",
    "Background": "no longer exists",
}


def inputs(namespace: str) -> TrainJobInputs:
    return TrainJobInputs(run_id=f"run-{time.time_ns()}", task_name="train", namespace=namespace, pod_annotations=SCRIPT.annotations())


def delete_trainjob(api_client, ns: str, name: str, propagation: str) -> None:
    """What ``kubectl delete trainjob -n ns name --cascade=<propagation>`` sends."""
    client.CustomObjectsApi(api_client).delete_namespaced_custom_object(
        spec.GROUP, spec.VERSION, ns, spec.PLURAL, name, propagation_policy=propagation
    )


def finish_deletion(api_client, ns: str, name: str) -> None:
    """Finish the deletion as its owner would: background propagation (the foreground finalizer goes), the
    orphaned JobSet removed; a finalizer still holding the TrainJob after that is taken off."""
    custom = client.CustomObjectsApi(api_client)
    try:
        delete_trainjob(api_client, ns, name, "Background")
    except client.ApiException as e:
        if e.status != 404:
            raise
    try:
        wait_for(lambda: get_trainjob(api_client, ns, name) is None, 10, what="the TrainJob gone")
    except AssertionError:
        custom.patch_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name, {"metadata": {"finalizers": None}})
    try:
        custom.delete_namespaced_custom_object("jobset.x-k8s.io", "v1alpha2", ns, "jobsets", name, propagation_policy="Background")
    except client.ApiException as e:
        if e.status != 404:
            raise


def writes(rec) -> list[tuple[str, str]]:
    """The requests of the launcher's client that change something, other than creating its TrainJob."""
    return [
        (m, p)
        for m, p, q in rec.requests
        if q.get("dryRun") != "All" and (m in ("DELETE", "PATCH", "PUT") or (m == "POST" and not p.endswith("/trainjobs")))
    ]


def counts(text: str) -> list[int]:
    """How many times each of the script's lines appears in ``text``."""
    lines = text.splitlines()
    return [lines.count(line) for line in LINES]


def start(kube_client, ns: str) -> tuple[threading.Thread, dict, io.StringIO, object, str]:
    """The launcher, following a job whose pod printed its lines, in a thread; the DELETE may come."""
    rec = recording(kube_client)
    backend = KubernetesBackend(rec, namespace=ns, watch_timeout=10)
    out = io.StringIO()
    inp = inputs(ns)
    result: dict = {"inputs": inp}

    def run() -> None:
        try:
            result["outcome"] = Launcher(backend, LaunchOptions(logs="0"), out=out).run(prepare(backend, inp))
        except Exception as e:
            result["error"] = e

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    wait_for(lambda: counts(out.getvalue()) == [1, 1, 1], 60, what="the script's lines relayed")
    return thread, result, out, rec, spec.render(inp)["metadata"]["name"]


@pytest.mark.parametrize("propagation", list(WORDS))
def test_a_job_deleted_by_someone_else_fails_the_step_at_once_each_line_relayed_once_deletion_left_alone(
    kube_client, api_client, checked, propagation
):
    ns = checked
    jobsets = Seen(kube_client, ns)
    thread, result, out, rec, name = start(kube_client, ns)
    try:
        deleted = time.monotonic()
        delete_trainjob(api_client, ns, name, propagation)
        thread.join(60)
        took = time.monotonic() - deleted
        assert not thread.is_alive(), out.getvalue()
        error = result.get("error")
        assert isinstance(error, JobFailedError), (result, out.getvalue())
        assert error.exit_code == 1 and error.reason == DELETED_WHILE_RUNNING
        assert f"TrainJob {ns}/{name} was deleted while running: " in str(error) and WORDS[propagation] in str(error)
        assert "not by this step" in str(error)
        assert took < BOUND, took
        time.sleep(REMADE_WINDOW)  # JobSets re-made meanwhile run the script again: none of it is relayed
        assert counts(out.getvalue()) == [1, 1, 1], out.getvalue()
        assert writes(rec) == [], writes(rec)
    finally:
        made = jobsets.close()
        finish_deletion(api_client, ns, name)
    print(f"{propagation}: DELETE to the step's end {took:.2f}s; JobSets made meanwhile: {len(made)}")


def test_a_retry_never_adopts_the_job_being_deleted_and_creates_nothing_over_it(kube_client, api_client, checked, ledger):
    """The step failed (the job deleted with foreground propagation, and held: here by a finalizer of
    someone's, as the re-made JobSets hold it for a while); its retry renders the same name. It does not
    adopt, delete or patch that job: it waits for it to go, bounded, then fails saying so (exit 3: retry
    once it is gone) and creates nothing."""
    ns = checked
    thread, result, out, _, name = start(kube_client, ns)
    inp = result["inputs"]
    custom = client.CustomObjectsApi(api_client)
    custom.patch_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name, {"metadata": {"finalizers": [HOLD]}})
    try:
        delete_trainjob(api_client, ns, name, "Foreground")
        thread.join(60)
        assert isinstance(result.get("error"), JobFailedError), (result, out.getvalue())
        first = get_trainjob(api_client, ns, name)
        assert first is not None and first["metadata"].get("deletionTimestamp"), "the foreground deletion ended on its own"

        rec = recording(kube_client)
        backend = KubernetesBackend(rec, namespace=ns, watch_timeout=10, replace_timeout=3, policy=RetryPolicy(attempts=3, base=0.2))
        retry_out = io.StringIO()
        with pytest.raises(DeletionTimeoutError) as info:
            Launcher(backend, LaunchOptions(logs="0"), out=retry_out).run(prepare(backend, inp))
        assert info.value.exit_code == 3
        assert f"TrainJob {ns}/{name} of an earlier try was still being deleted after 3s" in str(info.value)
        assert "with foreground propagation" in str(info.value) and f"finalizers {HOLD} hold it" in str(info.value)
        assert "not creating another one over it" in str(info.value)
        # Only reads (and the dry-run create that tells the Trainer API version).
        assert [(m, p) for m, p, q in rec.requests if m != "GET" and q.get("dryRun") != "All"] == [], rec.requests
        assert counts(retry_out.getvalue()) == [0, 0, 0]
        assert [e.uid for e in ledger.created(ns)] == [first["metadata"]["uid"]]
    finally:
        custom.patch_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name, {"metadata": {"finalizers": None}})
        finish_deletion(api_client, ns, name)


def test_the_step_exits_1_saying_why(cluster, api_client, checked):
    ns = checked
    out = Output(start_launch(cluster.kubeconfig, ns, f"run-{time.time_ns()}", "--pod-annotations", json.dumps(SCRIPT.annotations())))
    name = ""
    try:
        out.wait_for(LINES[-1])
        name = trainjob_name(out.text)
        deleted = time.monotonic()
        delete_trainjob(api_client, ns, name, "Foreground")
        rc = out.finish(60)
        took = time.monotonic() - deleted
        assert rc == 1, out.text
        assert f"error: TrainJob {ns}/{name} was deleted while running: it is being deleted with foreground propagation" in out.text
        assert "Traceback" not in out.text and counts(out.text) == [1, 1, 1], out.text
        assert took < BOUND, took
    finally:
        if out.proc.poll() is None:
            out.proc.kill()
        if name:
            finish_deletion(api_client, ns, name)
    print(f"kfp-trainer launch: DELETE (foreground) to exit 1: {took:.2f}s")
