"""Faults: retries, replacements, concurrent launchers and jobs that go or never start, on the
real Trainer and JobSet controllers. One live TrainJob per run and task, nothing left behind.
"""

from __future__ import annotations

import io
import json
import signal
import threading
import time

import pytest
from faults import Output, leftovers, relayed, start_launch, trainjob_name
from kubernetes import client
from testcluster import PodScript

from kfp_trainer import spec
from kfp_trainer.backends.kube.api import RetryPolicy
from kfp_trainer.backends.kube.client import Client
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import DeletionTimeoutError, JobFailedError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

pytestmark = pytest.mark.timeout(300)
HOLD = "kfp-trainer.test/hold"
LINES = [f"epoch {i} loss={1 / (i + 1):.3f}" for i in range(12)]
FORE = PodScript(lines=[f"step {i}" for i in range(400)], line_delay=0.25, exit_delay=float("inf"))


def script_args(script: PodScript) -> tuple[str, str]:
    return "--pod-annotations", json.dumps(script.annotations())


def inputs(namespace: str, script: PodScript | None = None, run: str | None = None, **kw) -> TrainJobInputs:
    return TrainJobInputs(
        run_id=run or f"run-{time.time_ns()}",
        task_name="train",
        namespace=namespace,
        pod_annotations=script.annotations() if script else {},
        **kw,
    )


def custom(api):
    return client.CustomObjectsApi(api)


def test_a_killed_launchers_identical_rerun_adopts_the_same_job_and_relays_its_whole_log(cluster, api_client, checked, ledger):
    ns = checked
    script = PodScript(lines=LINES, line_delay=0.4)
    first = Output(start_launch(cluster.kubeconfig, ns, "r", *script_args(script), "--delete-after-success"))
    first.wait_for("epoch 1 ")
    name = trainjob_name(first.text)
    uid = custom(api_client).get_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name)["metadata"]["uid"]
    first.proc.send_signal(signal.SIGKILL)
    assert first.finish() == -signal.SIGKILL
    rerun = Output(start_launch(cluster.kubeconfig, ns, "r", *script_args(script), "--delete-after-success"))
    assert rerun.finish() == 0, rerun.text
    assert f"adopted existing TrainJob {ns}/{name}" in rerun.text
    assert relayed(rerun.text) == LINES  # from the container's start: nothing lost, nothing twice
    assert json.loads(rerun.text.splitlines()[-1])["metrics"] == {"loss": pytest.approx(1 / 12, abs=1e-3)}
    ledger.wait_caught_up(ns)
    assert [e.uid for e in ledger.created(ns)] == [uid]


def test_a_retry_with_other_inputs_replaces_the_stale_job_and_says_so(cluster, api_client, checked):
    ns = checked
    first = Output(start_launch(cluster.kubeconfig, ns, "r", "--env", "LR=0.1", *script_args(FORE)))
    first.wait_for("step 1")
    stale = trainjob_name(first.text)
    first.proc.send_signal(signal.SIGKILL)  # the step's pod died; KFP retries the task with a changed input
    first.finish()
    retry = Output(
        start_launch(cluster.kubeconfig, ns, "r", "--env", "LR=0.2", *script_args(PodScript(lines=LINES)), "--delete-after-success")
    )
    assert retry.finish() == 0, retry.text
    fresh = trainjob_name(retry.text)
    assert fresh != stale
    assert f"replaced stale TrainJob {ns}/{stale} of an earlier try of this task" in retry.text
    assert relayed(retry.text) == LINES
    # The stale one and everything under it went before the new one was created (the ledger checks the overlap).


def test_a_retry_with_other_inputs_and_an_explicit_name_replaces_the_stale_job_of_that_name(cluster, api_client, checked, ledger):
    ns = checked
    first = Output(start_launch(cluster.kubeconfig, ns, "r", "--name", "fixed", "--env", "LR=0.1", *script_args(FORE)))
    first.wait_for("step 1")
    stale = custom(api_client).get_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, "fixed")["metadata"]["uid"]
    first.proc.send_signal(signal.SIGKILL)  # the step's pod died; its job runs on with no launcher
    first.finish()
    changed = ("--env", "LR=0.2", *script_args(PodScript(lines=LINES)), "--delete-after-success")
    retry = Output(start_launch(cluster.kubeconfig, ns, "r", "--name", "fixed", *changed))
    assert retry.finish() == 0, retry.text
    assert f"replaced stale TrainJob {ns}/fixed of an earlier try of this task" in retry.text
    assert f"created TrainJob {ns}/fixed" in retry.text
    assert relayed(retry.text) == LINES  # the new job's pods, not the stale one's
    ledger.wait_caught_up(ns)
    assert [e.uid for e in ledger.created(ns)][0] == stale and len(ledger.created(ns)) == 2
    # Nothing of either try is left, and the two were never alive at once (the checked fixture).


