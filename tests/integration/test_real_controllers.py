"""What only the real Trainer and JobSet controllers show: the launcher's TrainJob through
their webhooks and reconcilers down to pods on KWOK nodes, and back to the launcher."""

from __future__ import annotations

import http.client
import io
import json
import socket
import ssl
import time
from urllib.parse import urlsplit

import pytest
from helpers import JOBSET_GROUP, JOBSET_VERSION, condition, get_jobset, pods, wait_for
from kubernetes import client
from testcluster import PodScript

from kfp_trainer import spec
from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import JobFailedError, RejectedError
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

pytestmark = pytest.mark.timeout(180)


def inputs(namespace: str, task: str = "train", **kw) -> TrainJobInputs:
    return TrainJobInputs(run_id=f"run-{task}-{time.time_ns()}", task_name=task, namespace=namespace, pipeline_name="p", **kw)


def launch(api, inp: TrainJobInputs, **options):
    backend = KubernetesBackend(api, namespace=inp.namespace, watch_timeout=5)
    out = io.StringIO()
    launcher = Launcher(backend, LaunchOptions(**{"blocker_check_interval": 1.0, **options}), out=out)
    try:
        return launcher.run(prepare(launcher.backend, inp)), out.getvalue()
    except Exception as e:
        e.output = out.getvalue()  # type: ignore[attr-defined]
        raise


def relayed(out: str) -> list[str]:
    return [line for line in out.splitlines() if not line.startswith("[kfp-trainer]") and not line.startswith("  ")]


def get_trainjob(api, namespace: str, name: str) -> dict:
    return client.CustomObjectsApi(api).get_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL, name)


