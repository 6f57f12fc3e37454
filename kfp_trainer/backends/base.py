"""The small protocol both backends implement, and the values they exchange with the launcher.

A backend knows how to run one TrainJob somewhere (a Kubernetes cluster, this machine) and
knows nothing of KFP. Submitting hands back a :class:`JobHandle`, the one place a submitted
job's state lives (its ref, the runtime it was rendered for, its watches); the launcher drives
the rest through it:

    info = backend.resolve_runtime(inputs)          # the runtime exists? which API version?
    manifest = spec.render(inputs, api_version=info.api_version, ...)
    sub = backend.submit(manifest, runtime=info, stop=stop)  # create, or adopt the job of an earlier try
    job = sub.job
    for status in job.watch(): ...                  # status changes; None = heartbeat
    job.follow_logs(nodes=..., sink=..., stop=...)  # in a thread
    job.diagnose()                                  # on failure: pods, events, log tail
    job.delete()                                    # on cancel, time limit, or clean-up
    job.release()                                   # stop what is kept running for it

The backend itself keeps no per-job state, and a handle reads nothing of its backend. Besides
``submit`` (which looks at the run's stop token, :class:`kfp_trainer.cancel.Stop`, where it
waits) it deletes a job it holds no handle for (``delete(ref)``: garbage collection, the command line) and ``reclaim(manifest,
wait=...)``, with a default that does nothing, deletes the job a cancelled
:meth:`~Backend.submit` may have created (and says what it did). The job's identity and status
types live in :mod:`kfp_trainer.jobstatus`.
"""

from __future__ import annotations

import abc
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from ..cancel import Stop
from ..errors import OwnershipError
from ..jobstatus import JobRef, JobStatus, Phase
from ..kube_types import TrainJob, TrainJobStatus
from ..spec import ALLOW_HOST_ACCESS_ANNOTATION, LABEL_DIGEST, LABEL_RUN, LABEL_TASK, ApiVersion, TrainJobInputs, dig
from .deletion import deleted_status


@dataclass(frozen=True)
class RuntimeInfo:
    """What the launcher needs to know about the referenced runtime and the API."""

    name: str
    kind: str
    api_version: ApiVersion
    replicated_jobs: tuple[tuple[str, int], ...] = ()  # (name, pods per job)
    framework: str = ""
    allow_host_access: bool = False  # the cluster admin allows host access (ClusterTrainingRuntime annotation)
    init_containers: tuple[tuple[str, tuple[str, ...]], ...] | None = None  # (replicated job, its init containers); None: unknown
    document: dict[str, Any] = field(default_factory=dict, compare=False, repr=False)  # the runtime object as read

    @classmethod
    def from_runtime(cls, runtime: dict[str, Any], *, name: str, kind: str, api_version: ApiVersion, num_nodes: int | None) -> RuntimeInfo:
        """Read a ClusterTrainingRuntime/TrainingRuntime object: its replicated jobs and pods per job.

        ``node`` runs ``num_nodes`` pods (the runtime's ``mlPolicy.numNodes`` when unset);
        other replicated jobs run their template's ``parallelism`` (1 when unset). Host access
        is allowed only by a ClusterTrainingRuntime annotated ``ALLOW_HOST_ACCESS_ANNOTATION: "true"``
        (namespace users can create TrainingRuntimes, so theirs cannot grant it).
        """
        spec = runtime.get("spec") or {}
        nodes = num_nodes or int((spec.get("mlPolicy") or {}).get("numNodes") or 1)
        jobs, inits = [], []
        for rj in dig(spec, "template", "spec", "replicatedJobs") or []:
            parallelism = dig(rj, "template", "spec", "parallelism")
            jobs.append((str(rj.get("name")), nodes if rj.get("name") == "node" else int(parallelism or 1)))
            containers = dig(rj, "template", "spec", "template", "spec", "initContainers") or []
            inits.append((str(rj.get("name")), tuple(str(c.get("name")) for c in containers if isinstance(c, dict))))
        return cls(
            name=name,
            kind=kind,
            api_version=api_version,
            replicated_jobs=tuple(jobs),
            framework=((runtime.get("metadata") or {}).get("labels") or {}).get("trainer.kubeflow.org/framework", ""),
            allow_host_access=kind == "ClusterTrainingRuntime"
            and dig(runtime, "metadata", "annotations", ALLOW_HOST_ACCESS_ANNOTATION) == "true",
            init_containers=tuple(inits),
            document=runtime,
        )

    @property
    def nodes(self) -> int:
        """Pods of the ``node`` replicated job (the trainer nodes)."""
        return dict(self.replicated_jobs).get("node", 1)

    @property
    def job_names(self) -> list[str]:
        """Names of the runtime's replicated jobs."""
        return [name for name, _ in self.replicated_jobs]

    @property
    def init_container_names(self) -> dict[str, list[str]] | None:
        """The init containers of each replicated job (what ``init_containers`` may patch); None when unknown."""
        return None if self.init_containers is None else {job: list(names) for job, names in self.init_containers}

    @property
    def trainer_job(self) -> str:
        """The replicated job whose pods run the trainer's entry point (``launcher`` for MPI)."""
        return "launcher" if "launcher" in self.job_names else "node"