def test_an_explicitly_named_earlier_try_whose_launcher_runs_is_left_alone_and_the_retry_fails_clearly(cluster, api_client, checked):
    ns = checked
    first = Output(start_launch(cluster.kubeconfig, ns, "r", "--name", "fixed", "--env", "LR=0.1", *script_args(FORE)))
    first.wait_for("step 1")
    try:
        uid = custom(api_client).get_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, "fixed")["metadata"]["uid"]
        other = Output(start_launch(cluster.kubeconfig, ns, "r", "--name", "fixed", "--env", "LR=0.2", *script_args(FORE)))
        assert other.finish() == 2, other.text
        assert f"TrainJob {ns}/fixed belongs to this run and task with other inputs" in other.text
        assert "still runs it; it is left alone" in other.text and "Traceback" not in other.text
        assert custom(api_client).get_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, "fixed")["metadata"]["uid"] == uid
        first.wait_for("step 3")  # still followed by its own launcher
    finally:
        first.proc.send_signal(signal.SIGTERM)  # its cancel deletes its job
        assert first.finish() == 130, first.text


def test_fifty_concurrent_launchers_of_one_task_make_one_job(api_client, kube_client, checked):
    ns = checked
    inp = inputs(ns, PodScript(lines=LINES, line_delay=0.1), run="r50")
    results: list[tuple[bool, str, str]] = []
    lock = threading.Lock()

    def one() -> None:
        api = Client(kube_client.credentials)  # a pool of its own, as a launcher process has
        out = io.StringIO()
        backend = KubernetesBackend(api, namespace=ns, watch_timeout=30)
        try:
            outcome = Launcher(backend, LaunchOptions(logs="0"), out=out).run(prepare(backend, inp))
            with lock:
                results.append((outcome.succeeded, outcome.ref.uid, out.getvalue()))
        finally:
            api.close()

    threads = [threading.Thread(target=one) for _ in range(50)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(240)
    assert len(results) == 50
    assert all(ok for ok, _, _ in results)
    assert len({uid for _, uid, _ in results}) == 1
    assert sum("created TrainJob" in text for _, _, text in results) == 1
    assert sum("adopted existing TrainJob" in text for _, _, text in results) == 49
    assert all(relayed(text) == LINES for _, _, text in results)
    name = spec.render(inp)["metadata"]["name"]
    custom(api_client).delete_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name, propagation_policy="Background")


def test_a_job_deleted_by_someone_else_fails_the_step_and_leaves_nothing(cluster, api_client, checked):
    ns = checked
    out = Output(start_launch(cluster.kubeconfig, ns, "r", *script_args(FORE)))
    out.wait_for("step 1")
    name = trainjob_name(out.text)
    custom(api_client).delete_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name)  # kubectl delete
    assert out.finish() == 1, out.text
    assert f"error: TrainJob {ns}/{name} was deleted while running: the TrainJob no longer exists (not by this step" in out.text
    assert "Traceback" not in out.text


def test_a_runtime_deleted_while_its_job_runs_does_not_strand_the_launcher(kube_client, api_client, checked):
    ns = checked
    rt = custom(api_client).get_cluster_custom_object(spec.GROUP, spec.VERSION, "clustertrainingruntimes", "torch-distributed")
    body = {
        "apiVersion": rt["apiVersion"],
        "kind": "TrainingRuntime",
        "metadata": {"name": "doomed", "namespace": ns, "labels": rt["metadata"].get("labels") or {}},
        "spec": rt["spec"],
    }
    custom(api_client).create_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, "trainingruntimes", body)
    out = io.StringIO()
    backend = KubernetesBackend(kube_client, namespace=ns, watch_timeout=10)

    def delete_runtime(ref):
        custom(api_client).delete_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, "trainingruntimes", "doomed")

    launcher = Launcher(backend, LaunchOptions(logs="0", delete_after_success=True), out=out, on_submitted=delete_runtime)
    inp = inputs(ns, PodScript(lines=LINES, line_delay=0.2), runtime="doomed", runtime_kind="TrainingRuntime")
    outcome = launcher.run(prepare(backend, inp))
    assert outcome.succeeded, out.getvalue()
    assert relayed(out.getvalue()) == LINES
    assert leftovers(kube_client, ns) == []


