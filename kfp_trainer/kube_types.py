"""The shapes of the Kubernetes objects this package reads: a TrainJob and its status, pods, events, watch events.

Only the fields read here are named; ``total=False`` throughout, because an object from a
server may lack any of them (a fresh TrainJob has no ``status``, an old event no ``count``).
They describe JSON as decoded, so they are read with ``.get`` and a default, and nothing checks
them at run time: they let mypy check the field names and the types the code expects of them.

Example:
    >>> job: TrainJob = {"metadata": {"name": "j"}, "status": {"conditions": [{"type": "Complete", "status": "True"}]}}
    >>> [c.get("type") for c in job.get("status", {}).get("conditions", [])]
    ['Complete']
"""

from __future__ import annotations

from typing import Any, TypedDict


class ObjectMeta(TypedDict, total=False):
    """``metadata`` of any object."""

    name: str
    namespace: str
    uid: str
    resourceVersion: str
    creationTimestamp: str
    deletionTimestamp: str
    labels: dict[str, str]
    annotations: dict[str, str]
    finalizers: list[str]
    ownerReferences: list[dict[str, Any]]


class ListMeta(TypedDict, total=False):
    """``metadata`` of a list."""

    resourceVersion: str


class Condition(TypedDict, total=False):
    """One of ``status.conditions``."""

    type: str
    status: str  # "True", "False" or "Unknown"
    reason: str
    message: str
    lastTransitionTime: str


class ReplicatedJobStatus(TypedDict, total=False):
    """One of a TrainJob's ``status.jobsStatus``: the Jobs of one replicated job, counted."""

    name: str
    ready: int
    succeeded: int
    failed: int
    active: int
    suspended: int


class TrainJobStatus(TypedDict, total=False):
    """A TrainJob's ``status``."""

    conditions: list[Condition]
    jobsStatus: list[ReplicatedJobStatus]
    trainerStatus: dict[str, Any]  # Trainer >= v2.2 (TrainJobStatus gate); read by kfp_trainer.trainer_status


class TrainJobSpec(TypedDict, total=False):
    """A TrainJob's ``spec`` (the parts read back; the manifest is built as a plain dict)."""

    suspend: bool
    runtimeRef: dict[str, str]
    trainer: dict[str, Any]
    initializer: dict[str, Any]


class TrainJob(TypedDict, total=False):
    """A TrainJob as the API server (or the local backend's file) returns it."""

    apiVersion: str
    kind: str
    metadata: ObjectMeta
    spec: TrainJobSpec
    status: TrainJobStatus


class ContainerStatus(TypedDict, total=False):
    """One of a pod's ``status.containerStatuses``; ``state`` is one of waiting, running, terminated."""

    name: str
    ready: bool
    restartCount: int
    state: dict[str, dict[str, Any]]
    lastState: dict[str, dict[str, Any]]


class PodStatus(TypedDict, total=False):
    """A pod's ``status``."""

    phase: str
    reason: str
    message: str
    conditions: list[Condition]
    containerStatuses: list[ContainerStatus]
    initContainerStatuses: list[ContainerStatus]


class Pod(TypedDict, total=False):
    """A pod (``spec`` left loose: only ``nodeName`` is read)."""

    metadata: ObjectMeta
    spec: dict[str, Any]
    status: PodStatus


class ObjectReference(TypedDict, total=False):
    """What an event is about."""

    kind: str
    name: str
    namespace: str
    uid: str


class Event(TypedDict, total=False):
    """A core/v1 Event."""

    metadata: ObjectMeta
    involvedObject: ObjectReference
    type: str  # Normal or Warning
    reason: str
    message: str
    count: int
    firstTimestamp: str
    lastTimestamp: str
    eventTime: str


class WatchEvent(TypedDict, total=False):
    """One line of a watch: ADDED, MODIFIED, DELETED, BOOKMARK or ERROR, and the object (a ``Status`` for ERROR)."""

    type: str
    object: dict[str, Any]


class ObjectList(TypedDict, total=False):
    """A list answer: its items and the resourceVersion to watch from."""

    metadata: ListMeta
    items: list[dict[str, Any]]
