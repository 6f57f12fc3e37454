"""One submitted local TrainJob: its handle (:class:`LocalJob`), its supervision, and the reading of its state file.

:meth:`LocalBackend.submit <kfp_trainer.backends.local.LocalBackend.submit>` makes one per job,
given the job's folder and, for a job this process started, its :class:`Supervised` record
(the node processes and the thread that supervises them); the handle reads nothing of the
backend. A job started by this process is followed through its supervisor (woken on each
status change); one adopted from another process through its state file,
``<job>/trainjob.json``, whose supervisor is checked on each read (:func:`orphaned`).
"""

from __future__ import annotations

import json
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

from ..cancel import TICK
from ..jobstatus import JobRef, JobStatus, Phase
from ..kube_types import TrainJob
from .base import Blocker, JobHandle, LogLine, LogSink, trainjob_status
from .procs import ProcessId, kill_process, kill_tree, signal_all

__all__ = ["LocalJob", "Supervised", "node_processes", "orphaned", "read_json", "remove_job"]


class Supervised:
    """A local TrainJob this process runs: its node processes and supervisor thread."""

    def __init__(self, directory: Path) -> None:
        self.dir = directory
        self.procs: dict[int, subprocess.Popen[bytes]] = {}
        self.cancelled = threading.Event()
        self.changed = threading.Event()  # set on every status change, for watchers in this process
        self.exited = threading.Event()  # set when a node process exits (the supervisor records it at once)
        self.thread: threading.Thread | None = None

    def stop(self, wait: float) -> None:
        """Stop the nodes (each with every process it started) and wait up to ``wait`` seconds for the supervisor."""
        self.cancelled.set()
        for proc in self.procs.values():
            kill_group(proc)
        if self.thread is not None and self.thread is not threading.current_thread():
            self.thread.join(wait)


def kill_group(proc: subprocess.Popen[bytes]) -> None:
    """Stop one node: its leader and every process it started."""
    kill_tree(proc.pid, reap=proc)


def remove_job(directory: Path, supervised: Supervised | None, *, wait: float = 30.0) -> None:
    """Stop a local job's processes -- through its supervisor here, else by the pids its state names -- and remove its folder."""
    if supervised is not None:
        supervised.stop(wait)
    else:
        obj = read_json(directory / "trainjob.json") or {}
        for process in node_processes(obj.get("status") or {}):
            kill_process(process)  # only if the pid still names that process
    shutil.rmtree(directory, ignore_errors=True)


def read_json(path: Path) -> TrainJob | None:
    """The TrainJob in the state file ``path``; None when it is missing or half written.

    Its ``status`` also holds this backend's own fields: ``supervisor``, ``processes`` and ``exitCodes``.
    """
    try:
        found: TrainJob | None = json.loads(path.read_text())
        return found
    except (OSError, ValueError):
        return None


def node_processes(status: Mapping[str, Any]) -> list[ProcessId]:
    """The job's node processes (pid and start time; bare pids from older state files)."""
    found = [ProcessId.from_json(v) for v in status.get("processes") or status.get("pids") or []]
    return [p for p in found if p is not None]


def orphaned(obj: TrainJob) -> ProcessId | None:
    """The dead supervisor of an unfinished job (nobody will ever record its end), else None."""
    if trainjob_status(obj).phase.finished:
        return None
    supervisor = ProcessId.from_json((obj.get("status") or {}).get("supervisor"))
    if supervisor is None:
        return ProcessId(0, 0)  # written by a version that did not record it: nobody can vouch for it
    return None if supervisor.alive() else supervisor


