"""Faults: cancels and time limits on the real Trainer and JobSet controllers, with pods running.

Every test ends with the namespace checked (the ``checked`` fixture): no TrainJob, JobSet, Job
or pod left, and never two TrainJobs of one run and task alive at once.
"""

from __future__ import annotations

import io
import json
import signal
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from faults import Output, Seen, leftovers, relayed, start_launch, trainjob_name
from helpers import wait_for
from kubernetes import client
from testcluster import PodScript

from kfp_trainer import spec
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import TimeLimitError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

pytestmark = pytest.mark.timeout(300)
HOLD = "kfp-trainer.test/hold"
RUNNING = PodScript(lines=[f"step {i}" for i in range(400)], line_delay=0.25, exit_delay=float("inf"))


def annotations(script: PodScript) -> str:
    return json.dumps(script.annotations())


def inputs(namespace: str, script: PodScript | None = None, **kw) -> TrainJobInputs:
    return TrainJobInputs(
        run_id=f"run-{time.time_ns()}",
        task_name="train",
        namespace=namespace,
        pod_annotations=script.annotations() if script else {},
        **kw,
    )


def test_a_cancel_deletes_the_job_and_the_trainer_never_recreates_its_jobset(kube_client, cluster, api_client, checked):
    ns = checked
    out = Output(start_launch(cluster.kubeconfig, ns, "cancel", "--num-nodes", "2", "--pod-annotations", annotations(RUNNING)))
    out.wait_for("step 2")
    name = trainjob_name(out.text)
    jobsets = Seen(kube_client, ns)
    cancelled = time.monotonic()
    out.proc.send_signal(signal.SIGTERM)
    rc = out.finish()
    took = time.monotonic() - cancelled
    seen = jobsets.close()
    assert rc == 130, out.text
    assert f"CancelledError: deleting TrainJob {ns}/{name}" in out.text
    assert "error: received SIGTERM: the run was cancelled" in out.text
    assert "still present" not in out.text and "Traceback" not in out.text
    # The launcher returned only once everything was gone: nothing to wait for now.
    assert leftovers(kube_client, ns) == []
    assert_one_jobset(seen, name)
    assert took < 15, took
    print(f"cancel to exit, everything gone: {took:.2f}s")


def assert_one_jobset(seen: dict[str, str], name: str) -> None:
    """The job's one JobSet, never re-created while the TrainJob went (as under a foreground deletion's finalizer).

    Under load the Trainer controller may make it once more from its cache of the TrainJob just
    deleted (background propagation: the TrainJob is gone at once); that copy's owner is gone, and
    the garbage collector takes it at once: the callers check that nothing is left. Seen once in a
    loaded ``make test``, in none of 8 runs of the same test in a row.
    """
    assert set(seen.values()) == {name} and len(seen) <= 2, seen


@pytest.mark.parametrize(
    "script, limits, words",
    [
        (RUNNING, {"run_timeout": 2}, "ran longer than run_timeout=2s"),
        (PodScript(start_delay=float("inf")), {"start_timeout": 3, "blocker_grace": 600}, "did not start within start_timeout=3s"),
    ],
    ids=["run_timeout", "start_timeout-pods-creating"],
)
def test_a_time_limit_deletes_the_job_jobset_jobs_and_pods_before_returning(kube_client, api_client, checked, script, limits, words):
    ns = checked
    jobsets = Seen(kube_client, ns)
    out = io.StringIO()
    backend = KubernetesBackend(kube_client, namespace=ns, watch_timeout=10)
    launcher = Launcher(backend, LaunchOptions(logs="0", blocker_check_interval=1, **limits), out=out)
    inp = inputs(ns, script, num_nodes=2)
    with pytest.raises(TimeLimitError, match=words):
        launcher.run(prepare(launcher.backend, inp))
    assert leftovers(kube_client, ns) == [], out.getvalue()
    seen = jobsets.close()
    assert_one_jobset(seen, next(iter(seen.values()), ""))
    assert "still present" not in out.getvalue()


def test_a_second_sigterm_during_the_deletion_does_not_abort_it(kube_client, cluster, api_client, checked):
    ns = checked
    out = Output(start_launch(cluster.kubeconfig, ns, "twice", "--pod-annotations", annotations(RUNNING)))
    out.wait_for("step 1")
    name = trainjob_name(out.text)
    core = client.CoreV1Api(api_client)
    pod = core.list_namespaced_pod(ns, label_selector=f"jobset.sigs.k8s.io/jobset-name={name}").items[0].metadata.name
    core.patch_namespaced_pod(pod, ns, {"metadata": {"finalizers": [HOLD]}})  # the pod takes a while to go
    try:
        out.proc.send_signal(signal.SIGTERM)
        out.wait_for("deleting TrainJob")
        wait_for(lambda: core.read_namespaced_pod(pod, ns).metadata.deletion_timestamp, what="the pod being deleted")
        out.proc.send_signal(signal.SIGTERM)  # while the launcher waits for the pod to go
        time.sleep(0.5)  # the fault's moment
        assert out.proc.poll() is None, out.text  # still waiting for it
    finally:
        core.patch_namespaced_pod(pod, ns, {"metadata": {"finalizers": None}})
    rc = out.finish()
    assert rc == 130, out.text
    assert "Traceback" not in out.text and "still present" not in out.text
    assert leftovers(kube_client, ns) == []


