"""Kueue in the test cluster: its CRDs, its manager (the module's cmd/kueue built by
hack/k8s/build.sh: controllers, scheduler and webhooks) and the queue objects tests create.

The manager serves its webhooks on 127.0.0.1 with the controllers' serving certificate
(``controllers-pki``: made by hack/k8s/controllers, an IP SAN for 127.0.0.1), with Kueue's
internal certificate management off; the webhook configurations come from the module's
``config/components/webhook/manifests.yaml``, reached by URL with that CA, and only for what
this manager serves: Kueue's own kinds and TrainJobs (its one integration here).

Kueue manages the TrainJobs of the namespaces labelled ``kfp-trainer.test/kueue=true`` only
(:data:`MANAGED_NAMESPACES`): its ``managedJobsNamespaceSelector``, and the namespace selector of
its TrainJob webhooks. The other tests of a session, which play Kueue themselves or carry a
queue label with no LocalQueue behind it, never meet it.
"""

from __future__ import annotations

import base64
import copy
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import yaml

from . import crds
from .binaries import ClusterError
from .components import Component
from .procs import free_port

GROUP, VERSION = "kueue.x-k8s.io", "v1beta2"
NAMESPACE = "kueue-system"  # the manager's own namespace (its configuration's default)
FRAMEWORK = "trainer.kubeflow.org/trainjob"
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"
PRIORITY_LABEL = "kueue.x-k8s.io/priority-class"
# The webhook paths this manager serves (integrations it does not run are left out: the API
# server would get 404s from them).
SERVED = ("-kueue-x-k8s-io-", "-trainer-kubeflow-org-")
JOB_WEBHOOKS = "-trainer-kubeflow-org-"
MANAGED_NAMESPACES = {"kfp-trainer.test/kueue": "true"}  # the namespaces whose TrainJobs Kueue manages


def manifests_dir(binary: Path) -> Path:
    """build.sh copies the module's CRDs (``crds/``) and webhooks (``webhook/``) next to ``bin/``."""
    return binary.parent.parent


def configuration(cert_dir: Path, webhook_port: int, health_port: int) -> dict[str, Any]:
    """The manager's Configuration (config.kueue.x-k8s.io/v1beta2).

    Example:
        >>> c = configuration(Path("/pki"), 9443, 8081)
        >>> c["webhook"], c["integrations"]["frameworks"], c["internalCertManagement"]
        ({'host': '127.0.0.1', 'port': 9443, 'certDir': '/pki'}, ['trainer.kubeflow.org/trainjob'], {'enable': False})
        >>> c["managedJobsNamespaceSelector"]
        {'matchLabels': {'kfp-trainer.test/kueue': 'true'}}
    """
    return {
        "apiVersion": "config.kueue.x-k8s.io/v1beta2",
        "kind": "Configuration",
        "namespace": NAMESPACE,
        "health": {"healthProbeBindAddress": f"127.0.0.1:{health_port}"},
        "metrics": {"bindAddress": "0"},
        "webhook": {"host": "127.0.0.1", "port": webhook_port, "certDir": str(cert_dir)},
        "leaderElection": {"leaderElect": False},
        "internalCertManagement": {"enable": False},
        "manageJobsWithoutQueueName": False,
        "managedJobsNamespaceSelector": {"matchLabels": dict(MANAGED_NAMESPACES)},
        "integrations": {"frameworks": [FRAMEWORK]},
        # The on-demand visibility API server listens on a fixed port: off, so clusters never collide.
        "featureGates": {"VisibilityOnDemand": False},
    }


def webhook_configurations(manifest: Path, url: str, ca_pem: bytes) -> list[dict]:
    """The module's webhook configurations, named ``kueue-...``, reaching ``url`` (by path)
    with ``ca_pem``, only the webhooks this manager serves; the TrainJob ones only for the
    namespaces Kueue manages."""
    docs = crds.load_yaml_docs(manifest)
    out = []
    for doc in docs:
        if doc.get("kind") not in ("MutatingWebhookConfiguration", "ValidatingWebhookConfiguration"):
            continue
        body = copy.deepcopy(doc)
        body["metadata"] = {"name": "kueue-" + doc["metadata"]["name"]}
        hooks = []
        for hook in body.get("webhooks") or []:
            path = hook["clientConfig"]["service"]["path"]
            if any(s in path for s in SERVED):
                hook["clientConfig"] = {"url": url + path, "caBundle": base64.b64encode(ca_pem).decode()}
                if JOB_WEBHOOKS in path:
                    hook["namespaceSelector"] = {"matchLabels": dict(MANAGED_NAMESPACES)}
                hooks.append(hook)
        if not hooks:
            raise ClusterError(f"no Kueue webhooks for {SERVED} in {manifest}")
        body["webhooks"] = hooks
        out.append(body)
    return out


