"""The local backend: runs a TrainJob on this machine, as the Trainer controller would.

For one TrainJob manifest it:

1. runs the initializers: ``spec.initializer.dataset/model.storageUri`` (``builtin://``,
   ``file://``, ``hf://``, ``s3://``, see :mod:`kfp_trainer.storage`) into
   ``<job>/workspace/dataset`` and ``.../model``;
2. starts ``numNodes`` local "nodes", each the trainer command in its own process group,
   with the environment the Trainer controller injects for torch runtimes (``PET_NNODES``,
   ``PET_NPROC_PER_NODE``, ``PET_NODE_RANK``, ``PET_MASTER_ADDR=127.0.0.1``,
   ``PET_MASTER_PORT``), so ``torchrun`` rendezvouses across them; plain runtimes run the
   command as it is;
3. records state in ``<job>/status.json`` (a TrainJob-shaped ``status``) and each node's
   output in ``<job>/logs/node-<i>.log``.

Paths starting with ``/workspace`` in the command, args and env are mapped to the job's
local workspace, so commands written for the Trainer runtimes' layout run unchanged.

State lives in files, so a second launcher (a retry) can adopt a running or finished job. A
job whose ``trainjob.json`` is removed under it is deleted, as a TrainJob deleted by someone
else: its supervisor stops its nodes and never writes the record again, and the step that
follows it fails (``DeletedWhileRunning``). The
state names the launcher process that supervises the job, and each node process, by pid and
start time (:mod:`kfp_trainer.backends.procs`): a retry that finds the supervisor gone (killed,
or its pid now held by another process) replaces the job, and a launcher following an adopted
job reports it failed (``SupervisorLost``) when its supervisor dies -- nobody would ever record
its end otherwise.
Runtimes: ``torch-distributed`` and the Trainer's torchtune runtimes are built in (a torchtune
runtime's nodes run its own ``tune run`` command, see :mod:`.local_torchtune`);
ClusterTrainingRuntime/TrainingRuntime YAML files in ``runtimes_dir`` (or
``$KFP_TRAINER_RUNTIMES_DIR``) are read too, so local runs mirror a cluster's runtimes.
``hostPath`` volumes the trainer mounts under ``/workspace`` become links in the job's workspace.
:meth:`LocalBackend.submit` hands back the job's handle, a :class:`~.local_job.LocalJob`
(watch, logs, diagnosis); the backend keeps only the runs this process supervises, by namespace
and name, so that deleting by ref (a replaced or reclaimed job) stops their processes too.
"""

from __future__ import annotations

import dataclasses
import json
import logging
import os
import shlex
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from ..cancel import Stop
from ..errors import RuntimeNotFoundError, UserError
from ..jobstatus import JobRef, Phase
from ..spec import TrainJobInputs
from ..storage import fetch, redact
from ..timestamps import rfc3339
from . import local_torchtune
from .base import Backend, RuntimeInfo, Submission, check_ownership, trainjob_status
from .local_job import LocalJob, Supervised, kill_group, orphaned, read_json, remove_job
from .local_runtime import (
    BUILTIN_RUNTIMES,
    RUNTIMES_ENV,
    WORKSPACE,
    initializer_env,
    link_mounts,
    load_runtimes,
    map_workspace,
    node_env,
    trainer_command,
)
from .procs import ProcessId, descendants, free_port

__all__ = ["BUILTIN_RUNTIMES", "LocalBackend", "default_root", "descendants", "free_port"]

log = logging.getLogger(__name__)
ROOT_ENV = "KFP_TRAINER_LOCAL_ROOT"


def default_root() -> Path:
    """Where local TrainJobs keep their state: ``$KFP_TRAINER_LOCAL_ROOT`` or a user cache dir."""
    env = os.environ.get(ROOT_ENV)
    return Path(env) if env else Path.home() / ".cache" / "kfp-trainer" / "local-jobs"


def _write_json(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(data, indent=1))
    tmp.replace(path)


