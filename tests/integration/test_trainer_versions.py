"""The launcher against the older Kubeflow Trainer releases: v2.1.0 (``podTemplateOverrides``,
JobSet v0.10.1) and v2.2.1 (``runtimePatches``, JobSet v0.12.0).

Each release runs in a cluster of its own (its controllers and webhooks, its CRDs and
ClusterTrainingRuntimes, no real node), started once for this module. The tests marked
``trainer_versions`` in the launcher and controller modules run here against each of them,
with the tests below: the API version the launcher detects, every rendered variant through
the release's schema and webhooks, a function trainer, and the webhook rules the launcher
predicts (it refuses what the release's webhook would refuse, before anything is created).
"""

from __future__ import annotations

import io
import os
import time

import pytest
import sdk_functions
import test_labels_k8s
import test_launcher_k8s
import test_real_controllers
from helpers import pods
from kubernetes import client
from testcluster import PodScript, TestCluster

from kfp_trainer import custom_trainer, spec
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import InvalidSpecErrors, RejectedError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.llm import inputs as llm_inputs
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

pytestmark = pytest.mark.timeout(240)
# Trainer release -> the TrainJob API the launcher must detect there.
API_OF = {"v2.1.0": "v2.1", "v2.2.1": "v2.2"}

# The marked tests of these modules, collected here as well (their fixtures resolve to the
# versioned cluster below).
for _module in (test_launcher_k8s, test_labels_k8s, test_real_controllers):
    for _name, _test in list(vars(_module).items()):
        if _name.startswith("test_") and any(m.name == "trainer_versions" for m in getattr(_test, "pytestmark", [])):
            globals()[f"test_{_module.__name__.removeprefix('test_')}__{_name.removeprefix('test_')}"] = _test


@pytest.fixture(scope="module", params=sorted(API_OF))
def cluster(request):
    """A cluster running the Trainer release of the parameter, without the real node."""
    from conftest import _BUILD_ERROR, _log_tails, _unavailable

    if _BUILD_ERROR is not None:
        _unavailable(_BUILD_ERROR)
    version = request.param
    c = TestCluster(
        f"kfp-trainer-{version.replace('.', '-')}",
        unique=True,
        real_node=False,
        trainer_version=version,
        feature_gates={},
        verbose=os.environ.get("KFP_TRAINER_CLUSTER_VERBOSE", "") == "1",
    )
    t0 = time.monotonic()
    try:
        c.start(build=True)
    except Exception as e:  # noqa: BLE001 - a cluster that does not come up fails with its logs
        logs = _log_tails(c)
        c.stop()
        pytest.fail(f"Trainer {version} cluster failed to start: {e}\n{logs}", pytrace=False)
    c.timings["fixture_start_s"] = time.monotonic() - t0
    try:
        yield c
    finally:
        c.stop()


@pytest.fixture(scope="module")
def api_client(cluster):
    api = cluster.api_client()
    yield api
    api.close()


@pytest.fixture(scope="module")
def kube_client(cluster):
    """The backend's own client for this module's cluster."""
    from k8s_objects import kube_client as make

    api = make(cluster.kubeconfig)
    yield api
    api.close()


def _inputs(namespace: str, task: str = "train", **kw) -> TrainJobInputs:
    return TrainJobInputs(run_id=f"run-{task}-{time.time_ns()}", task_name=task, namespace=namespace, **kw)


def _backend(api, namespace: str, **kw) -> KubernetesBackend:
    return KubernetesBackend(api, namespace=namespace, watch_timeout=5, **kw)


def _trainjobs(api, namespace: str) -> list[dict]:
    return client.CustomObjectsApi(api).list_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL)["items"]


def test_the_launcher_detects_the_releases_trainer_api(kube_client, cluster, api_client, namespace):
    backend = _backend(kube_client, namespace)
    assert backend.detect_api_version() == API_OF[cluster.trainer_version]
    job = prepare(backend, _inputs(namespace, node_selector={"a": "b"}))
    manifest, api_version = job.manifest, job.api_version
    assert api_version == API_OF[cluster.trainer_version]
    overrides = "podTemplateOverrides" if api_version == "v2.1" else "runtimePatches"
    assert overrides in manifest["spec"] and {"podTemplateOverrides", "runtimePatches"} - {overrides} & set(manifest["spec"]) == set()
    assert _trainjobs(api_client, namespace) == []


