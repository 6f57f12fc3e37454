#!/usr/bin/env python3
"""The pod scripting process of the test cluster: it writes the pods' logs.

Pods on KWOK nodes run no program; their KWOK stages (testcluster/stages/pod.yaml)
decide phases, exit codes and restarts. This process plays the containers' output:
for every pod bound to a node it keeps a log file in CRI format and a KWOK ``Logs``
object (owned by the pod) that makes the kwok controller serve it as the pod's first
container's log, and it writes the lines scripted on the pod
(testcluster/scripting.py) while the container runs. It tells the stages where it is
with two annotations on the pod:

* ``script.kfp-trainer.test/log-ready: "<n>"``: the log file of container instance
  ``n`` is in place and served (the stages start instance ``n`` only then);
* ``script.kfp-trainer.test/log-done: "<n>"``: instance ``n`` printed its lines (the
  stages let it exit only then).

At a crash (CrashLoopBackOff) the current file becomes the previous one
(``kubectl logs --previous``) and the next instance gets a new file.

Everything it needs is on the pods and on disk, so it survives its own restarts and the
API server's: any connection error ends in a relist after a short pause.

Pods bound to a node without the annotation ``kwok.x-k8s.io/node: fake`` (the real node,
whose kubelet runs them) are left alone.

    podscript.py --kubeconfig K --logs-dir D --kwok-port P
"""

from __future__ import annotations

import argparse
import http.client
import logging
import os
import shutil
import ssl
import sys
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from testcluster import scripting  # noqa: E402

log = logging.getLogger("podscript")
FAKE_NODE_ANNOTATION = "kwok.x-k8s.io/node"
RETRY = 0.5


def cri_line(text: str) -> str:
    t = time.time()
    stamp = time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(t)) + f".{int((t % 1) * 1e9):09d}Z"
    return f"{stamp} stdout F {text}\n"


class PodFiles:
    """The log files of one pod: current.log (the running or last instance), previous.log,
    other.log (every other container: empty) and ``instance`` (which instance current.log holds)."""

    def __init__(self, root: Path, ns: str, name: str, uid: str) -> None:
        self.dir = root / f"{ns}_{name}_{uid}"
        self.current = self.dir / "current.log"
        self.previous = self.dir / "previous.log"
        self.other = self.dir / "other.log"
        self.marker = self.dir / "instance"

    def ensure(self) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        for f in (self.current, self.previous, self.other):
            f.touch()
        if not self.marker.exists():
            self.marker.write_text("0")

    def instance(self) -> int:
        try:
            return int(self.marker.read_text())
        except (OSError, ValueError):
            return 0

    def lines_written(self) -> int:
        try:
            with open(self.current, "rb") as f:
                return sum(1 for _ in f)
        except OSError:
            return 0

    def rotate_to(self, instance: int) -> None:
        """current.log becomes previous.log; an empty current.log for ``instance``."""
        if self.instance() >= instance:
            return
        os.replace(self.current, self.previous)
        self.current.touch()
        self.marker.write_text(str(instance))


