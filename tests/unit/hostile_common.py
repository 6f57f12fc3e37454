"""What a hostile-input case is, the secrets none may expose, and helpers to read a rendered TrainJob.

A case is data: the inputs (on top of ``BASE``), and either the field the error must name
(rejected) or a check of the rendered TrainJob (accepted). The values in ``CANARIES`` are
secrets: none may ever appear in an error, a log line, a rendered job or an artifact.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

HF = "hf_" + "Zq7canaryTOKENvalue0123456789abcde"
AWS_ID = "AKIA" + "ZQ7CANARY0000042"
AWS_KEY = "Zq7canary/K7MDENG/bPxRfiCYsecretKEY0"
GH = "ghp_" + "Zq7canary" * 4
PLAIN = "Zq7-canary-plain-secret-value"
CANARIES = (HF, AWS_ID, AWS_KEY, GH, PLAIN)

BASE: dict[str, Any] = {"run_id": "run-1", "task_name": "train", "namespace": "team-a"}
PVC = {"name": "data", "persistentVolumeClaim": {"claimName": "d"}}
BIG = 200 * 1024  # bytes: over the per-value limit
NODE = ("spec", "runtimePatches", 0, "trainingRuntimeSpec", "template", "spec", "replicatedJobs", 0, "template", "spec", "template")


@dataclass(frozen=True)
class Case:
    """One hostile input. ``field`` set: rejected naming it; else ``check`` asserts the rendered job."""

    id: str
    inputs: dict[str, Any]
    field: str | None = None
    check: Callable[[dict[str, Any]], Any] | None = None
    api_version: str = "v2.2"
    allow_host_access: bool = False
    layers: tuple[str, ...] = ("render", "launcher", "component", "cli")
    setup: str = ""  # "workspace": (component) a dataset to stage and a shared volume; files put there count as writes

    @property
    def accepted(self) -> bool:
        return self.field is None

    @property
    def secrets(self) -> list[str]:
        text = repr(self.inputs)
        return [c for c in CANARIES if c in text]


def at(manifest: dict[str, Any], *path: Any) -> Any:
    for key in path:
        manifest = manifest[key]
    return manifest


def trainer(m: dict[str, Any]) -> dict[str, Any]:
    return m["spec"]["trainer"]


def pod(m: dict[str, Any]) -> dict[str, Any]:
    return at(m, *NODE)["spec"]


def patch_node(spec: dict[str, Any], *, containers: list[dict[str, Any]] | None = None, **pod_spec: Any) -> dict[str, Any]:
    """A patch that sets ``pod_spec`` (and ``containers``) on the node pods through runtimePatches."""
    if containers is not None:
        pod_spec["containers"] = containers
    job = {"name": "node", "template": {"spec": {"template": {"spec": pod_spec}}}}
    return {
        "spec": {
            "runtimePatches": [{"manager": "example.com/me", "trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [job]}}}}]
        }
    }


def sidecar(name: str = "sidecar", **fields: Any) -> dict[str, Any]:
    """A patch of one container of the node pods (Trainer v2.2+ patches name, env, securityContext, volumeMounts)."""
    return patch_node({}, containers=[{"name": name, **fields}])


def deep(n: int) -> dict[str, Any]:
    value: dict[str, Any] = {"leaf": 1}
    for _ in range(n):
        value = {"x": value}
    return value


@dataclass(frozen=True)
class CliCase:
    """``kfp-trainer <argv>`` (``{dir}`` is a folder holding ``files``): exit 2 with ``expect`` in the error."""

    id: str
    argv: tuple[str, ...]
    expect: str
    files: tuple[tuple[str, bytes], ...] = ()

    @property
    def secrets(self) -> list[str]:
        text = repr(self.argv) + repr(self.files)
        return [c for c in CANARIES if c in text]
