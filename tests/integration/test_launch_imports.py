"""``kfp-trainer launch`` loads only what launching needs (start-up time is mostly imports).

A whole launch -- kubeconfig, create, watch, logs, success -- runs in a fresh interpreter
against the real API server; afterwards none of the heavy modules may have been imported:
the Kubernetes client library's generated models and API classes, google-auth and the other
auth libraries its configuration loader pulls in, kfp, torch. The modules are counted, not
timed (``make bench`` times the launch). A kubeconfig with an exec plugin still launches: the
client library's loader reads it.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import yaml
from testcluster import PodScript

HEAVY = (
    "kubernetes",
    "kubernetes.client.models",
    "kubernetes.client.api",
    "kubernetes.config",
    "google.auth",
    "oauthlib",
    "requests_oauthlib",
    "websocket",
    "kfp",
    "kfp.compiler",
    "torch",
)

_PROBE = textwrap.dedent(
    """
    import json, sys
    from kfp_trainer.cli import main
    code = main(sys.argv[1:])
    heavy = sorted(m for m in {heavy!r} if m in sys.modules)
    print("PROBE " + json.dumps({{"code": code, "heavy": heavy, "kube": sorted(m for m in sys.modules if m.startswith("kubernetes"))}}))
    """
)


def launch_in_fresh_interpreter(kubeconfig: str, namespace: str, run_id: str, cwd: Path) -> tuple[dict, str]:
    annotations = PodScript(lines=["step 1 loss=0.5"], line_delay=0.1).annotations()
    args = ["launch", "--kubeconfig", kubeconfig, "--namespace", namespace, "--runtime", "torch-distributed", "--run-id", run_id]
    args += ["--task-name", "train", "--pod-annotations", json.dumps(annotations)]
    done = subprocess.run(
        [sys.executable, "-c", _PROBE.format(heavy=HEAVY), *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,  # the installed (or PYTHONPATH's) package, not whatever the current directory holds
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )
    output = done.stdout + done.stderr
    probe = [line for line in done.stdout.splitlines() if line.startswith("PROBE ")]
    assert probe, f"the launch did not finish (exit {done.returncode}):\n{output[-3000:]}"
    return json.loads(probe[-1][len("PROBE ") :]), output


def test_a_whole_launch_imports_no_generated_models_auth_libraries_kfp_or_torch(cluster, namespace, tmp_path):
    result, output = launch_in_fresh_interpreter(cluster.kubeconfig, namespace, "imports", tmp_path)
    assert result["code"] == 0, output[-3000:]
    assert "step 1 loss=0.5" in output  # the log was relayed: the whole path ran
    assert result["heavy"] == [], f"heavy modules imported by a launch: {result['heavy']}"
    assert result["kube"] == [], f"Kubernetes client modules imported by a launch: {result['kube']}"


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