@dataclass(frozen=True)
class Submission:
    """Result of :meth:`Backend.submit`: the job's handle, and how the job came to be."""

    job: JobHandle
    adopted: bool  # True when an earlier try's TrainJob was found and followed
    replaced: bool = False  # True when an earlier try's Failed TrainJob was replaced
    notes: tuple[str, ...] = ()  # what else submitting did, for the step's log (e.g. a stale job replaced)

    @property
    def ref(self) -> JobRef:
        """The submitted job."""
        return self.job.ref


@dataclass(frozen=True)
class Blocker:
    """Something that keeps a TrainJob from starting (unschedulable, image errors, ...)."""

    reason: str
    message: str
    fatal: bool = False  # True when waiting cannot help (e.g. resources cannot be created)

    def __str__(self) -> str:
        return f"{self.reason}: {self.message}"


@dataclass(frozen=True)
class LogLine:
    r"""Training output from one source (e.g. ``node-0``): ``count`` lines in order, ``text`` them joined by newlines.

    A backend hands the lines that arrived together as one (a followed log that comes fast),
    or one at a time (``count`` 1): a sink does per call what can be done once for many lines.

    Example:
        >>> LogLine("node-0", "step 1 loss=0.5\nstep 2 loss=0.4", 2).lines
        ['step 1 loss=0.5', 'step 2 loss=0.4']
    """

    source: str
    text: str
    count: int = 1

    @property
    def lines(self) -> list[str]:
        """The lines, one by one."""
        return self.text.split("\n") if self.count > 1 else [self.text]


LogSink = Callable[[LogLine], None]  # the one way a backend hands training output on


def trainjob_status(obj: TrainJob | None, trainer_job: str = "node") -> JobStatus:
    """Classify a stored TrainJob: finished, deleted, suspended, running or pending.

    A job that finished (Failed or Complete) keeps that end even while it is being deleted;
    one that is gone (``obj`` None) or being deleted before it finished is
    :data:`~kfp_trainer.jobstatus.Phase.DELETED` (:func:`~kfp_trainer.backends.deletion.deleted_status`).

    Example:
        >>> trainjob_status({"status": {"conditions": [
        ...     {"type": "Failed", "status": "True", "reason": "FailedJobs", "message": "x"}]}}).phase
        <Phase.FAILED: 'Failed'>
    """
    status = (obj or {}).get("status") or TrainJobStatus()
    conditions = {c.get("type"): c for c in status.get("conditions") or [] if c.get("status") == "True"}
    for kind, phase in (("Failed", Phase.FAILED), ("Complete", Phase.SUCCEEDED)):
        if kind in conditions:
            c = conditions[kind]
            return JobStatus(phase, c.get("reason", ""), c.get("message", ""), status)
    deleted = deleted_status(obj)
    if deleted is not None:
        return deleted
    if "Suspended" in conditions:
        c = conditions["Suspended"]
        return JobStatus(Phase.SUSPENDED, c.get("reason", ""), c.get("message", ""), status)
    for job in status.get("jobsStatus") or []:
        if job.get("name") == trainer_job and (job.get("ready") or job.get("succeeded") or job.get("failed")):
            return JobStatus(Phase.RUNNING, raw=status)
    if ((obj or {}).get("spec") or {}).get("suspend"):
        return JobStatus(Phase.SUSPENDED, "Suspended", "spec.suspend is true", status)
    return JobStatus(Phase.PENDING, raw=status)


