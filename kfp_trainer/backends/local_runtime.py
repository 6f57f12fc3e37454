"""How a local TrainJob runs: its runtime, its command, its nodes' environment, its ``/workspace``.

Pure functions of the TrainJob manifest and the runtime document (plus ``os.environ``); the
local backend (:mod:`kfp_trainer.backends.local`) starts the processes.

Example:
    >>> map_workspace("/workspace/model", Path("/tmp/job/workspace"))
    '/tmp/job/workspace/model'
"""

from __future__ import annotations

import logging
import os
import shutil
import sys
from pathlib import Path
from typing import Any

import yaml

from ..errors import ValidationError
from ..llm.trl_runtime import RUNTIME_NAME as TRL_RUNTIME
from ..llm.trl_runtime import trl_runtime
from ..spec import dig
from .local_torchtune import TORCHTUNE_RUNTIMES
from .procs import free_port

log = logging.getLogger(__name__)
RUNTIMES_ENV = "KFP_TRAINER_RUNTIMES_DIR"
WORKSPACE = "/workspace"

BUILTIN_RUNTIMES: dict[str, dict[str, Any]] = {
    "torch-distributed": {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": "torch-distributed", "labels": {"trainer.kubeflow.org/framework": "torch"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {"spec": {"replicatedJobs": [{
                "name": "node",
                "template": {
                    "metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
                    "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "pytorch/pytorch"}]}}},
                },
            }]}},  # fmt: skip
        },
    },
    **TORCHTUNE_RUNTIMES,
    # What deploy/trl-runtime.yaml installs on a cluster (local nodes run the command on this machine).
    TRL_RUNTIME: trl_runtime("kfp-trainer-trainer"),
}


def load_runtimes(runtimes_dir: Path | None) -> dict[str, dict[str, Any]]:
    """Built-in runtimes plus those in ``runtimes_dir`` (YAML), by ``Kind/name``."""
    found = {f"ClusterTrainingRuntime/{name}": rt for name, rt in BUILTIN_RUNTIMES.items()}
    if runtimes_dir and runtimes_dir.is_dir():
        for path in sorted(runtimes_dir.glob("*.y*ml")):
            for doc in yaml.safe_load_all(path.read_text()):
                if isinstance(doc, dict) and doc.get("kind") in ("ClusterTrainingRuntime", "TrainingRuntime"):
                    found[f"{doc['kind']}/{doc['metadata']['name']}"] = doc
    return found


def map_workspace(value: str, workspace: Path) -> str:
    """A path (or ``NAME=path``) as the trainer sees it under ``/workspace``, mapped to ``workspace``."""
    if value == WORKSPACE or value.startswith(WORKSPACE + "/"):
        return str(workspace) + value[len(WORKSPACE) :]
    return value.replace("=" + WORKSPACE + "/", "=" + str(workspace) + "/")


def node_container(runtime: dict[str, Any]) -> dict[str, Any]:
    """The runtime's trainer container (``node`` of the ``node`` replicated job)."""
    for rj in dig(runtime, "spec", "template", "spec", "replicatedJobs") or []:
        if rj.get("name") == "node":
            for c in dig(rj, "template", "spec", "template", "spec", "containers") or []:
                if c.get("name") == "node":
                    container: dict[str, Any] = c
                    return container
    return {}


def trainer_command(manifest: dict[str, Any], runtime: dict[str, Any], workspace: Path) -> list[str]:
    """The command each node runs: the TrainJob's, else the runtime's, with paths mapped.

    Raises:
        ValidationError: No command, or its program is not on this machine.
    """
    trainer = manifest["spec"].get("trainer") or {}
    command = list(trainer.get("command") or [])
    args = list(trainer.get("args") or [])
    if not command:
        container = node_container(runtime)
        command = list(container.get("command") or [])
        args = args or list(container.get("args") or [])
    if not command:
        raise ValidationError("command", command, "a trainer command: local runs have no container image entry point")
    full = [map_workspace(part, workspace) for part in command + args]
    bin_dir = Path(sys.executable).parent
    if full[0] in ("python", "python3"):
        full[0] = sys.executable
    elif (bin_dir / full[0]).exists():
        full[0] = str(bin_dir / full[0])
    if shutil.which(full[0]) is None:
        raise ValidationError("command[0]", full[0], "an executable found on this machine's PATH (local mode runs it directly)")
    return full


