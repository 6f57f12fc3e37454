"""What the fault tests share: a ledger of every TrainJob the API server stored, the namespace
check that ends each fault test, the launcher as a subprocess, and a latency proxy.

The ledger is not the launcher's word: one watch on TrainJobs in every namespace, opened by
the test session, records each TrainJob the API server stores (uid, lineage labels, when it
appeared and when it went). Two TrainJobs of the same run, task and scope alive at once are a
duplicate; anything of a test's namespace still there when the test ends is a leak.

With ``KFP_TRAINER_RELIABILITY_LOG=<file>`` every fault test appends one JSON line there
(test, outcome, TrainJobs created, leaked, duplicated, seconds); ``hack/reliability.py``
runs the suite several times and sums the lines up.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from kfp_trainer import spec
from kfp_trainer.backends.kube.client import Client
from kfp_trainer.backends.kube.watch import watch

RELIABILITY_LOG = "KFP_TRAINER_RELIABILITY_LOG"
JOBSET_LABEL = "jobset.sigs.k8s.io/jobset-name"


# ----------------------------------------------------------------------------- the ledger


@dataclass
class Entry:
    """One TrainJob as the API server stored it."""

    namespace: str
    name: str
    uid: str
    lineage: tuple[str, str, str]  # run, task, scope
    added: float
    deleted: float | None = None


@dataclass
class Ledger:
    """Every TrainJob stored while the session runs, from a watch of all namespaces."""

    api: Client
    entries: dict[str, Entry] = field(default_factory=dict)
    lock: threading.Lock = field(default_factory=threading.Lock)
    synced: threading.Event = field(default_factory=threading.Event)
    version: str = ""
    handle: Any = None

    def start(self) -> Ledger:
        from kfp_trainer.backends.kube.watch import Handle

        self.handle = Handle()
        threading.Thread(target=self._run, name="ledger", daemon=True).start()
        if not self.synced.wait(30):
            raise AssertionError("the TrainJob ledger did not start")
        return self

    def _run(self) -> None:
        path = f"/apis/{spec.GROUP}/{spec.VERSION}/{spec.PLURAL}"
        for event in watch(self.api, path, [], timeout_seconds=60, handle=self.handle):
            if event is None:
                continue
            kind, obj = event
            now = time.time()
            with self.lock:
                if kind == "LIST":
                    live = {o["metadata"]["uid"] for o in obj.get("items") or []}
                    for o in obj.get("items") or []:
                        self._add(o, now)
                    for e in self.entries.values():  # gone while the watch relisted
                        if e.deleted is None and e.uid not in live:
                            e.deleted = now
                    self.synced.set()
                elif kind in ("ADDED", "MODIFIED"):
                    self._add(obj, now)
                elif kind == "DELETED":
                    self._add(obj, now).deleted = now

    def close(self) -> None:
        self.handle.close()

    def _add(self, obj: dict[str, Any], now: float) -> Entry:
        meta = obj["metadata"]
        entry = self.entries.get(meta["uid"])
        if entry is None:
            labels = meta.get("labels") or {}
            lineage = (labels.get(spec.LABEL_RUN, ""), labels.get(spec.LABEL_TASK, ""), labels.get(spec.LABEL_SCOPE, ""))
            entry = self.entries[meta["uid"]] = Entry(meta["namespace"], meta["name"], meta["uid"], lineage, now)
        return entry

    def created(self, namespace: str) -> list[Entry]:
        """TrainJobs stored in ``namespace`` so far."""
        with self.lock:
            return [e for e in self.entries.values() if e.namespace == namespace]

    def wait_caught_up(self, namespace: str, timeout: float = 10) -> None:
        """Until the ledger has seen every TrainJob the namespace holds now (and their deletions)."""
        deadline = time.monotonic() + timeout
        while True:
            live = {j["metadata"]["uid"] for j in list_kind(self.api, namespace, "TrainJob")}
            with self.lock:
                known = {e.uid for e in self.entries.values() if e.namespace == namespace and e.deleted is None}
            if live == known or time.monotonic() > deadline:
                return
            time.sleep(0.1)

    def duplicates(self, namespace: str) -> list[tuple[Entry, Entry]]:
        """Pairs of TrainJobs of one run, task and scope that were alive at the same time."""
        entries = sorted(self.created(namespace), key=lambda e: e.added)
        pairs = []
        for i, a in enumerate(entries):
            for b in entries[i + 1 :]:
                if a.lineage == b.lineage and a.lineage[:2] != ("", "") and (a.deleted is None or a.deleted > b.added):
                    pairs.append((a, b))
        return pairs


# ----------------------------------------------------------------------------- what is left

KINDS = {
    "TrainJob": f"/apis/{spec.GROUP}/{spec.VERSION}/namespaces/{{ns}}/{spec.PLURAL}",
    "JobSet": "/apis/jobset.x-k8s.io/v1alpha2/namespaces/{ns}/jobsets",
    "Job": "/apis/batch/v1/namespaces/{ns}/jobs",
    "Pod": "/api/v1/namespaces/{ns}/pods",
}


def list_kind(api: Client, namespace: str, kind: str, selector: str = "") -> list[dict[str, Any]]:
    query = [("labelSelector", selector)] if selector else []
    return list(api.request("GET", KINDS[kind].format(ns=namespace), query=query, timeout=30).get("items") or [])


def leftovers(api: Client, namespace: str, selector: str = "", kinds: tuple[str, ...] = tuple(KINDS)) -> list[str]:
    """``Kind/name`` of every TrainJob, JobSet, Job and pod in ``namespace`` (matching ``selector``)."""
    return [f"{kind}/{o['metadata']['name']}" for kind in kinds for o in list_kind(api, namespace, kind, selector)]


def wait_nothing_left(api: Client, namespace: str, *, within: float, selector: str = "") -> float:
    """Seconds until nothing is left in ``namespace``; fails with what is left after ``within``."""
    started = time.monotonic()
    while True:
        left = leftovers(api, namespace, selector)
        if not left:
            return time.monotonic() - started
        if time.monotonic() - started > within:
            raise AssertionError(f"still in namespace {namespace} after {within}s: {left}")
        time.sleep(0.1)


# ----------------------------------------------------------------------------- the launcher as a process


def launch_argv(kubeconfig: str, namespace: str, run_id: str, *extra: str, task: str = "train") -> list[str]:
    return [
        sys.executable,
        "-m",
        "kfp_trainer.cli",
        "launch",
        "--kubeconfig",
        kubeconfig,
        "--namespace",
        namespace,
        "--runtime",
        "torch-distributed",
        "--run-id",
        run_id,
        "--task-name",
        task,
        *extra,
    ]


def start_launch(kubeconfig: str, namespace: str, run_id: str, *extra: str, task: str = "train") -> subprocess.Popen:
    """``kfp-trainer launch`` as a process; stdout and stderr together, line-buffered text."""
    return subprocess.Popen(
        launch_argv(kubeconfig, namespace, run_id, *extra, task=task),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={**os.environ, "PYTHONUNBUFFERED": "1"},
    )


class Output:
    """A process's output read in a thread, so a test can wait for a line and still get all of it."""

    def __init__(self, proc: subprocess.Popen) -> None:
        self.proc = proc
        self.lines: list[str] = []
        self.changed = threading.Condition()
        self.thread = threading.Thread(target=self._read, daemon=True)
        self.thread.start()

    def _read(self) -> None:
        for line in self.proc.stdout:  # type: ignore[union-attr]
            with self.changed:
                self.lines.append(line.rstrip("\n"))
                self.changed.notify_all()
        with self.changed:
            self.changed.notify_all()

    def wait_for(self, text: str, timeout: float = 60) -> str:
        """The first line containing ``text``; fails if the process ends or time runs out first."""
        deadline = time.monotonic() + timeout
        with self.changed:
            while True:
                found = next((line for line in self.lines if text in line), None)
                if found is not None:
                    return found
                if not self.thread.is_alive():
                    raise AssertionError(f"the launcher ended (rc {self.proc.poll()}) before printing {text!r}:\n{self.text}")
                left = deadline - time.monotonic()
                if left <= 0:
                    raise AssertionError(f"no {text!r} within {timeout}s:\n{self.text}")
                self.changed.wait(min(left, 0.5))

    def finish(self, timeout: float = 90) -> int:
        try:
            rc = self.proc.wait(timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            raise AssertionError(f"the launcher did not end within {timeout}s:\n{self.text}") from None
        self.thread.join(10)
        return rc

    @property
    def text(self) -> str:
        with self.changed:
            return "\n".join(self.lines)


def relayed(text: str) -> list[str]:
    """The trainer's lines the launcher relayed (its own messages and the errors left out)."""
    out = []
    for line in text.splitlines():
        if line.startswith(("[kfp-trainer]", "  ", "error:", "WARNING", "INFO", "{", "Traceback")) or not line.strip():
            continue
        out.append(line)
    return out


def trainjob_name(text: str) -> str:
    """The TrainJob name a launcher announced (``created``/``adopted`` ``TrainJob ns/name``)."""
    for line in text.splitlines():
        for verb in ("created TrainJob ", "adopted existing TrainJob ", "replaced failed TrainJob "):
            if verb in line:
                return line.split(verb, 1)[1].split(" ", 1)[0].split("/", 1)[1]
    raise AssertionError(f"no TrainJob announced in:\n{text}")


def kubeconfig_via(kubeconfig: str, port: int, dest: Path) -> str:
    """A copy of ``kubeconfig`` whose server is 127.0.0.1:``port`` (a proxy in front of the API server)."""
    import yaml

    kc = yaml.safe_load(Path(kubeconfig).read_text())
    for c in kc["clusters"]:
        c["cluster"]["server"] = f"https://127.0.0.1:{port}"
    dest.write_text(yaml.safe_dump(kc))
    return str(dest)


def api_via(kubeconfig: str, port: int) -> Client:
    """The backend's client for ``kubeconfig`` talking to 127.0.0.1:``port`` (its server there, in a kubeconfig of its own)."""
    import tempfile

    from k8s_objects import kube_client

    return kube_client(kubeconfig_via(kubeconfig, port, Path(tempfile.mkdtemp(prefix="kfp-trainer-via-")) / "kubeconfig"))


def stop(proc: subprocess.Popen, sig: int = signal.SIGTERM) -> None:
    if proc.poll() is None:
        proc.send_signal(sig)


def record(entry: dict[str, Any]) -> None:
    """Append one fault test's figures to the reliability log, when one is asked for."""
    path = os.environ.get(RELIABILITY_LOG)
    if path:
        with open(path, "a", encoding="utf-8") as f:
            f.write(json.dumps(entry) + "\n")


class Seen:
    """Every object of ``kind`` in ``namespace`` the API server shows while it runs (uid -> name)."""

    def __init__(self, api: Client, namespace: str, kind: str = "JobSet") -> None:
        from kfp_trainer.backends.kube.watch import Handle

        self.uids: dict[str, str] = {}
        self.handle = Handle()
        self.synced = threading.Event()
        self.path = KINDS[kind].format(ns=namespace)
        self.api = api
        threading.Thread(target=self._run, daemon=True).start()
        if not self.synced.wait(30):
            raise AssertionError(f"no watch of {self.path}")

    def _run(self) -> None:
        try:
            for event in watch(self.api, self.path, [], timeout_seconds=30, handle=self.handle):
                if event is None:
                    continue
                kind, obj = event
                for o in obj.get("items") or [] if kind == "LIST" else [obj]:
                    self.uids.setdefault(o["metadata"]["uid"], o["metadata"]["name"])
                self.synced.set()
        except Exception:  # the test asserts on what was seen; a dead watch shows as a missed object
            self.synced.set()

    def close(self) -> dict[str, str]:
        self.handle.close()
        return dict(self.uids)
