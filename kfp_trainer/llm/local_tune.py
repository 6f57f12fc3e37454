"""Run a torchtune runtime's own ``tune run`` command on this machine (local mode). Pure.

:func:`local_tune_command` takes the runtime object, the TrainJob's ``spec.trainer`` (the
BuiltinTrainer overrides) and a local workspace directory standing for ``/workspace``, and
returns the argv and environment of one local node:

* the command the Trainer controller would run (same recipe and ``--config``, see
  :mod:`kfp_trainer.llm.tune_command`), with ``/workspace`` paths moved to the workspace;
* the rendezvous on 127.0.0.1 and the ``PET_*`` variables torchrun reads, one process group
  per local node;
* four CPU overrides (``device=cpu dtype=fp32 compile=False enable_activation_checkpointing=False``)
  plus any the caller adds (e.g. the tiny model's, :func:`kfp_trainer.llm.tiny_models.overrides_for`);
  TrainJob overrides of the same keys are dropped and listed in ``replaced``;
* the CPU compatibility layer (:mod:`kfp_trainer.llm.cpu_compat`) switched on, Hugging Face
  libraries offline, their caches inside the workspace.

Example:
    >>> rt = {"kind": "ClusterTrainingRuntime",
    ...       "metadata": {"name": "torchtune-llama3.2-1b", "labels": {"trainer.kubeflow.org/framework": "torchtune"}},
    ...       "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [
    ...           {"name": "node", "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
    ...            "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "tt",
    ...                "command": ["tune", "run", "--rdzv_endpoint=localhost:29500", "full_finetune_distributed",
    ...                            "--config", "llama3_2/1B_full", "output_dir=/workspace/output"],
    ...                "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}}}}]}}}}
    >>> cmd = local_tune_command(rt, {"command": ["tune", "run"], "args": ["dtype=bf16", "epochs=2"]}, "/tmp/ws",
    ...                          master_port=29611, tune_executable=["tune"])
    >>> cmd.argv[:6]
    ['tune', 'run', '--rdzv_endpoint=127.0.0.1:29611', 'full_finetune_distributed', '--config', 'llama3_2/1B_full']
    >>> cmd.argv[6:]
    ['output_dir=/tmp/ws/output', 'epochs=2', 'device=cpu', 'dtype=fp32', 'compile=False', 'enable_activation_checkpointing=False']
    >>> cmd.replaced, cmd.env["PET_NPROC_PER_NODE"]
    (['dtype=bf16'], '2')
"""

from __future__ import annotations

import os
import re
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from . import cpu_compat
from .runtimes import RuntimeTrainer
from .tune_command import RDZV_ARG, effective_argv, node_shape

#: Container path the runtimes mount the shared volume at.
CONTAINER_WORKSPACE = "/workspace"
#: What local mode always overrides: CPU, full precision, no compile, no activation checkpointing.
CPU_OVERRIDES: tuple[str, ...] = ("device=cpu", "dtype=fp32", "compile=False", "enable_activation_checkpointing=False")
_LOSS = re.compile(r"(\d+)\|(\d+)\|Loss: ([-+0-9.eE]+|nan|inf)")


@dataclass(frozen=True)
class LocalTuneCommand:
    """One local node of a torchtune TrainJob: run ``argv`` in ``cwd`` with ``os.environ | env``."""

    argv: list[str]
    env: dict[str, str]
    cwd: str
    recipe: str
    config: str
    processes: int
    replaced: list[str] = field(default_factory=list)


def _key(arg: str) -> str:
    return arg.split("=", 1)[0]


def _to_workspace(arg: str, workspace: str) -> str:
    key, sep, value = arg.partition("=")
    if not sep:
        return arg
    if value == CONTAINER_WORKSPACE or value.startswith(CONTAINER_WORKSPACE + "/"):
        return f"{key}={workspace}{value[len(CONTAINER_WORKSPACE) :]}"
    return arg


def _recipe_and_config(argv: Sequence[str]) -> tuple[str, str, bool]:
    """(recipe, config, distributed) read back from a ``tune run`` argv."""
    rest = list(argv[2:])
    distributed = False
    while rest and rest[0].startswith("--"):
        distributed = True
        opt = rest.pop(0)
        if "=" not in opt and rest and not rest[0].startswith("--"):
            rest.pop(0)  # "--opt value"
    recipe = rest[0] if rest else ""
    config = rest[rest.index("--config") + 1] if "--config" in rest[:-1] else ""
    return recipe, config, distributed