class KueueManager(Component):
    """Kueue's manager process; its configuration and ports in ``<cluster>/kueue/``."""

    name = "kueue"

    def __init__(self, cluster_dir: Path, state_dir: Path, cluster_name: str, binary: Path, cert_dir: Path) -> None:
        super().__init__(cluster_dir, state_dir, cluster_name)
        self.binary, self.cert_dir = binary, cert_dir
        self.config_file = cluster_dir / "kueue" / "config.yaml"
        if self.config_file.exists():  # a running manager keeps its ports
            cfg = yaml.safe_load(self.config_file.read_text())
            self.webhook_port = int(cfg["webhook"]["port"])
            self.health_port = int(cfg["health"]["healthProbeBindAddress"].rsplit(":", 1)[1])
        else:
            self.webhook_port, self.health_port = free_port(), free_port()

    def argv(self) -> list[str]:
        return [str(self.binary), "--config", str(self.config_file), "--kubeconfig", str(self.kubeconfig)]

    def start(self, env: Mapping[str, str], timeout: float = 90) -> None:
        self.config_file.parent.mkdir(parents=True, exist_ok=True)
        self.config_file.write_text(yaml.safe_dump(configuration(self.cert_dir, self.webhook_port, self.health_port)))
        super().start(env, timeout)

    def ready(self) -> bool:
        """Ready once its webhook server listens (its /readyz)."""
        opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
        with opener.open(f"http://127.0.0.1:{self.health_port}/readyz", timeout=2) as resp:
            return resp.status == 200


def install(api, binary: Path) -> None:
    """Kueue's CRDs (every one of the module's) and its namespace."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    crds.install_crds(api, sorted((manifests_dir(binary) / "crds").glob("*.yaml")))
    try:
        client.CoreV1Api(api).create_namespace({"metadata": {"name": NAMESPACE}})
    except ApiException as e:
        if e.status != 409:
            raise


def register_webhooks(api, binary: Path, port: int, ca_file: Path) -> None:
    """Create (or replace) the manager's webhook configurations, pointing at ``port``."""
    from kubernetes import client
    from kubernetes.client.rest import ApiException

    adm = client.AdmissionregistrationV1Api(api)
    manifest = manifests_dir(binary) / "webhook" / "manifests.yaml"
    for body in webhook_configurations(manifest, f"https://127.0.0.1:{port}", ca_file.read_bytes()):
        mutating = body["kind"] == "MutatingWebhookConfiguration"
        create = adm.create_mutating_webhook_configuration if mutating else adm.create_validating_webhook_configuration
        read = adm.read_mutating_webhook_configuration if mutating else adm.read_validating_webhook_configuration
        replace = adm.replace_mutating_webhook_configuration if mutating else adm.replace_validating_webhook_configuration
        try:
            create(body)
        except ApiException as e:
            if e.status != 409:
                raise
            body["metadata"]["resourceVersion"] = read(body["metadata"]["name"]).metadata.resource_version
            replace(body["metadata"]["name"], body)


def wait_webhooks(api, timeout: float = 30) -> None:
    """Wait until the API server calls the manager's webhooks: a dry-run ResourceFlavor comes
    back with the finalizer Kueue's defaulting webhook adds."""
    import time

    from kubernetes import client

    objs = client.CustomObjectsApi(api)
    body = {"apiVersion": f"{GROUP}/{VERSION}", "kind": "ResourceFlavor", "metadata": {"name": "webhook-probe"}, "spec": {}}
    deadline = time.monotonic() + timeout
    last: object = None
    while time.monotonic() < deadline:
        try:
            got = objs.create_cluster_custom_object(GROUP, VERSION, "resourceflavors", body, dry_run="All")
            if got["metadata"].get("finalizers"):
                return
            last = "no finalizer from the defaulting webhook"
        except Exception as e:  # noqa: BLE001 - the webhook may refuse connections while it starts
            last = e
        time.sleep(0.2)
    raise ClusterError(f"Kueue's webhooks not in use after {timeout}s: {last}")
