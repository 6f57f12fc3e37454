"""The garbage collector of a fresh cluster: restarting the controller manager once the
CRDs are in, and a probe that tells when TrainJob owners are handled."""

from __future__ import annotations

import contextlib
import os
import threading
import time
import uuid
from pathlib import Path

from .binaries import ClusterError
from .procs import restart_kwokctl_component

TRAINER_GROUP = "trainer.kubeflow.org"


def restart_controller_manager(cluster_dir: Path) -> None:
    """Restart kube-controller-manager with the same command line.

    Its garbage collector discovers resource kinds at start and then only every 30 s; a
    restart after the CRDs are installed makes it handle TrainJob and JobSet owners at once."""
    restart_kwokctl_component(cluster_dir, "kube-controller-manager")


class GcProbe:
    """Finds out in the background when the garbage collector handles TrainJob owners.

    A ConfigMap names a TrainJob that does not exist as its owner; the collector deletes
    such a dependent once it knows the TrainJob kind."""

    def __init__(self, new_api_client, started_at: float) -> None:
        self._new_api_client = new_api_client
        self._started_at = started_at
        self.ready = threading.Event()
        self.error: BaseException | None = None
        self.seconds_after_start: float | None = None
        threading.Thread(target=self._run, name="gc-probe", daemon=True).start()

    def wait(self, timeout: float = 60) -> None:
        if not self.ready.wait(timeout):
            raise ClusterError(f"garbage collector not handling TrainJobs after {timeout}s")
        if self.error is not None:
            raise ClusterError(f"garbage collector probe failed: {self.error!r}")

    def _run(self) -> None:
        try:
            self._probe()
        except BaseException as e:  # noqa: BLE001 - reported by wait()
            self.error = e
        finally:
            self.ready.set()

    def _probe(self, timeout: float = 90) -> None:
        from kubernetes import client
        from kubernetes.client.rest import ApiException

        api = self._new_api_client()
        try:
            core = client.CoreV1Api(api)
            ns = "kfp-trainer-gc-probe"
            with contextlib.suppress(ApiException):
                core.create_namespace({"metadata": {"name": ns}})
            name = f"gc-probe-{os.getpid()}-{int(time.time())}"
            owner = {"apiVersion": f"{TRAINER_GROUP}/v1alpha1", "kind": "TrainJob", "name": name, "uid": str(uuid.uuid4())}
            core.create_namespaced_config_map(ns, {"metadata": {"name": name, "ownerReferences": [owner]}})
            deadline = time.monotonic() + timeout
            while time.monotonic() < deadline:
                try:
                    core.read_namespaced_config_map(name, ns)
                except ApiException as e:
                    if e.status == 404:
                        self.seconds_after_start = time.monotonic() - self._started_at
                        return
                    raise
                time.sleep(0.5)
            raise ClusterError("garbage collector did not delete the probe's child")
        finally:
            api.close()