def local_tune_command(
    runtime: dict[str, Any] | RuntimeTrainer,
    job_trainer: dict[str, Any] | None,
    workspace: str,
    *,
    node_rank: int = 0,
    procs_per_node: int = 2,
    master_port: int = 29500,
    job_name: str = "local",
    extra_overrides: Sequence[str] = (),
    tune_executable: Sequence[str] | None = None,
    python_path: str = "",
) -> LocalTuneCommand:
    """Command and environment that run a torchtune TrainJob's node ``node_rank`` on this machine.

    Args:
        runtime: the (Cluster)TrainingRuntime object, or its :class:`RuntimeTrainer`.
        job_trainer: the TrainJob's ``spec.trainer`` (``command``, ``args``, ``env``, ``numNodes``,
            ``resourcesPerNode``, ``numProcPerNode``); ``None`` runs the runtime's command as is.
            Its ``env`` entries with plain values are passed on (``valueFrom`` ones are not).
        workspace: local directory that stands for ``/workspace`` (``model/``, ``dataset/``, ``output/``).
        node_rank: which node this process group is (``PET_NODE_RANK``).
        procs_per_node: local trainer processes per node when the recipe is distributed.
        master_port: free TCP port on 127.0.0.1 for the rendezvous.
        job_name: TrainJob name (only shapes the cluster's rendezvous host, which is replaced).
        extra_overrides: more ``key=value`` overrides, applied last (e.g. a tiny model's).
        tune_executable: how to start ``tune``; default ``python -m torchtune._cli.tune`` with this interpreter.
        python_path: the caller's ``PYTHONPATH``, kept after the compatibility layer's directory.

    Returns:
        The local command; ``env`` holds only the variables to add to the caller's environment.

    Raises:
        ValidationError: the runtime object is not usable (see :class:`RuntimeTrainer`).
        ValueError: the command is not a ``tune run`` command.
    """
    rt = runtime if isinstance(runtime, RuntimeTrainer) else RuntimeTrainer.from_runtime(runtime)
    job_trainer = job_trainer or {}
    nodes, nproc, gpus = node_shape(runtime_resources=rt.resources, runtime_num_nodes=rt.num_nodes, job_trainer=job_trainer)
    argv = effective_argv(
        runtime_name=rt.name,
        runtime_command=rt.command,
        job_command=job_trainer.get("command") or (),
        job_args=job_trainer.get("args") or (),
        job_name=job_name,
        num_nodes=nodes,
        num_proc_per_node=nproc,
        gpus_per_node=gpus,
    )
    if argv[:2] != ["tune", "run"]:
        raise ValueError(f"runtime {rt.name}: not a 'tune run' command: {argv[:4]}")
    recipe, config, distributed = _recipe_and_config(argv)
    ws = os.path.abspath(workspace)
    local_args: list[str] = []
    for arg in argv[2:]:
        if arg.startswith(RDZV_ARG + "="):
            arg = f"{RDZV_ARG}=127.0.0.1:{master_port}"
        local_args.append(_to_workspace(arg, ws))
    ours = list(CPU_OVERRIDES) + list(extra_overrides)
    our_keys = {_key(o) for o in ours}
    replaced = [a for a in local_args if "=" in a and not a.startswith("--") and _key(a) in our_keys]
    local_args = [a for a in local_args if a not in replaced] + ours
    processes = procs_per_node if distributed else 1
    exe = list(tune_executable) if tune_executable else [sys.executable, "-m", "torchtune._cli.tune"]
    # The TrainJob's own env (plain values; valueFrom needs a cluster), under ours.
    job_env = {e["name"]: str(e["value"]) for e in job_trainer.get("env") or [] if isinstance(e, dict) and "value" in e}
    python_path = os.pathsep.join(p for p in (job_env.pop("PYTHONPATH", ""), python_path) if p)
    env = {
        **job_env,
        "PET_NNODES": str(nodes),
        "PET_NPROC_PER_NODE": str(processes),
        "PET_NODE_RANK": str(node_rank),
        "PET_MASTER_ADDR": "127.0.0.1",
        "PET_MASTER_PORT": str(master_port),
        cpu_compat.ENV_FLAG: "1",
        "PYTHONPATH": os.pathsep.join(p for p in (cpu_compat.SITE_DIR, python_path) if p),
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "HF_HOME": os.path.join(ws, ".cache", "huggingface"),
        "TIKTOKEN_CACHE_DIR": "",
        "PYTHONUNBUFFERED": "1",
    }
    return LocalTuneCommand(
        argv=exe + ["run"] + local_args,
        env=env,
        cwd=ws,
        recipe=recipe,
        config=config,
        processes=processes,
        replaced=replaced,
    )


def tune_losses(output: str) -> dict[tuple[int, int], float]:
    """Loss per (epoch, step) from the progress lines torchtune's recipes print (``1|3|Loss: 11.9``).

    The progress bar repeats each step; the last value printed for a step wins.

    Example:
        >>> tune_losses("1|1|Loss: 11.9:   3%|x| 1/32  1|1|Loss: 11.9: 6%  1|2|Loss: 11.8: 9%")
        {(1, 1): 11.9, (1, 2): 11.8}
    """
    return {(int(e), int(s)): float(v) for e, s, v in _LOSS.findall(output)}