def test_a_deleted_runtime_is_named_before_anything_is_created(cluster, api_client, checked):
    ns = checked
    out = Output(start_launch(cluster.kubeconfig, ns, "r", "--runtime", "gone-runtime"))
    assert out.finish() == 2
    assert "runtime: ClusterTrainingRuntime 'gone-runtime' does not exist. Available: ClusterTrainingRuntime/" in out.text


def test_a_job_that_never_starts_is_deleted_at_its_start_timeout(kube_client, cluster, api_client, checked):
    ns = checked
    out = Output(start_launch(cluster.kubeconfig, ns, "r", "--start-timeout", "4", *script_args(PodScript(start_delay=float("inf")))))
    assert out.finish() == 1, out.text
    assert "did not start within start_timeout=4s" in out.text
    assert leftovers(kube_client, ns) == []


# ----------------------------------------------------------------------------- replacing a failed job


def team_runtime(api_client, ns: str, script: PodScript, name: str = "flaky") -> None:
    """A TrainingRuntime like torch-distributed whose pods act out ``script`` (created or updated)."""
    co = custom(api_client)
    try:
        rt = co.get_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, "trainingruntimes", name)
    except client.ApiException:
        base = co.get_cluster_custom_object(spec.GROUP, spec.VERSION, "clustertrainingruntimes", "torch-distributed")
        rt = {
            "apiVersion": base["apiVersion"],
            "kind": "TrainingRuntime",
            "metadata": {"name": name, "namespace": ns, "labels": base["metadata"].get("labels") or {}},
            "spec": base["spec"],
        }
    node = next(j for j in rt["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")
    node["template"]["spec"]["template"].setdefault("metadata", {})["annotations"] = script.annotations()
    if "resourceVersion" in rt["metadata"]:
        co.replace_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, "trainingruntimes", name, rt)
    else:
        co.create_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, "trainingruntimes", rt)


def failed_job(api_client, kube_client, ns: str) -> tuple[TrainJobInputs, dict]:
    """A TrainJob of a team runtime that failed (its pods exit 1); the runtime then succeeds."""
    team_runtime(api_client, ns, PodScript(lines=["boom"], exit_code=1, crash_backoff=0.1))
    inp = inputs(ns, runtime="flaky", runtime_kind="TrainingRuntime")
    backend = KubernetesBackend(kube_client, namespace=ns, watch_timeout=10)
    with pytest.raises(JobFailedError):
        Launcher(backend, LaunchOptions(logs="none"), out=io.StringIO()).run(prepare(backend, inp))
    team_runtime(api_client, ns, PodScript(lines=LINES))
    name = spec.render(inp)["metadata"]["name"]
    return inp, custom(api_client).get_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name)


def hold(api_client, ns: str, name: str, finalizers: list[str] | None) -> None:
    custom(api_client).patch_namespaced_custom_object(
        spec.GROUP, spec.VERSION, ns, spec.PLURAL, name, {"metadata": {"finalizers": finalizers}}
    )


def trainjob_names(api_client, ns: str) -> list[str]:
    return [
        j["metadata"]["name"] for j in custom(api_client).list_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL)["items"]
    ]


def test_a_failed_job_that_does_not_go_is_not_replaced_over_and_nothing_is_created(kube_client, api_client, checked):
    ns = checked
    inp, old = failed_job(api_client, kube_client, ns)
    name = old["metadata"]["name"]
    hold(api_client, ns, name, [HOLD])
    backend = KubernetesBackend(kube_client, namespace=ns, watch_timeout=10, replace_timeout=3, policy=RetryPolicy(attempts=3, base=0.2))
    try:
        started = time.monotonic()
        with pytest.raises(DeletionTimeoutError) as info:
            Launcher(backend, LaunchOptions(logs="none"), out=io.StringIO()).run(prepare(backend, inp))
        assert time.monotonic() - started < 15
        assert info.value.exit_code == 3
        assert "still being deleted after 3s" in str(info.value) and "not creating another one over it" in str(info.value)
        assert trainjob_names(api_client, ns) == [name]
    finally:
        hold(api_client, ns, name, None)