def test_every_rendered_variant_passes_the_releases_schema_and_webhooks(kube_client, cluster, api_client, namespace):
    """Server-side dry runs of every variant (plain, every override, initializers, another
    runtime, env from a Secret, a merge patch) in the API the launcher detects."""
    backend = _backend(kube_client, namespace)
    api_version = backend.detect_api_version()
    custom = client.CustomObjectsApi(api_client)
    for i, variant in enumerate(test_launcher_k8s.VARIANTS):
        variant = dict(variant)
        if api_version == "v2.1":
            variant.pop("active_deadline_seconds", None)  # a v2.2 field
        runtime = variant.get("runtime", "torch-distributed")
        jobs = backend.resolve_runtime(_inputs(namespace, runtime=runtime)).job_names
        m = spec.render(_inputs(namespace, task=f"v{i}", **variant), api_version=api_version, runtime_jobs=jobs)
        custom.create_namespaced_custom_object(
            spec.GROUP, spec.VERSION, namespace, spec.PLURAL, m, field_validation="Strict", dry_run="All"
        )


def test_a_function_trainer_runs_on_the_release(kube_client, cluster, api_client, namespace):
    """A Python function rendered as the SDK's CustomTrainer renders it, launched on the release."""
    runtime = client.CustomObjectsApi(api_client).get_cluster_custom_object(
        spec.GROUP, spec.VERSION, "clustertrainingruntimes", "torch-distributed"
    )
    settings = llm_inputs.FunctionTrainerSettings.from_function(
        sdk_functions.decorated, func_args={"lr": 0.5}, num_nodes=2, resources_per_node={"cpu": 2}
    )
    trainer = custom_trainer.render_function(runtime, settings).sdk_spec()["trainer"]
    lines = ['{"epoch": 0, "loss": 0.5}', '{"epoch": 1, "loss": 0.25}']
    inp = _inputs(
        namespace,
        command=trainer["command"],
        num_nodes=int(trainer["numNodes"]),
        resources_per_node=trainer["resourcesPerNode"],
        pod_annotations=PodScript(lines=lines).annotations(),
    )
    out = io.StringIO()
    backend = _backend(kube_client, namespace)
    outcome = Launcher(backend, LaunchOptions(blocker_check_interval=1.0), out=out).run(prepare(backend, inp))
    assert outcome.succeeded and outcome.metrics.final()["loss"] == 0.25
    node = next(c for c in pods(api_client, namespace, outcome.ref.name)[0].spec.containers if c.name == "node")
    assert node.command == trainer["command"] and node.resources.limits == {"cpu": "2"}


def _env_on_node_patch(api_version: str) -> dict:
    """A merge patch that sets env on the node container the release's own way."""
    container = {"name": "node", "env": [{"name": "LR", "value": "0.1"}]}
    if api_version == "v2.1":
        return {"spec": {"podTemplateOverrides": [{"targetJobs": [{"name": "node"}], "spec": {"containers": [container]}}]}}
    job = {"name": "node", "template": {"spec": {"template": {"spec": {"containers": [container]}}}}}
    patch = {"manager": "example.com/me", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}
    return {"spec": {"runtimePatches": [patch]}}


