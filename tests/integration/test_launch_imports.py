"""``kfp-trainer launch`` loads only what launching needs (start-up time is mostly imports).

A whole launch -- credentials, create, watch, logs, success -- runs in a fresh interpreter
against the real API server, and the modules it imported are counted, not timed (``make bench``
times the launch):

* in a pod (the pipeline step: the service account's token and CA): none of the heavy
  modules -- the ``kubernetes`` library (its generated models and API classes), google-auth and
  the other auth libraries its loader pulls in, kfp, torch;
* with a kubeconfig (a laptop, ``--kubeconfig``): the ``kubernetes`` library's own loader reads
  it -- importing the library is the price of its exec plugins, auth providers and TLS options --
  but still no kfp and no torch. An exec-plugin kubeconfig launches through it too.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from urllib.parse import urlparse

import yaml
from kubernetes import client
from testcluster import PodScript

LIBRARY = (
    "kubernetes",
    "kubernetes.client.models",
    "kubernetes.client.api",
    "kubernetes.config",
    "google.auth",
    "oauthlib",
    "requests_oauthlib",
    "websocket",
)
NEVER = ("kfp", "kfp.compiler", "torch")
HEAVY = LIBRARY + NEVER

_PROBE = textwrap.dedent(
    """
    import json, os, sys
    from pathlib import Path
    if os.environ.get("PROBE_SA_DIR"):  # the pod's service account files, where a test put them
        import kfp_trainer.backends.kube.credentials as credentials
        credentials.SA_DIR = Path(os.environ["PROBE_SA_DIR"])
    from kfp_trainer.cli import main
    code = main(sys.argv[1:])
    heavy = sorted(m for m in {heavy!r} if m in sys.modules)
    print("PROBE " + json.dumps({{"code": code, "heavy": heavy, "kube": sorted(m for m in sys.modules if m.startswith("kubernetes"))}}))
    """
)


def launch_in_fresh_interpreter(
    kubeconfig: str | None, namespace: str, run_id: str, cwd: Path, env: dict[str, str] | None = None
) -> tuple[dict, str]:
    annotations = PodScript(lines=["step 1 loss=0.5"], line_delay=0.1).annotations()
    args = ["launch", *(["--kubeconfig", kubeconfig] if kubeconfig else []), "--namespace", namespace, "--runtime", "torch-distributed"]
    args += ["--run-id", run_id, "--task-name", "train", "--pod-annotations", json.dumps(annotations)]
    environ = {k: v for k, v in os.environ.items() if k not in ("KUBECONFIG", "KUBERNETES_SERVICE_HOST", "KUBERNETES_SERVICE_PORT")}
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,  # the installed (or PYTHONPATH's) package, not whatever the current directory holds
        env={**environ, "PYTHONUNBUFFERED": "1", **(env or {})},
    )
    output = done.stdout + done.stderr
    probe = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert probe, f"the launch did not finish (exit {done.returncode}):\n{output[-3000:]}"
    return json.loads(probe[-1][len("PROBE ") :]), output


def service_account_files(cluster, api_client, namespace: str, where: Path) -> tuple[dict[str, str], list]:
    """``pipeline-runner`` with deploy/rbac.yaml's rights in ``namespace``: its token and the cluster's CA where a pod
    has them, and the environment a pod gets (the API server's address); and the clean-up of the cluster-scoped RBAC."""
    from test_rbac import SA, apply_rbac

    cleanup = apply_rbac(api_client, namespace)
    token = client.CoreV1Api(api_client).create_namespaced_service_account_token(SA, namespace, {"spec": {"expirationSeconds": 3600}})
    where.mkdir()
    (where / "token").write_text(token.status.token)
    (where / "ca.crt").write_bytes(Path(api_client.configuration.ssl_ca_cert).read_bytes())
    (where / "namespace").write_text(namespace)
    server = urlparse(cluster.server)
    env = {"KUBERNETES_SERVICE_HOST": str(server.hostname), "KUBERNETES_SERVICE_PORT": str(server.port), "PROBE_SA_DIR": str(where),
           "POD_NAMESPACE": namespace, "HOME": str(where)}  # fmt: skip
    return env, cleanup


def test_a_launch_in_a_pod_imports_no_kubernetes_library_auth_libraries_kfp_or_torch(cluster, api_client, namespace, tmp_path):
    env, cleanup = service_account_files(cluster, api_client, namespace, tmp_path / "serviceaccount")
    try:
        result, output = launch_in_fresh_interpreter(None, namespace, "imports", tmp_path, env)
    finally:
        for delete, name in cleanup:
            delete(name)
    assert result["code"] == 0, output[-3000:]
    assert "step 1 loss=0.5" in output  # the log was relayed: the whole path ran
    assert result["heavy"] == [], f"heavy modules imported by a launch: {result['heavy']}"
    assert result["kube"] == [], f"Kubernetes client modules imported by a launch: {result['kube']}"


def test_a_kubeconfig_is_read_by_the_librarys_loader_and_a_launch_imports_no_kfp_or_torch(cluster, namespace, tmp_path):
    result, output = launch_in_fresh_interpreter(cluster.kubeconfig, namespace, "imports-kubeconfig", tmp_path)
    assert result["code"] == 0, output[-3000:]
    assert "step 1 loss=0.5" in output
    assert "kubernetes.config.kube_config" in result["kube"]  # the library's loader read the kubeconfig
    assert not set(result["heavy"]) & set(NEVER), f"imported by a launch: {result['heavy']}"


def exec_plugin_kubeconfig(admin_kubeconfig: str, where: Path) -> Path:
    """The admin kubeconfig with its client certificate handed over by an exec plugin (an ExecCredential)."""
    admin = yaml.safe_load(Path(admin_kubeconfig).read_text())
    base = Path(admin_kubeconfig).parent
    cluster = dict(admin["clusters"][0]["cluster"])
    if cluster.get("certificate-authority"):
        cluster["certificate-authority"] = str(base / cluster["certificate-authority"])
    user = admin["users"][0]["user"]
    cert, key = (Path(base / user[k]).read_text() for k in ("client-certificate", "client-key"))
    credential = {"apiVersion": "client.authentication.k8s.io/v1", "kind": "ExecCredential",
                  "status": {"clientCertificateData": cert, "clientKeyData": key}}  # fmt: skip
    plugin = where / "credential.json"
    plugin.write_text(json.dumps(credential))
    doc = {
        "apiVersion": "v1",
        "kind": "Config",
        "current-context": "exec",
        "clusters": [{"name": "c", "cluster": cluster}],
        "contexts": [{"name": "exec", "context": {"cluster": "c", "user": "plugin"}}],
        "users": [{"name": "plugin", "user": {"exec": {"apiVersion": "client.authentication.k8s.io/v1", "command": sys.executable,
                                                       "args": ["-c", f"print(open({str(plugin)!r}).read())"],
                                                       "interactiveMode": "Never"}}}],
    }  # fmt: skip
    path = where / "exec.kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return path


def test_an_exec_plugin_kubeconfig_launches_through_the_client_librarys_loader(cluster, namespace, tmp_path):
    kubeconfig = exec_plugin_kubeconfig(cluster.kubeconfig, tmp_path)
    result, output = launch_in_fresh_interpreter(str(kubeconfig), namespace, "exec-plugin", tmp_path)
    assert result["code"] == 0, output[-3000:]
    assert "step 1 loss=0.5" in output
    assert "kubernetes.config.exec_provider" in result["kube"]  # the library's loader ran the plugin