class LocalBackend(Backend):
    """Runs TrainJobs as local processes. See the module docstring."""

    local = True

    def __init__(self, root: str | Path | None = None, *, runtimes_dir: str | Path | None = None, namespace: str = "local") -> None:
        self.root = Path(root) if root else default_root()
        env_dir = os.environ.get(RUNTIMES_ENV)
        self.runtimes_dir = Path(runtimes_dir) if runtimes_dir else (Path(env_dir) if env_dir else None)
        self.namespace = namespace
        self.jobs: dict[tuple[str, str], Supervised] = {}  # the runs this process supervises, by (namespace, name)

    # ------------------------------------------------------------------ runtimes
    def default_namespace(self) -> str:
        """Local jobs live under one namespace folder."""
        return self.namespace

    def runtimes(self) -> dict[str, dict[str, Any]]:
        """Built-in runtimes plus those in ``runtimes_dir`` (YAML), by ``Kind/name``."""
        return load_runtimes(self.runtimes_dir)

    def resolve_runtime(self, inputs: TrainJobInputs) -> RuntimeInfo:
        """Find the runtime among the built-in and configured ones."""
        runtimes = self.runtimes()
        key = f"{inputs.runtime_kind}/{inputs.runtime}"
        if key not in runtimes:
            where = f" and {self.runtimes_dir}" if self.runtimes_dir else f" (set {RUNTIMES_ENV} to a folder of runtime YAML)"
            raise RuntimeNotFoundError(f"runtime: {key} is not a local runtime. Available (built in{where}): {', '.join(sorted(runtimes))}")
        info = RuntimeInfo.from_runtime(
            runtimes[key], name=inputs.runtime, kind=inputs.runtime_kind, api_version="v2.2", num_nodes=inputs.num_nodes
        )
        # A local job is this user's processes on this machine: host paths are what it sees anyway.
        return dataclasses.replace(info, allow_host_access=True)

    # ------------------------------------------------------------------ paths
    def job_dir(self, ref: JobRef) -> Path:
        """Folder holding the job's manifest, status, logs and workspace."""
        return self.root / ref.namespace / ref.name

    def host_path(self, ref: JobRef, path: str) -> Path:
        """Map a path as the trainer sees it (``/workspace/...``) to this machine."""
        return Path(map_workspace(path, self.job_dir(ref) / "workspace"))

    # ------------------------------------------------------------------ lifecycle
    def _runtime_doc(self, manifest: dict[str, Any]) -> dict[str, Any]:
        ref = manifest["spec"]["runtimeRef"]
        return self.runtimes().get(f"{ref.get('kind', 'ClusterTrainingRuntime')}/{ref['name']}") or {}

    def submit(self, manifest: dict[str, Any], *, runtime: RuntimeInfo | None = None, stop: Stop | None = None) -> Submission:
        """Start the job, or adopt this task's earlier one (replacing it if it failed)."""
        namespace = manifest["metadata"].get("namespace") or self.namespace
        ref = JobRef(namespace, manifest["metadata"]["name"])
        directory = self.job_dir(ref)
        workspace = directory / "workspace"
        runtime_doc = self._runtime_doc(manifest)
        if local_torchtune.is_torchtune(runtime_doc):
            local_torchtune.check_available(manifest["spec"]["runtimeRef"]["name"])
        command = trainer_command(manifest, runtime_doc, workspace)  # fails before anything starts
        existing = read_json(directory / "trainjob.json")
        replaced = False
        notes: list[str] = []
        if existing is not None:
            check_ownership(manifest, existing, remedy=f"remove {directory}")
            phase = trainjob_status(existing).phase
            dead = orphaned(existing)
            if phase is Phase.SUCCEEDED or (phase in (Phase.PENDING, Phase.RUNNING, Phase.SUSPENDED) and dead is None):
                adopted = JobRef(namespace, ref.name, existing["metadata"]["uid"])
                running = self.jobs.get((namespace, ref.name))  # supervised by this process, or by another one
                return Submission(LocalJob(adopted, directory, supervised=running), adopted=True)
            if dead is not None:
                who = f"pid {dead.pid}" if dead.pid else "not recorded"
                notes.append(f"local TrainJob {ref} was left unfinished by a launcher that is gone ({who}); replacing it")
            self.delete(ref)
            replaced = True
        (directory / "logs").mkdir(parents=True, exist_ok=True)
        workspace.mkdir(parents=True, exist_ok=True)
        uid = f"local-{os.getpid()}-{time.time_ns()}"
        obj = {
            **manifest,
            "metadata": {**manifest["metadata"], "namespace": namespace, "uid": uid, "creationTimestamp": rfc3339()},
            "status": {"conditions": [], "jobsStatus": [], "supervisor": ProcessId.of(os.getpid()).to_json()},
        }
        _write_json(directory / "trainjob.json", obj)
        job = Supervised(directory)
        self.jobs[(namespace, ref.name)] = job
        job.thread = threading.Thread(target=self._supervise, args=(ref, obj, command, job), name=f"local-{ref.name}", daemon=True)
        job.thread.start()
        ref = JobRef(namespace, ref.name, uid)
        return Submission(LocalJob(ref, directory, supervised=job), adopted=False, replaced=replaced, notes=tuple(notes))

    def reclaim(self, manifest: dict[str, Any], *, wait: float = 30.0) -> str | None:
        """After a cancel during :meth:`submit`: stop and remove this task's job if it was started."""
        ref = JobRef(manifest["metadata"].get("namespace") or self.namespace, manifest["metadata"]["name"])
        existing = read_json(self.job_dir(ref) / "trainjob.json")
        if existing is None:
            return None
        mine, theirs = manifest["metadata"].get("labels") or {}, existing["metadata"].get("labels") or {}
        if mine != theirs:
            return None
        self.delete(ref, wait=wait)
        return f"deleted local TrainJob {ref}"

    def _set_status(self, job: Supervised, obj: dict[str, Any], **status: Any) -> None:
        obj["status"].update(status)
        if not _recorded(job.dir, obj):  # deleted by someone else: never written again
            return
        _write_json(job.dir / "trainjob.json", obj)
        job.changed.set()

    def _finish(self, job: Supervised, obj: dict[str, Any], kind: str, reason: str, message: str) -> None:
        condition = {"type": kind, "status": "True", "reason": reason, "message": message, "lastTransitionTime": rfc3339()}
        self._set_status(job, obj, conditions=[condition])

    def _supervise(self, ref: JobRef, obj: dict[str, Any], command: list[str], job: Supervised) -> None:
        """The job's thread: initializers, the nodes, their end recorded in the state file."""
        try:
            self._initialize(obj, job)
            if not self._start_nodes(obj, command, job):
                return
            codes, stopped = self._wait(job)
            if not job.cancelled.is_set():
                self._record_end(job, obj, codes, stopped)
        except UserError as e:
            with open(job.dir / "logs" / "node-0.log", "a") as out:
                out.write(f"initializer failed: {e}\n")
            self._finish(job, obj, "Failed", "InitializerFailed", str(e))
        except Exception as e:  # report, never leave the job Pending forever
            log.exception("local TrainJob %s failed to run", ref)
            self._finish(job, obj, "Failed", "LocalBackendError", f"{type(e).__name__}: {e}")

    def _initialize(self, manifest: dict[str, Any], job: Supervised) -> None:
        """Link the mounts and fetch the dataset and model into the workspace."""
        directory, workspace = job.dir, job.dir / "workspace"
        for line in link_mounts(manifest, workspace):
            with open(directory / "logs" / "node-0.log", "a") as out:
                out.write(f"{rfc3339()} mounted {line}\n")
        for kind in ("dataset", "model"):
            uri = ((manifest["spec"].get("initializer") or {}).get(kind) or {}).get("storageUri")
            if uri and not job.cancelled.is_set():
                with open(directory / "logs" / f"{kind}-initializer.log", "a") as out:
                    out.write(f"{rfc3339()} fetching {redact(uri)} into {WORKSPACE}/{kind}\n")
                fetch(uri, workspace / kind, kind=kind, env=initializer_env(manifest, kind))

    def _start_nodes(self, obj: dict[str, Any], command: list[str], job: Supervised) -> bool:
        """Start every node, each in its own process group; False when cancelled first."""
        directory, workspace = job.dir, job.dir / "workspace"
        runtime = self._runtime_doc(obj)
        policy = (runtime.get("spec") or {}).get("mlPolicy") or {}
        torch = "torch" in policy
        nodes = int((obj["spec"].get("trainer") or {}).get("numNodes") or policy.get("numNodes") or 1)
        env = node_env(obj, runtime, workspace, nodes)
        tune_port = free_port() if local_torchtune.is_torchtune(runtime) else 0
        for node in range(nodes):
            if job.cancelled.is_set():
                return False
            argv, node_vars = command, ({**env, "PET_NODE_RANK": str(node)} if torch else env)
            if tune_port:  # the runtime's own tune command, completed as the Trainer controller does
                argv, node_vars = local_torchtune.node_command(obj, runtime, workspace, node=node, master_port=tune_port)
                (directory / "logs" / f"node-{node}.command").write_text(shlex.join(argv) + "\n")  # not in the log: no metrics
            with open(directory / "logs" / f"node-{node}.log", "ab") as out:
                job.procs[node] = subprocess.Popen(
                    argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, cwd=workspace, env=node_vars,
                    start_new_session=True,
                )  # fmt: skip
            threading.Thread(target=_notify_exit, args=(job.procs[node], job.exited), name=f"node-{node}-exit", daemon=True).start()
        pids = [p.pid for p in job.procs.values()]
        self._set_status(
            job,
            obj,
            pids=pids,
            processes=[ProcessId.of(pid).to_json() for pid in pids],
            jobsStatus=[{"name": "node", "active": 1, "ready": 1, "succeeded": 0, "failed": 0}],  # JobSet's count: one Job runs the nodes
        )
        return True

    def _record_end(self, job: Supervised, obj: dict[str, Any], codes: dict[int, int], stopped: set[int]) -> None:
        """Write the nodes' exit codes and the job's end (Complete, or Failed naming the node that failed first).

        The nodes stopped because another failed are the consequence, not the cause: the first
        failed node is the lowest of those that ended on their own (``failedNode``), and the
        stopped ones are listed (``stoppedNodes``).
        """
        failed = {n: c for n, c in codes.items() if c != 0}
        jobs_status = [{"name": "node", "active": 0, "ready": 0, "succeeded": 0 if failed else 1, "failed": 1 if failed else 0}]
        first = min((n for n in failed if n not in stopped), default=min(failed, default=None))
        ended = {"failedNode": str(first), "stoppedNodes": sorted(map(str, stopped))} if first is not None else {}
        self._set_status(job, obj, jobsStatus=jobs_status, exitCodes={str(n): c for n, c in codes.items()}, **ended)
        if first is not None:
            self._finish(job, obj, "Failed", "FailedJobs", f"node-{first} exited with code {failed[first]}")
        else:
            self._finish(job, obj, "Complete", "AllJobsCompleted", "all nodes exited 0")

    def _wait(self, job: Supervised) -> tuple[dict[int, int], set[int]]:
        """Wait for every node; when one fails, stop the others (as JobSet's failure policy does).

        Returns every node's exit code, and the nodes stopped because another failed.
        """
        codes: dict[int, int] = {}
        stopped: set[int] = set()
        obj = read_json(job.dir / "trainjob.json") or {}
        while len(codes) < len(job.procs) and not job.cancelled.is_set():
            if not _recorded(job.dir, obj):  # its record was removed: the job is deleted, its nodes go with it
                job.cancelled.set()
                for proc in job.procs.values():
                    kill_group(proc)
                break
            for node, proc in job.procs.items():
                if node not in codes and proc.poll() is not None:
                    codes[node] = proc.returncode
            if any(c != 0 for c in codes.values()):
                for node, proc in job.procs.items():
                    if node not in codes:
                        kill_group(proc)
                        codes[node] = proc.returncode if proc.returncode is not None else -signal.SIGTERM
                        stopped.add(node)
                break
            if len(codes) == len(job.procs):
                break
            job.exited.wait(0.2)  # a node's exit wakes it at once; the record is looked at meanwhile
            job.exited.clear()
        return codes, stopped

    def delete(self, ref: JobRef, *, wait: float = 30.0) -> str | None:
        """Kill the job's whole process tree and remove its state."""
        remove_job(self.job_dir(ref), self.jobs.pop((ref.namespace, ref.name), None), wait=wait)
        return None


def _notify_exit(proc: subprocess.Popen[bytes], exited: threading.Event) -> None:
    """Set ``exited`` once ``proc`` has exited."""
    proc.wait()
    exited.set()


def _recorded(directory: Path, obj: Mapping[str, Any]) -> bool:
    """Whether the job's record is still there (not removed, nor replaced by another job's)."""
    path = directory / "trainjob.json"
    if not path.exists():  # written by rename: it never disappears while it is rewritten
        return False
    stored = read_json(path)
    return stored is None or (stored.get("metadata") or {}).get("uid") == (obj.get("metadata") or {}).get("uid")