def test_the_launcher_refuses_env_on_the_node_container_as_the_releases_webhook_does(kube_client, cluster, api_client, namespace):
    """The release's webhook refuses env set on the node container through its override field;
    the launcher predicts it and refuses the patch before anything is created."""
    api_version = API_OF[cluster.trainer_version]
    patch = _env_on_node_patch(api_version)
    inp = _inputs(namespace, patch=patch)
    # The webhook's rule, checked on the real release (the manifest sent as it is).
    raw = spec.render(inp.model_copy(update={"patch": None}), api_version=api_version)
    for key, value in patch["spec"].items():
        raw["spec"][key] = value
    with pytest.raises(client.ApiException) as info:
        client.CustomObjectsApi(api_client).create_namespaced_custom_object(
            spec.GROUP, spec.VERSION, namespace, spec.PLURAL, raw, field_validation="Strict", dry_run="All"
        )
    assert "must not have envs for the dataset-initializer, model-initializer, node containers" in info.value.body
    # The launcher's prediction: a clear error naming the field, nothing sent.
    with pytest.raises(InvalidSpecErrors, match="no env (patch|override) on the node or initializer containers"):
        backend = _backend(kube_client, namespace)
        Launcher(backend, out=io.StringIO()).run(prepare(backend, inp))
    assert _trainjobs(api_client, namespace) == []


def test_forcing_the_other_api_says_which_one_the_release_serves(kube_client, cluster, api_client, namespace):
    served = API_OF[cluster.trainer_version]
    other = "v2.2" if served == "v2.1" else "v2.1"
    inp = _inputs(namespace, node_selector={"a": "b"})
    with pytest.raises(RejectedError, match=f"use api_version auto or {served}"):
        backend = _backend(kube_client, namespace, api_version=other)
        Launcher(backend, out=io.StringIO()).run(prepare(backend, inp))
    assert _trainjobs(api_client, namespace) == []


def _torchtune_claim(api, namespace: str, version: str, runtime: str) -> None:
    """Trainer v2.1.0's torchtune runtimes mount a claim named after the runtime, which the
    user makes; later releases make ``initializer-<job>`` themselves (volumeClaimPolicies)."""
    if version == "v2.1.0":
        body = {"metadata": {"name": runtime}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
        client.CoreV1Api(api).create_namespaced_persistent_volume_claim(namespace, body)


def test_torchtune_initializers_run_before_the_trainer_on_the_release(kube_client, cluster, api_client, namespace):
    runtime = "torchtune-llama3.2-1b"
    _torchtune_claim(api_client, namespace, cluster.trainer_version, runtime)
    inp = _inputs(
        namespace,
        runtime=runtime,
        dataset_uri="hf://tatsu-lab/alpaca",
        model_uri="hf://meta-llama/Llama-3.2-1B-Instruct",
        pod_targets=["dataset-initializer", "model-initializer"],
        pod_annotations=PodScript(lines=["downloaded"]).annotations(),
    )
    out = io.StringIO()
    backend = _backend(kube_client, namespace)
    outcome = Launcher(backend, LaunchOptions(blocker_check_interval=1.0), out=out).run(prepare(backend, inp))
    assert outcome.succeeded and "downloaded" in out.getvalue().splitlines()
    name = outcome.ref.name
    jobs = {j.metadata.name: j for j in client.BatchV1Api(api_client).list_namespaced_job(namespace).items}
    assert set(jobs) == {f"{name}-dataset-initializer-0", f"{name}-model-initializer-0", f"{name}-node-0"}
    for init, uri in (("dataset-initializer", inp.dataset_uri), ("model-initializer", inp.model_uri)):
        job = jobs[f"{name}-{init}-0"]
        assert job.status.completion_time <= jobs[f"{name}-node-0"].metadata.creation_timestamp
        assert {e.name: e.value for e in job.spec.template.spec.containers[0].env}["STORAGE_URI"] == uri


def test_a_torchtune_rule_of_the_releases_webhook_is_a_clear_user_error(kube_client, cluster, api_client, namespace):
    """Every release refuses two nodes for a single-node torchtune model once the processes per
    node are set (v2.1.0 checks torchtune jobs only then: it has no defaulting webhook)."""
    inp = _inputs(namespace, runtime="torchtune-llama3.2-1b", command=["tune", "run"], num_nodes=2, num_proc_per_node=1)
    with pytest.raises(RejectedError) as info:
        backend = _backend(kube_client, namespace)
        Launcher(backend, out=io.StringIO()).run(prepare(backend, inp))
    assert "spec.trainer.numNodes" in str(info.value) and "must be 1 for llama3_2/1B model" in str(info.value)
    assert _trainjobs(api_client, namespace) == []