class JobHandle(abc.ABC):
    """One submitted TrainJob and its own state: what :meth:`Backend.submit` hands back.

    It knows the job's ref and the runtime it was rendered for, and keeps what following it
    needs (watches, trackers); :meth:`release` stops those. The abstract methods are the
    contract; the others have a documented default that does nothing. The launcher calls
    every one of them.
    """

    def __init__(self, ref: JobRef) -> None:
        self.ref = ref

    @abc.abstractmethod
    def watch(self) -> Iterator[JobStatus | None]:
        """Yield the job's status whenever it changes, and ``None`` as a heartbeat.

        The heartbeat comes at least every :data:`kfp_trainer.cancel.TICK` seconds or so:
        the launcher looks at its stop token at each item (``Stop.check``).
        """

    @abc.abstractmethod
    def blockers(self) -> list[Blocker]:
        """What currently keeps the job from starting; empty when nothing does."""

    def queue_notes(self) -> list[str]:
        """What the job's queue (Kueue) reported since the last call, each message once. Default: none."""
        return []

    def pod_notes(self) -> list[str]:
        """What happened to the job's pods since the last call (a pod replaced, a container restarted), each once. Default: none."""
        return []

    @abc.abstractmethod
    def follow_logs(self, *, nodes: str, sink: LogSink, stop: threading.Event) -> None:
        """Send the trainer's log lines to ``sink`` until the job ends or ``stop`` is set.

        ``nodes`` is ``"0"`` (default), another node index, or ``"all"``.
        """

    @abc.abstractmethod
    def diagnose(self, *, tail: int = 40) -> str:
        """A report for a failed job: failed pods, recent events, last log lines."""

    @abc.abstractmethod
    def delete(self, *, wait: float = 30.0) -> str | None:
        """Delete the job and what it owns, and :meth:`release` it; no error if already gone. Runs to its end.

        Returns:
            What is still left after waiting up to ``wait`` seconds, and how to remove it
            (empty or None when everything is gone).
        """

    def request_delete(self) -> None:
        """Start the job's deletion at once and return without waiting for it; no error if already gone.

        The launcher calls it from a thread of its own the moment a stop is requested, while its
        flow may still be making other requests: it must be safe beside them. What it starts must
        finish without this process (a cluster's garbage collector does). :meth:`delete` follows,
        and waits. Default: nothing (:meth:`delete` does it all).
        """
        return None

    def release(self) -> None:
        """Stop whatever is kept running for the job once the launcher no longer follows it. Default: nothing."""
        return None

    @abc.abstractmethod
    def inspect_hint(self) -> str:
        """Commands a person can run to look at the job."""


class Backend(abc.ABC):
    """What the launcher needs from a place that runs TrainJobs.

    It keeps no per-job state: :meth:`submit` returns a :class:`JobHandle` that does. The
    abstract methods are the contract; :meth:`reclaim` has a documented default that does
    nothing, for a backend with nothing to do there.
    """

    local: bool = False  # runs jobs on this machine (the render allows what only makes sense there)

    @abc.abstractmethod
    def resolve_runtime(self, inputs: TrainJobInputs) -> RuntimeInfo:
        """Check the runtime exists and tell which Trainer API version to render for.

        Raises:
            RuntimeNotFoundError: With the runtimes that do exist.
        """

    @abc.abstractmethod
    def default_namespace(self) -> str:
        """Namespace to use when the inputs name none."""

    @abc.abstractmethod
    def submit(self, manifest: dict[str, Any], *, runtime: RuntimeInfo | None = None, stop: Stop | None = None) -> Submission:
        """Create the TrainJob, or adopt the one an earlier try of this task created.

        ``runtime`` is what the manifest was rendered for (:class:`kfp_trainer.prepare.PreparedJob`):
        the returned :attr:`Submission.job` keeps it (e.g. how many nodes' logs to follow).
        ``stop`` is the run's stop token, looked at before the create and where submitting waits.

        Raises:
            OwnershipError: A TrainJob of that name belongs to another run or task.
            CancelledError: A stop was requested before the create request, or while it was
                in flight (then :meth:`reclaim` deletes what it made).
        """

    @abc.abstractmethod
    def delete(self, ref: JobRef, *, wait: float = 30.0) -> str | None:
        """Delete a job this backend holds no handle for, and what it owns; no error if already gone. Runs to its end.

        Returns:
            What is still left after waiting up to ``wait`` seconds, and how to remove it
            (empty or None when everything is gone).
        """

    def reclaim(self, manifest: dict[str, Any], *, wait: float = 30.0) -> str | None:
        """After a cancelled :meth:`submit`: delete the job it may have created; say what was done.

        Default: nothing (None), for a backend whose submit creates nothing it cannot take back.
        """
        return None


def check_ownership(manifest: dict[str, Any], existing: TrainJob, *, remedy: str) -> None:
    """Raise :class:`OwnershipError` unless ``existing`` was created by the task that rendered ``manifest``.

    The run, the task and the inputs digest must all match: the same name from another run,
    another task, or other inputs is somebody else's job and is never adopted or replaced.
    """
    mine, theirs = manifest["metadata"].get("labels") or {}, existing["metadata"].get("labels") or {}
    for key in (LABEL_RUN, LABEL_TASK, LABEL_DIGEST):
        if mine.get(key) != theirs.get(key):
            where = f"{existing['metadata'].get('namespace', '')}/{existing['metadata']['name']}"
            raise OwnershipError(
                f"TrainJob {where} already exists and was not created by this task "
                f"({key}={theirs.get(key)!r}, this task has {mine.get(key)!r}). Choose another name or name_prefix, or {remedy}"
            )
