"""A launch reaches the real API server through the proxy its kubeconfig's ``proxy-url`` or ``HTTPS_PROXY`` names:
a CONNECT proxy counts the tunnels (the API server's serving certificate also names ``kubernetes.default.svc``, a
name only the proxy reaches here)."""

from __future__ import annotations

import io
from pathlib import Path
from urllib.parse import urlparse

import pytest
import yaml
from k8s_objects import inputs, kube_client
from testcluster import PodScript

from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from tests.connect_proxy import ConnectProxy

pytestmark = pytest.mark.timeout(180)
NAME = "kubernetes.default.svc"  # in the API server's certificate; resolves nowhere on this machine


@pytest.fixture
def proxy(cluster):
    p = ConnectProxy(urlparse(cluster.server).port)
    yield p
    p.close()


@pytest.fixture(autouse=True)
def no_proxy_variables(monkeypatch):
    for name in ("HTTPS_PROXY", "https_proxy", "HTTP_PROXY", "http_proxy", "NO_PROXY", "no_proxy"):
        monkeypatch.delenv(name, raising=False)


def kubeconfig_with(cluster, where: Path, **fields: str) -> str:
    """The admin kubeconfig with ``fields`` set on its cluster."""
    doc = yaml.safe_load(Path(cluster.kubeconfig).read_text())
    doc["clusters"][0]["cluster"].update(fields)
    path = where / "kubeconfig"
    path.write_text(yaml.safe_dump(doc))
    return str(path)


def run_a_job(kubeconfig: str, namespace: str) -> str:
    with kube_client(kubeconfig) as api:
        backend = KubernetesBackend(api, namespace=namespace, watch_timeout=5)
        out = io.StringIO()
        script = PodScript(lines=["through the proxy"])
        outcome = Launcher(backend, LaunchOptions(logs="0", delete_after_success=True), out=out).run(
            prepare(backend, inputs(namespace, pod_annotations=script.annotations()))
        )
    assert outcome.succeeded, out.getvalue()
    return out.getvalue()


def test_a_launch_goes_through_the_kubeconfigs_proxy_url(cluster, namespace, proxy, tmp_path):
    kubeconfig = kubeconfig_with(cluster, tmp_path, **{"proxy-url": f"http://127.0.0.1:{proxy.port}"})
    assert "through the proxy" in run_a_job(kubeconfig, namespace)
    port = urlparse(cluster.server).port
    assert proxy.tunnels and {t["target"] for t in proxy.tunnels} == {f"127.0.0.1:{port}"}


def test_a_launch_goes_through_https_proxy(cluster, namespace, proxy, tmp_path, monkeypatch):
    port = urlparse(cluster.server).port
    monkeypatch.setenv("HTTPS_PROXY", f"http://127.0.0.1:{proxy.port}")
    monkeypatch.setenv("NO_PROXY", "10.0.0.0/8,.cluster.local")
    kubeconfig = kubeconfig_with(cluster, tmp_path, server=f"https://{NAME}:{port}")
    assert "through the proxy" in run_a_job(kubeconfig, namespace)
    assert proxy.tunnels and {t["target"] for t in proxy.tunnels} == {f"{NAME}:{port}"}