@pytest.mark.trainer_versions
def test_launcher_trainjob_runs_through_the_real_controllers_to_kwok_pods_and_back(kube_client, api_client, namespace):
    lines = ["Starting training", "epoch 1/2 loss=0.50", "epoch 2/2 loss=0.25", "Training finished"]
    script = PodScript(lines=lines, line_delay=0.1)
    outcome, out = launch(kube_client, inputs(namespace, num_nodes=2, pod_annotations=script.annotations()))
    # The launcher's verdict and the relayed log, line for line.
    assert outcome.succeeded and outcome.reason == "AllJobsCompleted"
    assert relayed(out) == lines
    # Its phases never go backwards: the pods end before the JobSet says Complete, which is no return to Pending.
    told = [line for line in out.splitlines() if line.endswith(("waiting for the trainer to start", "trainer is running"))]
    assert [line.rsplit(" ", 1)[-1] for line in told] in (["start", "running"], ["running"], ["start"]), out
    phases = [event.split(" (")[0] for _, event in outcome.timeline if event.split(" (")[0] in ("Pending", "Running", "Succeeded")]
    assert phases in (["Pending", "Running", "Succeeded"], ["Running", "Succeeded"], ["Pending", "Succeeded"]), outcome.timeline
    assert "completed on 2 nodes (AllJobsCompleted)" in out, out
    name = outcome.ref.name
    tj = get_trainjob(api_client, namespace, name)
    # The JobSet: made by the Trainer controller (server-side apply as "trainer"), owned by the TrainJob.
    js = get_jobset(api_client, namespace, name)
    assert js["metadata"]["ownerReferences"] == [
        {
            "apiVersion": "trainer.kubeflow.org/v1alpha1",
            "kind": "TrainJob",
            "name": name,
            "uid": tj["metadata"]["uid"],
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert ("trainer", "Apply") in {(m["manager"], m["operation"]) for m in js["metadata"]["managedFields"]}
    assert js["status"]["terminalState"] == "Completed"
    # The Jobs: made by the JobSet controller, owned by the JobSet.
    jobs = client.BatchV1Api(api_client).list_namespaced_job(namespace).items
    assert [j.metadata.name for j in jobs] == [f"{name}-node-0"]
    ref = jobs[0].metadata.owner_references[0]
    assert (ref.kind, ref.api_version, ref.uid, ref.controller) == (
        "JobSet",
        f"{JOBSET_GROUP}/{JOBSET_VERSION}",
        js["metadata"]["uid"],
        True,
    )
    # The pods: made by the job controller, bound by the scheduler to KWOK nodes, played by KWOK.
    nodes = {n.metadata.name: n for n in client.CoreV1Api(api_client).list_node().items}
    ps = pods(api_client, namespace, name)
    assert len(ps) == 2
    for p in ps:
        assert p.metadata.owner_references[0].kind == "Job" and p.metadata.owner_references[0].uid == jobs[0].metadata.uid
        assert nodes[p.spec.node_name].metadata.annotations["kwok.x-k8s.io/node"] == "fake"
        assert p.status.phase == "Succeeded"
    # The Complete condition: written by the Trainer controller into the status subresource.
    c = condition(tj, "Complete")
    assert (c["status"], c["reason"], c["message"]) == ("True", "AllJobsCompleted", "jobset completed successfully")
    status_writers = {m["manager"] for m in tj["metadata"]["managedFields"] if m.get("subresource") == "status"}
    assert status_writers == {"controllers"}  # the process running the Trainer (and JobSet) controllers


@pytest.mark.trainer_versions
def test_rendered_runtime_patches_are_accepted_by_the_webhook_and_reach_the_pods(kube_client, api_client, namespace):
    core = client.CoreV1Api(api_client)
    # The workspace claim, provisioned and bound by the cluster's default storage class.
    core.create_namespaced_persistent_volume_claim(
        namespace, {"metadata": {"name": "ws"}, "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}}}
    )
    tolerations = [{"key": "nvidia.com/gpu", "operator": "Exists", "effect": "NoSchedule"}]
    inp = inputs(
        namespace,
        image="ghcr.io/example/trainer:1.0",
        command=["torchrun", "train.py"],
        env={"EPOCHS": "3"},
        resources_per_node={"limits": {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}},
        node_selector={"nvidia.com/gpu.present": "true"},
        tolerations=tolerations,
        volumes=[{"name": "workspace", "persistentVolumeClaim": {"claimName": "ws"}}],
        volume_mounts=[{"name": "workspace", "mountPath": "/kfp-workspace"}],
        pod_labels={"example.com/tier": "train"},
        pod_annotations={"example.com/note": "x", **PodScript(lines=["ok"]).annotations()},
        image_pull_secrets=["regcred"],
    )
    outcome, out = launch(kube_client, inp)
    assert outcome.succeeded and relayed(out) == ["ok"]
    p = pods(api_client, namespace, outcome.ref.name)[0]
    node = next(c for c in p.spec.containers if c.name == "node")
    env = {e.name: e.value for e in node.env}
    assert env["EPOCHS"] == "3"
    assert {"PET_NNODES", "PET_NPROC_PER_NODE", "PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT"} <= set(env)
    assert node.image == "ghcr.io/example/trainer:1.0" and node.command == ["torchrun", "train.py"]
    assert node.resources.limits == {"cpu": "2", "memory": "4Gi", "nvidia.com/gpu": "1"}
    assert p.spec.node_selector == {"nvidia.com/gpu.present": "true"}
    assert p.spec.node_name.startswith("kwok-gpu-")
    assert {(t.key, t.operator, t.effect) for t in p.spec.tolerations} >= {("nvidia.com/gpu", "Exists", "NoSchedule")}
    assert any(v.name == "workspace" and v.persistent_volume_claim.claim_name == "ws" for v in p.spec.volumes)
    assert any(m.name == "workspace" and m.mount_path == "/kfp-workspace" for m in node.volume_mounts)
    assert p.metadata.labels["example.com/tier"] == "train"
    assert p.metadata.annotations["example.com/note"] == "x"
    assert [s.name for s in p.spec.image_pull_secrets] == ["regcred"]
    assert core.read_namespaced_persistent_volume_claim("ws", namespace).status.phase == "Bound"


def test_lineage_labels_reach_the_jobset_and_the_pods(kube_client, api_client, namespace):
    inp = inputs(namespace, task="lineage")
    outcome, _ = launch(kube_client, inp)
    lineage = spec.lineage_labels(inp)
    assert lineage  # run, task, pipeline, inputs digest
    js = get_jobset(api_client, namespace, outcome.ref.name)
    assert lineage.items() <= js["metadata"]["labels"].items()
    for p in pods(api_client, namespace, outcome.ref.name):
        assert lineage.items() <= p.metadata.labels.items()


def test_a_trainer_webhook_refusal_is_a_clear_user_error_and_creates_nothing(kube_client, api_client, namespace):
    # A rule only the Trainer knows: torchtune's single-node models take one node.
    inp = inputs(namespace, runtime="torchtune-llama3.2-1b", command=["tune", "run"], num_nodes=2)
    with pytest.raises(RejectedError) as info:
        launch(kube_client, inp)
    message = str(info.value)
    assert "spec.trainer.numNodes" in message and "must be 1 for llama3_2/1B model" in message
    assert "rbac" not in message.lower()
    assert (
        client.CustomObjectsApi(api_client).list_namespaced_custom_object(spec.GROUP, spec.VERSION, namespace, spec.PLURAL)["items"] == []
    )


def test_failure_after_the_job_retries_carries_the_controllers_reason(kube_client, api_client, namespace):
    script = PodScript(lines=["epoch 1", "NaN loss"], exit_code=1, crash_backoff=0.1)
    with pytest.raises(JobFailedError) as info:
        launch(kube_client, inputs(namespace, pod_annotations=script.annotations()))
    name = info.value.output.split("created TrainJob ", 1)[1].split(" ", 1)[0].split("/", 1)[1]  # type: ignore[attr-defined]
    c = condition(get_trainjob(api_client, namespace, name), "Failed")
    assert (c["reason"], c["message"]) == ("FailedJobs", f"jobset failed due to one or more job failures (first failed job: {name}-node-0)")
    assert f"FailedJobs: {c['message']}" in str(info.value)
    job = client.BatchV1Api(api_client).read_namespaced_job(f"{name}-node-0", namespace)
    assert {x.type: x.reason for x in job.status.conditions}["Failed"] == "BackoffLimitExceeded"


def test_suspension_and_resumption_conditions_reach_the_launcher(kube_client, api_client, namespace):
    import threading

    backend = KubernetesBackend(kube_client, namespace=namespace, watch_timeout=5)
    inp = inputs(namespace, suspend=True, pod_annotations=PodScript(lines=["resumed"]).annotations())
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=1.0), out=io.StringIO())
    manifest = prepare(launcher.backend, inp).manifest
    name = manifest["metadata"]["name"]
    result: dict = {}
    thread = threading.Thread(target=lambda: result.update(outcome=launcher.run(prepare(launcher.backend, inp))), daemon=True)
    thread.start()
    wait_for(lambda: condition(get_trainjob_or_none(api_client, namespace, name), "Suspended"), 30, what="Suspended")
    c = condition(get_trainjob(api_client, namespace, name), "Suspended")
    assert (c["status"], c["reason"], c["message"]) == ("True", "Suspended", "TrainJob is suspended")
    wait_for(lambda: "suspended" in launcher.out.getvalue(), 30, what="suspension reported")  # type: ignore[attr-defined]
    client.CustomObjectsApi(api_client).patch_namespaced_custom_object(
        spec.GROUP, spec.VERSION, namespace, spec.PLURAL, name, {"spec": {"suspend": False}}
    )
    thread.join(60)
    assert result["outcome"].succeeded
    c = condition(get_trainjob(api_client, namespace, name), "Suspended")
    assert (c["status"], c["reason"], c["message"]) == ("False", "Resumed", "TrainJob is resumed")
    assert relayed(launcher.out.getvalue()) == ["resumed"]  # type: ignore[attr-defined]


def get_trainjob_or_none(api, namespace: str, name: str) -> dict | None:
    try:
        return get_trainjob(api, namespace, name)
    except client.ApiException as e:
        if e.status == 404:
            return None
        raise


def test_torchtune_initializers_run_before_the_trainer_through_the_launcher(kube_client, api_client, namespace):
    script = PodScript(lines=["downloaded"])
    inp = inputs(
        namespace,
        runtime="torchtune-llama3.2-1b",
        dataset_uri="hf://tatsu-lab/alpaca",
        model_uri="hf://meta-llama/Llama-3.2-1B-Instruct",
        pod_targets=["dataset-initializer", "model-initializer"],
        pod_annotations=script.annotations(),
    )
    outcome, out = launch(kube_client, inp)
    assert outcome.succeeded and relayed(out) == ["downloaded"]
    name = outcome.ref.name
    jobs = {j.metadata.name: j for j in client.BatchV1Api(api_client).list_namespaced_job(namespace).items}
    assert set(jobs) == {f"{name}-dataset-initializer-0", f"{name}-model-initializer-0", f"{name}-node-0"}
    for init in ("dataset-initializer", "model-initializer"):
        assert jobs[f"{name}-{init}-0"].status.completion_time <= jobs[f"{name}-node-0"].metadata.creation_timestamp
    envs = {
        init: {e.name: e.value for e in jobs[f"{name}-{init}-0"].spec.template.spec.containers[0].env}
        for init in ("dataset-initializer", "model-initializer")
    }
    assert envs["dataset-initializer"]["STORAGE_URI"] == "hf://tatsu-lab/alpaca"
    assert envs["model-initializer"]["STORAGE_URI"] == "hf://meta-llama/Llama-3.2-1B-Instruct"
    pvc = client.CoreV1Api(api_client).read_namespaced_persistent_volume_claim(f"initializer-{name}", namespace)
    assert pvc.status.phase == "Bound"


def test_trainer_status_server_accepts_progress_from_a_trainer_pod(kube_client, cluster, api_client, namespace):
    """The TrainJobStatus gate: the Trainer gives trainer pods its status server's URL, CA and a
    projected token; a trainer reporting progress with them updates the TrainJob's status."""
    gates = dict(cluster.feature_gates)
    cluster.restart_controllers(feature_gates={**gates, "TrainJobStatus": True})
    try:
        backend = KubernetesBackend(kube_client, namespace=namespace)
        inp = inputs(namespace, pod_annotations=PodScript(exit_delay=float("inf")).annotations())
        manifest = prepare(backend, inp).manifest
        name = backend.submit(manifest).ref.name
        p = wait_for(lambda: next(iter(pods(api_client, namespace, name, phase="Running")), None), 60, what="trainer pod running")
        env = {e.name: e.value for e in next(c for c in p.spec.containers if c.name == "node").env}
        url = urlsplit(env["KUBEFLOW_TRAINER_SERVER_URL"])
        server = cluster.status_server
        assert (url.hostname, url.port) == (server["server_hostname"], server["port"])
        assert url.path == f"/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"
        # The token the pod's projected volume would hold: the pod's service account, the TrainJob's audience.
        audience = next(
            s.service_account_token.audience for v in p.spec.volumes if v.projected for s in v.projected.sources if s.service_account_token
        )
        token = (
            client.CoreV1Api(api_client)
            .create_namespaced_service_account_token(
                p.spec.service_account_name or "default",
                namespace,
                {
                    "spec": {
                        "audiences": [audience],
                        "boundObjectRef": {"kind": "Pod", "apiVersion": "v1", "name": p.metadata.name, "uid": p.metadata.uid},
                    }
                },
            )
            .status.token
        )
        ctx = ssl.create_default_context(cafile=server["ca_file"])
        body = json.dumps({"trainerStatus": {"progressPercentage": 42, "lastUpdatedTime": "2026-01-01T00:00:00Z"}})

        def post(bearer: str) -> int:
            # Connect to 127.0.0.1 and verify the certificate for the host name the pod uses.
            conn = http.client.HTTPSConnection(server["host"], server["port"], context=ctx, timeout=10)
            conn.sock = ctx.wrap_socket(
                socket.create_connection((server["host"], server["port"]), timeout=10), server_hostname=server["server_hostname"]
            )
            conn.request("POST", url.path, body=body, headers={"Authorization": f"Bearer {bearer}", "Content-Type": "application/json"})
            resp = conn.getresponse()
            resp.read()
            conn.close()
            return resp.status

        assert post("not-a-token") == 403
        assert post(token) == 200
        status = get_trainjob(api_client, namespace, name)["status"]
        assert status["trainerStatus"]["progressPercentage"] == 42
    finally:
        cluster.restart_controllers(feature_gates=gates)
