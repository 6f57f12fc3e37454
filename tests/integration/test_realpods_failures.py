"""How the launcher reports real containers that fail, on the real node: a container over its
memory limit (OOMKilled), an image that does not exist, a rank that crashes; and how a cancel
or a run time limit ends real processes (SIGTERM, the grace period honoured). The trainer is
the probe test image (hack/k8s/testimage): a real static binary, no scripted pod."""

from __future__ import annotations

import io
import json
import signal
import time
from pathlib import Path

import pytest
from faults import Output, start_launch
from helpers import wait_for
from kubernetes import client
from testcluster import realnode

from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import CannotStartError, JobFailedError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

pytestmark = pytest.mark.timeout(180)
RUNTIME = "probe-runtime"


def runtime(name: str, namespace: str, pull_policy: str | None = None) -> dict:
    """A TrainingRuntime like torch-distributed whose pods fail at once (``restartPolicy:
    Never``, ``backoffLimit: 0``: no real CrashLoopBackOff to wait out)."""
    container = {"name": "node", "image": "unused"}
    if pull_policy:
        container["imagePullPolicy"] = pull_policy
    job = {"backoffLimit": 0, "template": {"spec": {"restartPolicy": "Never", "containers": [container]}}}
    replicated = {
        "name": "node",
        "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}}, "spec": job},
    }
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "TrainingRuntime",
        "metadata": {"name": name, "namespace": namespace, "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [replicated]}}},
    }


@pytest.fixture
def ns(api_client, namespace, real_node):
    """A namespace with the runtimes: ``probe-runtime`` and ``probe-runtime-never`` (``imagePullPolicy: Never``)."""
    custom = client.CustomObjectsApi(api_client)
    for body in (runtime(RUNTIME, namespace), runtime(RUNTIME + "-never", namespace, "Never")):
        custom.create_namespaced_custom_object("trainer.kubeflow.org", "v1alpha1", namespace, "trainingruntimes", body)
    return namespace


def probe_job(ns: str, image: str, args: list[str], **kw) -> TrainJobInputs:
    extra = realnode.pod_spec_for_real_node()
    return TrainJobInputs(
        run_id=f"run-{time.time_ns()}",
        task_name="train",
        namespace=ns,
        runtime=RUNTIME,
        runtime_kind="TrainingRuntime",
        image=image,
        command=["/probe"],
        args=args,
        node_selector=extra["nodeSelector"],
        tolerations=extra["tolerations"],
        **kw,
    )


def launch(api, inp: TrainJobInputs, **options):
    out = io.StringIO()
    backend = KubernetesBackend(api, namespace=inp.namespace, watch_timeout=5)
    launcher = Launcher(backend, LaunchOptions(**{"blocker_check_interval": 1.0, **options}), out=out)
    try:
        return launcher.run(prepare(launcher.backend, inp)), out.getvalue()
    except Exception as e:
        e.output = out.getvalue()  # type: ignore[attr-defined]
        raise


def test_a_container_over_its_memory_limit_fails_the_step_as_oom_killed(kube_client, api_client, ns, real_node):
    inp = probe_job(
        ns, real_node.image("probe"), ["echo", "allocating", "+", "alloc", "512"], resources_per_node={"limits": {"memory": "64Mi"}}
    )
    t0 = time.monotonic()
    with pytest.raises(JobFailedError) as err:
        launch(kube_client, inp, start_timeout=120, run_timeout=120)
    text = str(err.value)
    print(f"OOMKilled reported {time.monotonic() - t0:.1f} s after launch")
    assert "OOMKilled" in text and "exit 137" in text, text
    assert f"on node {realnode.NODE_NAME}" in text, text  # where it ran
    assert "node: exit 137 (OOMKilled)" in text, text  # which container
    assert "allocating" in text, text  # its last lines


