"""What the launcher knows of a TrainJob's state: its identity, its phase, one observation.

The bottom of the layers: the launcher, the backends, :mod:`kfp_trainer.timing` and the
report all speak of a job in these terms, and this module imports nothing of theirs.

Example:
    >>> Phase.FAILED.finished
    True
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

from .kube_types import TrainJobStatus


class Phase(str, enum.Enum):
    """Where a TrainJob is, as the launcher needs to know it."""

    PENDING = "Pending"  # created, nothing running yet
    RUNNING = "Running"  # a trainer pod runs
    SUSPENDED = "Suspended"  # suspended (e.g. queued by Kueue)
    SUCCEEDED = "Succeeded"
    FAILED = "Failed"
    DELETED = "Deleted"  # gone while we followed it

    @property
    def finished(self) -> bool:
        """True for the phases a TrainJob never leaves."""
        return self in (Phase.SUCCEEDED, Phase.FAILED, Phase.DELETED)


@dataclass(frozen=True)
class JobRef:
    """Identity of one TrainJob."""

    namespace: str
    name: str
    uid: str = ""

    def __str__(self) -> str:
        return f"{self.namespace}/{self.name}"


@dataclass(frozen=True)
class JobStatus:
    """One observation of a TrainJob's state."""

    phase: Phase
    reason: str = ""
    message: str = ""
    raw: TrainJobStatus = field(default_factory=lambda: TrainJobStatus())  # the object's status, as stored


def following(previous: Phase | None, status: JobStatus) -> JobStatus:
    """``status`` as it reads after a status of phase ``previous``: a running job never goes back to Pending.

    JobSet counts a replicated job's Jobs, and a trainer Job runs all the nodes: once its pods
    have ended, and until the Job and then the JobSet say Complete, no Job of the trainer is
    ready, succeeded or failed, and the stored TrainJob reads as Pending (the same holds while
    JobSet re-makes the pods of a restart). The trainer has not gone back to waiting for its
    start: the job still runs. Only a suspension (a Kueue preemption) ends a run before its end,
    and after one the job does wait to start again, so a Pending after Suspended stays Pending.

    Example:
        >>> following(Phase.RUNNING, JobStatus(Phase.PENDING)).phase
        <Phase.RUNNING: 'Running'>
        >>> following(Phase.SUSPENDED, JobStatus(Phase.PENDING)).phase
        <Phase.PENDING: 'Pending'>
    """
    if status.phase is Phase.PENDING and previous is Phase.RUNNING:
        return JobStatus(Phase.RUNNING, status.reason, status.message, status.raw)
    return status
