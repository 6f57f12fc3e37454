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