class PodScripter:
    def __init__(self, kubeconfig: str, logs_dir: Path, kwok_port: int) -> None:
        from kubernetes import client, config

        self.api = config.new_client_from_config(config_file=kubeconfig)
        self.core = client.CoreV1Api(self.api)
        self.custom = client.CustomObjectsApi(self.api)
        self.logs_dir = logs_dir
        self.kwok_port = kwok_port
        self.lock = threading.Lock()
        self.busy: set[tuple[str, str]] = set()  # (uid, task) being worked on
        self.known: dict[str, tuple[str, str]] = {}  # uid -> (namespace, name)
        self.fake_nodes: dict[str, bool] = {}  # node name -> played by KWOK
        self.stop = threading.Event()

    # ------------------------------------------------------------------ watch
    def run(self) -> None:
        from kubernetes import watch

        rv = None
        while not self.stop.is_set():
            try:
                if rv is None:
                    pods = self.core.list_pod_for_all_namespaces(field_selector="spec.nodeName!=")
                    rv = pods.metadata.resource_version
                    seen = set()
                    for p in pods.items:
                        seen.add(p.metadata.uid)
                        self.handle("ADDED", p)
                    for uid in set(self.known) - seen:
                        self.forget(uid)
                w = watch.Watch()
                for ev in w.stream(
                    self.core.list_pod_for_all_namespaces,
                    field_selector="spec.nodeName!=",
                    resource_version=rv,
                    timeout_seconds=60,
                    allow_watch_bookmarks=True,
                ):
                    if self.stop.is_set():
                        w.stop()
                        break
                    if ev["type"] == "ERROR":
                        rv = None
                        break
                    obj = ev["object"]
                    if isinstance(obj, dict):  # a bookmark the client did not turn into a V1Pod
                        rv = (obj.get("metadata") or {}).get("resourceVersion") or rv
                        continue
                    rv = obj.metadata.resource_version or rv
                    if ev["type"] != "BOOKMARK":
                        try:
                            self.handle(ev["type"], obj)
                        except Exception:  # noqa: BLE001 - one odd pod must not stop the others
                            log.exception("pod %s/%s", obj.metadata.namespace, obj.metadata.name)
            except Exception as e:  # noqa: BLE001 - API server gone, 410, resets: relist
                log.info("watch interrupted (%s); relisting", type(e).__name__)
                rv = None
                self.stop.wait(RETRY)

    def forget(self, uid: str) -> None:
        ns_name = self.known.pop(uid, None)
        if ns_name:
            shutil.rmtree(PodFiles(self.logs_dir, *ns_name, uid).dir, ignore_errors=True)

    def handle(self, typ: str, pod) -> None:
        md = pod.metadata
        if typ == "DELETED":
            self.forget(md.uid)
            return
        if md.deletion_timestamp is not None or not self.is_fake_node(pod.spec.node_name):
            return
        self.known[md.uid] = (md.namespace, md.name)
        ann = md.annotations or {}
        statuses = pod.status.container_statuses or []
        if scripting.LOG_READY not in ann:
            self.spawn(md.uid, "prepare", self.prepare, pod)
            return
        if not statuses:
            return
        first = statuses[0]
        n = first.restart_count or 0
        if first.state and first.state.running and ann.get(scripting.LOG_DONE) != str(n) and ann.get(scripting.LOG_READY) == str(n):
            self.spawn(md.uid, f"write-{n}", self.write, pod, n)
        waiting = first.state.waiting if first.state else None
        if waiting and waiting.reason == "CrashLoopBackOff" and ann.get(scripting.LOG_READY) == str(n):
            self.spawn(md.uid, f"rotate-{n}", self.rotate, pod, n)

    def is_fake_node(self, name: str) -> bool:
        """Whether KWOK plays node ``name`` (annotated ``kwok.x-k8s.io/node: fake``); a real
        kubelet runs the pods of any other."""
        if name not in self.fake_nodes:
            from kubernetes.client.rest import ApiException

            try:
                node = self.core.read_node(name)
            except ApiException as e:
                if e.status != 404:
                    raise
                return False  # not registered yet: ask again at the pod's next event
            self.fake_nodes[name] = (node.metadata.annotations or {}).get(FAKE_NODE_ANNOTATION) == "fake"
        return self.fake_nodes[name]

    def spawn(self, uid: str, task: str, fn, *args) -> None:
        key = (uid, task)
        with self.lock:
            if key in self.busy:
                return
            self.busy.add(key)

        def run() -> None:
            try:
                while not self.stop.is_set():
                    try:
                        fn(*args)
                        return
                    except Exception as e:  # noqa: BLE001 - retried until it works or the pod is gone
                        if getattr(e, "status", None) == 404:
                            return
                        log.info("%s %s: %r; retrying", task, args[0].metadata.name, e)
                        self.stop.wait(RETRY)
            finally:
                with self.lock:
                    self.busy.discard(key)

        threading.Thread(target=run, name=f"{task}-{args[0].metadata.name}", daemon=True).start()

    # ------------------------------------------------------------------ steps
    def files(self, pod) -> PodFiles:
        md = pod.metadata
        return PodFiles(self.logs_dir, md.namespace, md.name, md.uid)

    def annotate(self, pod, key: str, value: str) -> None:
        md = pod.metadata
        self.core.patch_namespaced_pod(md.name, md.namespace, {"metadata": {"annotations": {key: value}}})

    def prepare(self, pod) -> None:
        """Log files and the Logs object for a newly bound pod; then log-ready 0."""
        md = pod.metadata
        files = self.files(pod)
        files.ensure()
        containers = [c.name for c in pod.spec.containers]
        body = {
            "apiVersion": "kwok.x-k8s.io/v1alpha1",
            "kind": "Logs",
            "metadata": {
                "name": md.name,
                "namespace": md.namespace,
                "ownerReferences": [{"apiVersion": "v1", "kind": "Pod", "name": md.name, "uid": md.uid}],
            },
            "spec": {
                "logs": [
                    {"containers": containers[:1], "logsFile": str(files.current), "previousLogsFile": str(files.previous), "follow": True},
                    {"logsFile": str(files.other), "previousLogsFile": str(files.other), "follow": True},
                ]
            },
        }
        from kubernetes.client.rest import ApiException

        try:
            self.custom.create_namespaced_custom_object("kwok.x-k8s.io", "v1alpha1", md.namespace, "logs", body)
        except ApiException as e:
            if e.status != 409:
                raise
        self.wait_served(md.namespace, md.name, containers[0])
        self.annotate(pod, scripting.LOG_READY, "0")

    def wait_served(self, ns: str, name: str, container: str, timeout: float = 10) -> None:
        """Until the kwok controller (which learns of Logs objects by watch) serves the log."""
        ctx = ssl.create_default_context()
        ctx.check_hostname = False
        ctx.verify_mode = ssl.CERT_NONE
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline and not self.stop.is_set():
            conn = http.client.HTTPSConnection("127.0.0.1", self.kwok_port, context=ctx, timeout=5)
            try:
                conn.request("GET", f"/containerLogs/{ns}/{name}/{container}?limitBytes=1")
                resp = conn.getresponse()
                resp.read()
                if resp.status == 200:
                    return
            except OSError:
                pass
            finally:
                conn.close()
            time.sleep(0.05)
        raise TimeoutError(f"kwok does not serve the log of {ns}/{name}")

    def write(self, pod, instance: int) -> None:
        """Print instance ``instance``'s lines (resuming after a restart of this process); then log-done."""
        files = self.files(pod)
        script = scripting.instance_log(pod.metadata.annotations or {}, instance)
        done = files.lines_written() if files.instance() == instance else 0
        with open(files.current, "a") as f:
            for i, line in enumerate(script.lines[done:]):
                if (done or i) and self.stop.wait(script.line_delay):
                    return
                f.write(cri_line(line))
                f.flush()
        self.annotate(pod, scripting.LOG_DONE, str(instance))

    def rotate(self, pod, instance: int) -> None:
        """After instance ``instance`` crashed: a fresh log for the next one; then log-ready."""
        self.files(pod).rotate_to(instance + 1)
        self.annotate(pod, scripting.LOG_READY, str(instance + 1))


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kubeconfig", required=True)
    ap.add_argument("--logs-dir", required=True, type=Path)
    ap.add_argument("--kwok-port", required=True, type=int)
    args = ap.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(message)s", stream=sys.stdout)
    args.logs_dir.mkdir(parents=True, exist_ok=True)
    scripter = PodScripter(args.kubeconfig, args.logs_dir, args.kwok_port)
    log.info("pod scripting started")
    try:
        scripter.run()
    except KeyboardInterrupt:
        pass
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