class LocalJob(JobHandle):
    """The handle of one local TrainJob.

    Args:
        ref: The job.
        directory: Its folder (state file, logs, workspace).
        supervised: Its supervision when this process runs it (woken on each status change);
            None for a job another process supervises (its state file is all there is).
    """

    def __init__(self, ref: JobRef, directory: Path, *, supervised: Supervised | None = None) -> None:
        super().__init__(ref)
        self.dir = directory
        self.supervised = supervised
        self.changed = supervised.changed if supervised is not None else None

    def watch(self) -> Iterator[JobStatus | None]:
        """Status changes read from the job's state file; ``None`` as heartbeat, a few times a second.

        A job adopted from another process is followed through its state file, and that
        process (its supervisor) is checked on each read: when it is gone, nobody will record
        the job's end, so its nodes are stopped and the job is reported failed.
        """
        path = self.dir / "trainjob.json"
        last: tuple[Any, ...] | None = None
        while True:
            if self.changed is not None:
                self.changed.clear()  # before the read: a change written after it wakes the wait below
            obj = read_json(path)
            if obj is not None and self.ref.uid and obj["metadata"].get("uid") != self.ref.uid:
                obj = None
            dead = orphaned(obj) if obj is not None and self.changed is None else None
            if obj is not None and dead is not None:
                for process in node_processes(obj.get("status") or {}):
                    kill_process(process)
                message = f"the launcher supervising this local TrainJob (pid {dead.pid}) is gone; its nodes were stopped"
                yield JobStatus(Phase.FAILED, "SupervisorLost", message, obj.get("status") or {})
                return
            status = trainjob_status(obj)
            key = (status.phase, status.reason, status.message)
            if key != last:
                last = key
                yield status
                if status.phase.finished:
                    return
            else:
                yield None
            if self.changed is not None:  # supervised by this process: wake up on each change
                self.changed.wait(2 * TICK)  # short: the launcher looks at its stop token at each heartbeat
            else:
                time.sleep(2 * TICK)

    def blockers(self) -> list[Blocker]:
        """Nothing blocks a local job from starting once submit accepted it."""
        return []

    def follow_logs(self, *, nodes: str, sink: LogSink, stop: threading.Event) -> None:
        """Tail the nodes' log files until the job finishes (and the files are read) or ``stop``."""
        obj = read_json(self.dir / "trainjob.json") or {}
        count = int(((obj.get("spec") or {}).get("trainer") or {}).get("numNodes") or 1)
        indices = list(range(count)) if nodes == "all" else [int(nodes)]
        files = {i: self.dir / "logs" / f"node-{i}.log" for i in indices}
        offsets = dict.fromkeys(indices, 0)
        partial = dict.fromkeys(indices, b"")
        while True:
            finished = trainjob_status(read_json(self.dir / "trainjob.json")).phase.finished
            for i, path in files.items():
                try:
                    with open(path, "rb") as f:
                        f.seek(offsets[i])
                        data = f.read()
                except FileNotFoundError:
                    continue
                offsets[i] += len(data)
                lines = (partial[i] + data).split(b"\n")
                partial[i] = lines.pop()
                for line in lines:
                    sink(LogLine(f"node-{i}", line.decode("utf-8", errors="replace").rstrip("\r")))
            if finished or stop.is_set():
                for i in indices:
                    if partial[i]:
                        sink(LogLine(f"node-{i}", partial[i].decode("utf-8", errors="replace")))
                return
            stop.wait(0.2)

    def diagnose(self, *, tail: int = 40) -> str:
        """Exit codes of the nodes and the last lines of the log of the node that failed first."""
        obj = read_json(self.dir / "trainjob.json") or {}
        status: Mapping[str, Any] = obj.get("status") or {}  # with this backend's own fields
        codes = status.get("exitCodes") or {}
        failing = str(status.get("failedNode") or next((n for n, c in sorted(codes.items(), key=lambda x: int(x[0])) if c != 0), "0"))
        stopped = set(status.get("stoppedNodes") or [])
        parts = []
        if codes:
            parts.append("Nodes:\n" + "\n".join(
                f"  node-{n}: exit {c}" + (f" (stopped after node-{failing} failed)" if n in stopped else "")
                for n, c in sorted(codes.items(), key=lambda x: int(x[0]))))  # fmt: skip
        path = self.dir / "logs" / f"node-{failing}.log"
        if path.exists():
            lines = path.read_text(errors="replace").splitlines()[-tail:]
            parts.append(f"Last {len(lines)} log lines of node-{failing}:\n" + "\n".join("  " + line for line in lines))
        return "\n\n".join(parts)

    def request_delete(self) -> None:
        """SIGTERM the node processes this process runs, at once (torchrun stops its workers); :meth:`delete` makes sure."""
        if self.supervised is not None:
            self.supervised.cancelled.set()
            signal_all([proc.pid for proc in list(self.supervised.procs.values())], signal.SIGTERM)

    def delete(self, *, wait: float = 30.0) -> str | None:
        """Kill the job's whole process tree and remove its state."""
        remove_job(self.dir, self.supervised, wait=wait)
        return None

    def inspect_hint(self) -> str:
        """Where the local job's files are."""
        return f"  cat {self.dir}/trainjob.json\n  tail -f {self.dir}/logs/node-0.log"