@pytest.mark.parametrize("policy", ["IfNotPresent", "Never"])
def test_an_image_that_does_not_exist_fails_the_step_within_seconds(kube_client, api_client, ns, real_node, policy):
    image = f"kfp-trainer.test/does-not-exist:{policy.lower()}"
    inp = probe_job(ns, image, ["exit", "0"])
    if policy == "Never":
        inp = inp.model_copy(update={"runtime": RUNTIME + "-never"})
    t0 = time.monotonic()
    with pytest.raises(CannotStartError) as err:
        launch(kube_client, inp, start_timeout=600)
    took = time.monotonic() - t0
    print(f"{policy}: pull failure reported after {took:.1f} s")
    expected = {"IfNotPresent": "ErrImagePull", "Never": "ErrImageNeverPull"}[policy]
    assert err.value.reason == expected, str(err.value)
    assert image in str(err.value)
    assert took < 45, f"took {took:.0f} s"


def test_a_crashing_rank_shows_its_last_lines_and_exit_code(kube_client, api_client, ns, real_node):
    args = ["lines", "5", "+", "exit-if", "JOB_COMPLETION_INDEX", "1", "3", "+", "sleep", "60"]
    inp = probe_job(ns, real_node.image("probe"), args, num_nodes=2)
    with pytest.raises(JobFailedError) as err:
        launch(kube_client, inp, start_timeout=120, run_timeout=120)
    text = str(err.value)
    assert "exit 3 (Error)" in text, text
    crashed = next(line for line in text.splitlines() if "exit 3" in line)
    assert "-node-0-1-" in crashed, text  # rank 1's pod
    tail = text.split("log lines of", 1)[1]
    assert "-node-0-1-" in tail.splitlines()[0], text
    assert [ln.strip() for ln in tail.splitlines()[1:6]] == [f"line {i}" for i in range(1, 6)], text


def _notes(path: Path) -> dict[str, float]:
    return {k: float(v) for k, v in (line.split() for line in path.read_text().splitlines())}


@pytest.mark.parametrize("how", ["cancel", "run_timeout"])
def test_sigterm_reaches_the_trainer_and_the_grace_period_is_honoured(cluster, api_client, ns, real_node, how):
    core = client.CoreV1Api(api_client)
    core.create_namespaced_persistent_volume_claim(
        ns, {"metadata": {"name": "notes"}, "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}}
    )
    grace, linger = 6, 3  # the trainer takes 3 s to stop; it may take 6
    extra = realnode.pod_spec_for_real_node()
    argv = [
        "--runtime-kind", "TrainingRuntime", "--runtime", RUNTIME, "--image", real_node.image("probe"), "--command", json.dumps(["/probe"]),
        "--args", json.dumps(["term", str(linger), "/notes/term", "+", "lines", "1000", "0.2"]),
        "--node-selector", json.dumps(extra["nodeSelector"]), "--tolerations", json.dumps(extra["tolerations"]),
        "--termination-grace-period-seconds", str(grace),
        "--volumes", json.dumps([{"name": "notes", "persistentVolumeClaim": {"claimName": "notes"}}]),
        "--volume-mounts", json.dumps([{"name": "notes", "mountPath": "/notes"}]),
    ]  # fmt: skip
    if how == "run_timeout":
        argv += ["--run-timeout", "8"]
    out = Output(start_launch(cluster.kubeconfig, ns, f"run-{time.time_ns()}", *argv))
    out.wait_for("line 3", timeout=90)
    if how == "cancel":
        out.proc.send_signal(signal.SIGTERM)
    out.finish(timeout=60)
    pods_gone = wait_for(
        lambda: not core.list_namespaced_pod(ns, label_selector="jobset.sigs.k8s.io/jobset-name").items and time.time(),
        timeout=60,
        what="pods gone",
    )
    volume = core.read_persistent_volume(core.read_namespaced_persistent_volume_claim("notes", ns).spec.volume_name).spec.host_path.path
    notes = _notes(Path(volume) / "term")
    # SIGTERM reached the trainer; it ran its 3 s to the end (inside the grace period) and the
    # pod was gone within 10 s of the grace period's end.
    assert notes["exit"] - notes["sigterm"] == pytest.approx(linger, abs=0.5), notes
    assert pods_gone - notes["sigterm"] < grace + 10, (notes, pods_gone)