def test_a_failed_job_that_takes_a_while_to_go_is_replaced_once_it_is_gone(kube_client, api_client, checked):
    ns = checked
    inp, old = failed_job(api_client, kube_client, ns)
    name = old["metadata"]["name"]
    hold(api_client, ns, name, [HOLD])
    release = threading.Timer(2.0, hold, (api_client, ns, name, None))
    release.start()
    out = io.StringIO()
    started = time.monotonic()
    backend = KubernetesBackend(kube_client, namespace=ns, watch_timeout=10)
    outcome = Launcher(backend, LaunchOptions(logs="0", delete_after_success=True), out=out).run(prepare(backend, inp))
    release.join()
    assert outcome.replaced and outcome.succeeded and outcome.ref.uid != old["metadata"]["uid"], out.getvalue()
    assert time.monotonic() - started >= 1.5
    assert f"replaced failed TrainJob {ns}/{name}" in out.getvalue()
    assert relayed(out.getvalue()) == LINES, out.getvalue()


def test_a_job_already_being_deleted_is_waited_for_never_adopted(kube_client, api_client, checked):
    ns = checked
    inp, old = failed_job(api_client, kube_client, ns)
    name = old["metadata"]["name"]
    hold(api_client, ns, name, [HOLD])
    custom(api_client).delete_namespaced_custom_object(spec.GROUP, spec.VERSION, ns, spec.PLURAL, name)  # someone else deletes it
    release = threading.Timer(2.0, hold, (api_client, ns, name, None))
    release.start()
    out = io.StringIO()
    backend = KubernetesBackend(kube_client, namespace=ns, watch_timeout=10)
    outcome = Launcher(backend, LaunchOptions(logs="0", delete_after_success=True), out=out).run(prepare(backend, inp))
    release.join()
    assert outcome.succeeded and not outcome.adopted and outcome.ref.uid != old["metadata"]["uid"], out.getvalue()
    assert f"TrainJob {ns}/{name} of an earlier try is being deleted; waited for it to go before creating a new one" in out.getvalue()
    assert "deleted while running" not in out.getvalue()
    assert relayed(out.getvalue()) == LINES


def test_ten_deletions_wait_with_watches_not_polls(kube_client, api_client, checked):
    """Ten running jobs deleted at once: each waits for its TrainJob, JobSet, Jobs and pods with
    one list and one watch per kind, never by GETting the objects in a loop."""
    from concurrent.futures import ThreadPoolExecutor

    from k8s_objects import recording

    rec = recording(kube_client)
    backend = KubernetesBackend(rec, namespace=checked, watch_timeout=20)
    refs = []
    for i in range(10):
        inp = inputs(checked, FORE, run=f"r{i}")
        refs.append(backend.submit(spec.render(inp, runtime_jobs=["node"])).ref)
    core = client.CoreV1Api(api_client)
    wait_for_running = [r.name for r in refs]
    deadline = time.monotonic() + 90
    while wait_for_running and time.monotonic() < deadline:
        running = {
            p.metadata.labels.get("jobset.sigs.k8s.io/jobset-name")
            for p in core.list_namespaced_pod(checked).items
            if p.status.phase == "Running"
        }
        wait_for_running = [n for n in wait_for_running if n not in running]
        time.sleep(0.2)
    assert not wait_for_running
    rec.requests.clear()
    with ThreadPoolExecutor(10) as pool:
        left = list(pool.map(lambda ref: backend.delete(ref, wait=30), refs))
    assert left == [""] * 10
    gets = [(p, q) for m, p, q in rec.requests if m == "GET" and "watch" not in q]
    assert all(not any(p.endswith(f"/{r.name}") for r in refs) for p, _ in gets), gets  # no GET of an object
    assert len(rec.requests) <= 10 * 9, len(rec.requests)  # a delete, then at most a list and a watch per kind
    assert leftovers(kube_client, checked) == []
