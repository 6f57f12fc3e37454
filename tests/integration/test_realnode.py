"""The real node of the test cluster: real containers (the probe image) run by a kubelet with
containerd, their logs read through the API server, DNS from CoreDNS, volumes shared."""

from __future__ import annotations

import ipaddress
import time

from kubernetes import client
from realpods import probe_pod, wait_phase
from testcluster import realnode
from testcluster.containerd import SUBNET


def test_a_pod_runs_on_the_real_node_and_its_log_is_read_through_the_api_server(api_client, namespace, real_node):
    core = client.CoreV1Api(api_client)
    t0 = time.monotonic()
    core.create_namespaced_pod(namespace, probe_pod("hello", real_node.image("probe"), ["lines", "3", "0.1", "+", "exit", "0"]))
    pod = wait_phase(core, namespace, "hello")
    assert pod.spec.node_name == realnode.NODE_NAME
    state = pod.status.container_statuses[0].state.terminated
    assert state.exit_code == 0 and state.reason == "Completed"
    # A real container gets an address of the node's pod network (KWOK's are 10.0.x.y).
    assert ipaddress.ip_address(pod.status.pod_ip) in ipaddress.ip_network(SUBNET)
    # The log comes from the kubelet through the API server; no pod scripting touched the pod.
    assert core.read_namespaced_pod_log("hello", namespace) == "line 1\nline 2\nline 3\n"
    assert not any(k.startswith("script.kfp-trainer.test/") for k in pod.metadata.annotations or {})
    print(f"pod Succeeded {time.monotonic() - t0:.1f} s after create")


def test_a_pod_that_does_not_ask_for_the_real_node_stays_off_it(api_client, namespace, real_node):
    core = client.CoreV1Api(api_client)
    body = probe_pod("kwok", real_node.image("probe"), ["exit", "0"])
    del body["spec"]["nodeSelector"], body["spec"]["tolerations"]
    core.create_namespaced_pod(namespace, body)
    pod = wait_phase(core, namespace, "kwok")
    assert pod.spec.node_name != realnode.NODE_NAME


def test_headless_service_names_resolve_from_another_pod(api_client, namespace, real_node):
    core = client.CoreV1Api(api_client)
    image = real_node.image("probe")
    core.create_namespaced_service(
        namespace,
        {
            "metadata": {"name": "peers"},
            "spec": {"clusterIP": "None", "selector": {"app": "peer"}, "publishNotReadyAddresses": True, "ports": [{"port": 29500}]},
        },
    )
    core.create_namespaced_pod(
        namespace, probe_pod("server", image, ["sleep", "inf"], labels={"app": "peer"}, hostname="peer-0", subdomain="peers")
    )
    server = wait_phase(core, namespace, "server", ("Running",))
    # Short names through the pod's search list (torchrun's master address is "<job>-node-0-0.<job>"),
    # and the fully qualified names of the Service and of the pod behind it.
    names = ["peer-0.peers", f"peers.{namespace}.svc.cluster.local", f"peer-0.peers.{namespace}.svc.cluster.local"]
    args = [a for n in names for a in ("resolve", n, "30", "+")][:-1]
    core.create_namespaced_pod(namespace, probe_pod("client", image, args))
    wait_phase(core, namespace, "client")
    log = core.read_namespaced_pod_log("client", namespace).splitlines()
    assert log == [f"{n} -> {server.status.pod_ip}" for n in names]


def test_a_read_write_many_claim_is_shared_by_two_pods(api_client, namespace, real_node, cluster):
    core = client.CoreV1Api(api_client)
    image = real_node.image("probe")
    core.create_namespaced_persistent_volume_claim(
        namespace,
        {"metadata": {"name": "workspace"}, "spec": {"accessModes": ["ReadWriteMany"], "resources": {"requests": {"storage": "1Gi"}}}},
    )
    # Both run at once: the reader waits for what the writer writes.
    core.create_namespaced_pod(
        namespace, probe_pod("reader", image, ["read", "/workspace/note", "60"], volumes={"workspace": "/workspace"})
    )
    core.create_namespaced_pod(
        namespace,
        probe_pod(
            "writer", image, ["write", "/workspace/note", "written by the writer", "+", "sleep", "1"], volumes={"workspace": "/workspace"}
        ),
    )
    wait_phase(core, namespace, "writer")
    wait_phase(core, namespace, "reader")
    assert core.read_namespaced_pod_log("reader", namespace) == "written by the writer\n"
    # The volume is a host directory of the cluster, made when the first pod mounted it.
    pv = core.read_persistent_volume(core.read_namespaced_persistent_volume_claim("workspace", namespace).spec.volume_name)
    assert pv.spec.host_path.path.startswith(str(cluster.cluster_dir / "volumes"))
    with open(f"{pv.spec.host_path.path}/note") as f:
        assert f.read() == "written by the writer"


def test_exec_reaches_a_container_of_the_real_node_through_the_api_server(api_client, namespace, real_node):
    from kubernetes.stream import stream

    core = client.CoreV1Api(api_client)
    core.create_namespaced_pod(namespace, probe_pod("target", real_node.image("probe"), ["sleep", "inf"]))
    wait_phase(core, namespace, "target", ("Running",))
    out = stream(
        core.connect_get_namespaced_pod_exec,
        "target",
        namespace,
        command=["/probe", "echo", "exec", "works"],
        stderr=True,
        stdout=True,
        stdin=False,
        tty=False,
    )
    assert out == "exec works\n"