def test_a_cancel_waits_for_a_trainjob_held_by_a_finalizer(kube_client, cluster, api_client, checked):
    ns = checked
    out = Output(start_launch(cluster.kubeconfig, ns, "held", "--pod-annotations", annotations(RUNNING)))
    out.wait_for("step 1")
    name = trainjob_name(out.text)
    custom = client.CustomObjectsApi(api_client)
    custom.patch_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name, {"metadata": {"finalizers": [HOLD]}})
    try:
        out.proc.send_signal(signal.SIGTERM)
        out.wait_for("deleting TrainJob")
        wait_for(
            lambda: custom.get_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name)["metadata"].get(
                "deletionTimestamp"
            ),
            what="the TrainJob being deleted",
        )
        time.sleep(1.0)  # the launcher waits on it meanwhile
        assert out.proc.poll() is None, out.text
    finally:
        custom.patch_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name, {"metadata": {"finalizers": None}})
    assert out.finish() == 130, out.text
    assert leftovers(kube_client, ns) == [] and "still present" not in out.text


def test_a_finalizer_that_outlasts_the_deletion_bound_is_named_with_the_remedy(kube_client, api_client, checked):
    ns = checked
    out = io.StringIO()
    backend = KubernetesBackend(kube_client, namespace=ns, watch_timeout=10)
    custom = client.CustomObjectsApi(api_client)
    held: list[str] = []

    def hold(ref):
        custom.patch_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, ref.name, {"metadata": {"finalizers": [HOLD]}})
        held.append(ref.name)

    options = LaunchOptions(run_timeout=1, delete_timeout=3, logs="none")
    try:
        with pytest.raises(TimeLimitError):
            Launcher(backend, options, out=out, on_submitted=hold).run(prepare(backend, inputs(ns, RUNNING)))
        text = out.getvalue()
        assert f"still present after 3s: TrainJob {held[0]} (terminating)" in text
        assert f"kubectl get trainjob -n {ns} {held[0]} -o jsonpath='{{.metadata.finalizers}}'" in text
    finally:
        for name in held:
            custom.patch_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name, {"metadata": {"finalizers": None}})


# ----------------------------------------------------------------------------- the sweep


def test_sigterm_swept_from_process_start_to_log_streaming_never_leaves_anything(kube_client, cluster, api_client, checked):
    """SIGTERM at 24 points from the launcher's start to well into log streaming (and later ones
    where launches run slower than calibrated), four launchers at a time, pods really running:
    each ends with exit 130 and nothing of its run left the moment it exits (or was killed
    before creating anything)."""
    ns = checked
    script = PodScript(lines=[f"step {i}" for i in range(400)], line_delay=0.25, exit_delay=float("inf"), start_delay=1.5)
    extra = ("--pod-annotations", annotations(script))
    parallel = 4

    # How long a launch takes here to create its job and to relay its first line, four at a time as in the sweep.
    def calibrate(i: int) -> tuple[float, float]:
        began = time.monotonic()
        out = Output(start_launch(cluster.kubeconfig, ns, f"calibrate-{i}", *extra))
        out.wait_for("created TrainJob")
        created = time.monotonic() - began
        out.wait_for("step 0")
        streaming = time.monotonic() - began
        out.proc.send_signal(signal.SIGTERM)
        assert out.finish() == 130, out.text
        return created, streaming

    with ThreadPoolExecutor(parallel) as pool:
        marks = list(pool.map(calibrate, range(parallel)))
    created_at = sum(m[0] for m in marks) / parallel
    streaming_at = max(m[1] for m in marks)
    points = 24

    def one(i: int, delay: float) -> tuple[float, int, str, float, list[str]]:
        run = f"sweep-{i}"
        out = Output(start_launch(cluster.kubeconfig, ns, run, *extra))
        time.sleep(delay)  # the fault's moment, not an assertion
        out.proc.send_signal(signal.SIGTERM)
        sent = time.monotonic()
        rc = out.finish()
        took = time.monotonic() - sent
        left = leftovers(kube_client, ns, selector=f"{spec.LABEL_RUN}={run}")
        return delay, rc, out.text, took, left

    def tally(results: list[tuple[float, int, str, float, list[str]]]) -> dict[str, int]:
        """Each launch's outcome checked, and counted by the phase the signal found it in."""
        phases = {"before handlers": 0, "before create": 0, "created": 0, "streaming": 0}
        for delay, rc, text, took, left in results:
            assert left == [], (delay, left, text)
            assert "Traceback" not in text, text
            if rc == -signal.SIGTERM:  # the signal's default action: before the launcher's first instruction
                assert text.strip() == "", text
                phases["before handlers"] += 1
                continue
            assert rc == 130, (delay, rc, text)
            assert "received SIGTERM: the run was cancelled" in text, text
            if relayed(text):
                phases["streaming"] += 1
            elif "created TrainJob" in text or "cancelled while submitting; deleted TrainJob" in text:
                phases["created"] += 1
            else:
                phases["before create"] += 1
            assert took < 20, (delay, took, text)
        return phases

    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(one, range(points), [streaming_at * 1.4 * i / (points - 1) for i in range(points)]))
        # Launches slower than the calibration's (a busier moment of a shared machine): rounds of
        # later signals, each 1.5 times as late as the one before, until the sweep reached the log.
        for k in range(1, 6):
            phases = tally(results)
            if phases["streaming"] >= 3 and phases["created"] + phases["streaming"] >= 6:
                break
            results += pool.map(one, range(len(results), len(results) + parallel), [streaming_at * 1.4 * 1.5**k] * parallel)
    phases = tally(results)
    print(f"created after {created_at:.1f}s, streaming after {streaming_at:.1f}s; outcomes by phase: {phases}")
    slowest = max(r[3] for r in results)
    print(f"slowest SIGTERM-to-exit (everything deleted): {slowest:.2f}s")
    assert phases["streaming"] >= 3 and phases["created"] + phases["streaming"] >= 6, phases
    assert phases["before create"] + phases["before handlers"] >= 3, phases