def initializer_env(manifest: dict[str, Any], kind: str) -> dict[str, str]:
    """The shell's environment plus the initializer's literal env (secrets come from the shell)."""
    env = dict(os.environ)
    for item in ((manifest["spec"].get("initializer") or {}).get(kind) or {}).get("env") or []:
        if "value" in item:
            env[item["name"]] = str(item["value"])
    return env


def node_env(manifest: dict[str, Any], runtime: dict[str, Any], workspace: Path, nodes: int) -> dict[str, str]:
    """The environment every node shares; torch runtimes get the PET_* rendezvous (not the rank)."""
    env = dict(os.environ)
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["PYTHONUNBUFFERED"] = "1"
    env["KFP_TRAINER_WORKSPACE"] = str(workspace)
    for item in (manifest["spec"].get("trainer") or {}).get("env") or []:
        if "value" in item:
            env[item["name"]] = map_workspace(str(item["value"]), workspace)
        elif item["name"] not in os.environ:
            log.warning("env %s comes from a Secret/ConfigMap reference; set it in this shell for local runs", item["name"])
    policy = (runtime.get("spec") or {}).get("mlPolicy") or {}
    if "torch" in policy:
        trainer = manifest["spec"].get("trainer") or {}
        env.update(
            PET_NNODES=str(nodes),
            PET_NPROC_PER_NODE=str(trainer.get("numProcPerNode") or (policy["torch"] or {}).get("numProcPerNode") or "auto"),
            PET_MASTER_ADDR="127.0.0.1",
            PET_MASTER_PORT=str(free_port()),
        )
    return env


def workspace_mounts(manifest: dict[str, Any], workspace: Path) -> list[tuple[Path, Path]]:
    """``hostPath`` volumes the trainer mounts under ``/workspace``: (local workspace path, host path).

    A local node runs on this machine, so a ``hostPath`` volume is that directory itself; one
    mounted under ``/workspace`` (e.g. ``/workspace/output`` on a durable folder) becomes a link
    in the job's local workspace. Other volumes and mounts have no local meaning and are skipped.

    Example:
        >>> patch = {"name": "node", "template": {"spec": {"template": {"spec": {
        ...     "volumes": [{"name": "out", "hostPath": {"path": "/data/run-1"}}],
        ...     "containers": [{"name": "node", "volumeMounts": [{"name": "out", "mountPath": "/workspace/output"}]}]}}}}}
        >>> m = {"spec": {"runtimePatches": [{"trainingRuntimeSpec": {"template": {"spec": {"replicatedJobs": [patch]}}}}]}}
        >>> [(str(a), str(b)) for a, b in workspace_mounts(m, Path("/tmp/ws"))]
        [('/tmp/ws/output', '/data/run-1')]
    """
    found: list[tuple[Path, Path]] = []
    for patch in (manifest.get("spec") or {}).get("runtimePatches") or []:
        for rj in dig(patch, "trainingRuntimeSpec", "template", "spec", "replicatedJobs") or []:
            pod = dig(rj, "template", "spec", "template", "spec") or {}
            if rj.get("name") != "node":
                continue
            hosts = {v.get("name"): dig(v, "hostPath", "path") for v in pod.get("volumes") or [] if dig(v, "hostPath", "path")}
            for container in pod.get("containers") or []:
                if container.get("name") != "node":
                    continue
                for mount in container.get("volumeMounts") or []:
                    path, host = str(mount.get("mountPath") or ""), hosts.get(mount.get("name"))
                    if host and path.startswith(WORKSPACE + "/") and ".." not in path.split("/"):
                        source = Path(host) / mount["subPath"] if mount.get("subPath") else Path(host)
                        found.append((Path(map_workspace(path, workspace)), source))
    return found


def link_mounts(manifest: dict[str, Any], workspace: Path) -> list[str]:
    """Make the links :func:`workspace_mounts` describes (creating their targets); what was linked."""
    done = []
    for local, host in workspace_mounts(manifest, workspace):
        host.mkdir(parents=True, exist_ok=True)
        local.parent.mkdir(parents=True, exist_ok=True)
        if local.is_symlink() or local.is_file():
            local.unlink()
        elif local.is_dir():
            shutil.rmtree(local)
        local.symlink_to(host, target_is_directory=True)
        done.append(f"{WORKSPACE}/{local.relative_to(workspace).as_posix()} -> {host}")
    return done
