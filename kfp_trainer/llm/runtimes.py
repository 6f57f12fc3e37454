"""What a (Cluster)TrainingRuntime object says about its trainer: framework, command, resources. Pure.

The runtime is taken as the object the API server returns (a dict), so callers decide where it
comes from; nothing here talks to a cluster.

Example:
    >>> rt = {"kind": "ClusterTrainingRuntime",
    ...       "metadata": {"name": "torchtune-llama3.2-1b", "labels": {FRAMEWORK_LABEL: "torchtune"}},
    ...       "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [
    ...           {"name": "node", "template": {"metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
    ...            "spec": {"template": {"spec": {"containers": [
    ...                {"name": "node", "image": "tt", "command": ["tune", "run"]}]}}}}}]}}}}
    >>> info = RuntimeTrainer.from_runtime(rt)
    >>> (info.framework, info.is_torchtune, info.entrypoint)
    ('torchtune', True, ('tune', 'run'))
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from kfp_trainer.dicts import dig
from kfp_trainer.errors import ValidationError

FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
TORCHTUNE = "torchtune"
RUNTIME_KINDS = ("ClusterTrainingRuntime", "TrainingRuntime")

#: ``tune run``: the entrypoint of BuiltinTrainer TrainJobs (the controller completes it).
TORCHTUNE_ENTRYPOINT: tuple[str, ...] = ("tune", "run")


@dataclass(frozen=True)
class RuntimeTrainer:
    """The trainer side of a runtime, as a kubeflow SDK 0.5.0 ``Runtime`` sees it."""

    name: str
    kind: str
    framework: str
    image: str
    command: tuple[str, ...]
    ml_policy: dict[str, Any] = field(default_factory=dict)
    resources: dict[str, Any] = field(default_factory=dict)

    @property
    def is_torchtune(self) -> bool:
        """True for runtimes labelled ``trainer.kubeflow.org/framework: torchtune``."""
        return self.framework == TORCHTUNE

    @property
    def entrypoint(self) -> tuple[str, ...]:
        """What the SDK puts first in ``spec.trainer.command`` for this runtime's kind of trainer.

        ``tune run`` for torchtune; for a function: ``torchrun`` (torch policy), ``mpirun`` (MPI
        policy) or ``python``, as ``("torchrun",)`` etc. (the full shell wrapper is built in render).
        """
        if self.is_torchtune:
            return TORCHTUNE_ENTRYPOINT
        if self.ml_policy.get("torch") is not None:
            return ("torchrun",)
        if self.ml_policy.get("mpi") is not None:
            return ("mpirun",)
        return ("python",)

    @property
    def num_nodes(self) -> int:
        """``spec.mlPolicy.numNodes`` (1 when unset)."""
        return int(self.ml_policy.get("numNodes") or 1)

    @classmethod
    def from_runtime(cls, runtime: dict[str, Any]) -> RuntimeTrainer:
        """Read a runtime object.

        Raises:
            ValidationError: the object lacks what a runtime needs (the field is named).
        """
        if not isinstance(runtime, dict):
            raise ValidationError("runtime", type(runtime).__name__, "the runtime object as the API server returns it (a dict)")
        name = dig(runtime, "metadata", "name")
        kind = runtime.get("kind")
        if not name:
            raise ValidationError("runtime.metadata.name", name, "the runtime's name")
        if kind not in RUNTIME_KINDS:
            raise ValidationError(f"runtime {name}: kind", kind, " or ".join(RUNTIME_KINDS))
        labels = dig(runtime, "metadata", "labels") or {}
        framework = labels.get(FRAMEWORK_LABEL)
        if not framework:
            raise ValidationError(f"runtime {name}: label {FRAMEWORK_LABEL}", framework, "a framework name (the SDK needs it too)")
        ml_policy = dig(runtime, "spec", "mlPolicy")
        jobs = dig(runtime, "spec", "template", "spec", "replicatedJobs")
        if not isinstance(ml_policy, dict) or not isinstance(jobs, list) or not jobs:
            raise ValidationError(f"runtime {name}: spec", "incomplete", "spec.mlPolicy and spec.template.spec.replicatedJobs")
        container = _trainer_container(jobs)
        if container is None or not container.get("image"):
            raise ValidationError(
                f"runtime {name}: trainer container",
                None,
                f"a container named 'node' with an image, in a replicated job labelled {ANCESTOR_LABEL}",
            )
        return cls(
            name=name,
            kind=kind,
            framework=framework,
            image=container["image"],
            command=tuple(container.get("command") or ()),
            ml_policy=ml_policy,
            resources=container.get("resources") or {},
        )


def _trainer_container(jobs: list[Any]) -> dict[str, Any] | None:
    for job in jobs:
        labels = dig(job, "template", "metadata", "labels") or {}
        if ANCESTOR_LABEL not in labels:
            continue
        for c in dig(job, "template", "spec", "template", "spec", "containers") or []:
            if isinstance(c, dict) and c.get("name") == "node":
                return c
    return None
