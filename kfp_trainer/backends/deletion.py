"""A TrainJob deleted by someone else while a step follows it, told from the watched object.

While it follows a job the launcher deletes nothing (it deletes only after it stopped
following: on a cancel, a time limit, or for clean-up), so a followed TrainJob that is gone,
or carries ``metadata.deletionTimestamp``, was deleted by someone else: a person with
``kubectl delete``, a garbage collector, another tool. Its end is
:data:`DELETED_WHILE_RUNNING`, a failed step. How it is being deleted shows in its
finalizers: ``foregroundDeletion`` (foreground propagation: it goes after its JobSet and
pods), ``orphan`` (orphan propagation: its JobSet and pods are left running without an
owner), others (something else holds it). Who deleted it is not recorded on the object.

Example:
    >>> status = deleted_status({"metadata": {"deletionTimestamp": "2026-05-01T10:00:00Z",
    ...                                       "finalizers": ["foregroundDeletion"]}})
    >>> status.reason, propagation(["foregroundDeletion"])
    ('DeletedWhileRunning', 'foreground')
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from ..jobstatus import JobStatus, Phase
from ..kube_types import TrainJob, TrainJobStatus
from ..timestamps import parse_timestamp

DELETED_WHILE_RUNNING = "DeletedWhileRunning"
FOREGROUND_FINALIZER = "foregroundDeletion"
ORPHAN_FINALIZER = "orphan"
WHO = "not by this step; the TrainJob does not record who deleted it"
AUDIT = "the API server's audit log tells who"
RETRY = "to train anyway, retry the step: it waits until the TrainJob is gone, then creates it anew"


def propagation(finalizers: list[str]) -> str:
    """The propagation a deletion asked for, as its finalizers tell: ``foreground``, ``orphan`` or ``background``.

    Example:
        >>> propagation(["orphan"]), propagation([])
        ('orphan', 'background')
    """
    if FOREGROUND_FINALIZER in finalizers:
        return "foreground"
    if ORPHAN_FINALIZER in finalizers:
        return "orphan"
    return "background"


def deletion_time(obj: TrainJob | None) -> str:
    """The TrainJob's ``metadata.deletionTimestamp`` (RFC 3339), or "" when it is not being deleted."""
    return str(((obj or {}).get("metadata") or {}).get("deletionTimestamp") or "")


def deleted_status(obj: TrainJob | None) -> JobStatus | None:
    """The status of a TrainJob that is gone (``obj`` None) or being deleted; None when it is neither.

    The message says how it is being deleted (the propagation, the finalizers that hold it)
    and that the step did not delete it.

    Example:
        >>> deleted_status(None).message.startswith("the TrainJob no longer exists (not by this step")
        True
        >>> deleted_status({"metadata": {"name": "j"}}) is None
        True
    """
    if obj is None:
        return JobStatus(Phase.DELETED, DELETED_WHILE_RUNNING, f"the TrainJob no longer exists ({WHO})")
    since = deletion_time(obj)
    if not since:
        return None
    finalizers = [str(f) for f in (obj.get("metadata") or {}).get("finalizers") or []]
    how = propagation(finalizers)
    what = f"it is being deleted with {how} propagation (deletionTimestamp {since})"
    if how == "foreground":
        what += ": it goes once its JobSet, Jobs and pods are gone"
    elif how == "orphan":
        meta = obj.get("metadata") or {}
        what += (
            ": its JobSet, Jobs and pods are left running, owned by nothing "
            f"(remove them with: kubectl delete jobset -n {meta.get('namespace', '')} {meta.get('name', '')})"
        )
    held = [f for f in finalizers if f not in (FOREGROUND_FINALIZER, ORPHAN_FINALIZER)]
    if held:
        what += f"; finalizers {', '.join(held)} hold it until their controllers remove them"
    return JobStatus(Phase.DELETED, DELETED_WHILE_RUNNING, f"{what} ({WHO}: {AUDIT})", TrainJobStatus(**(obj.get("status") or {})))


def made_before(pod: Mapping[str, Any], deleted_at: str) -> bool:
    """Whether ``pod`` was made before its TrainJob's deletion began (``deleted_at``; "" = not being deleted).

    A TrainJob held by a finalizer (foreground propagation) can have its JobSet re-created by
    the controllers again and again while it goes; the pods of those JobSets are made at or
    after the deletion and run the trainer anew, so their log is never relayed: the step would
    repeat lines it already showed. Both times come from the API server's clock, to the second:
    a pod made in the very second of the deletion counts as re-created.

    Example:
        >>> pod = {"metadata": {"creationTimestamp": "2026-05-01T10:00:00Z"}}
        >>> made_before(pod, ""), made_before(pod, "2026-05-01T10:00:03Z"), made_before(pod, "2026-05-01T10:00:00Z")
        (True, True, False)
    """
    if not deleted_at:
        return True
    made, since = parse_timestamp(str((pod.get("metadata") or {}).get("creationTimestamp") or "")), parse_timestamp(deleted_at)
    if since is None:
        return True
    return made is not None and made < since
