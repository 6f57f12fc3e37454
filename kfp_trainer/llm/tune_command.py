"""The ``tune run`` command a torchtune TrainJob really runs, as the Trainer v2.3 controller builds it. Pure.

A BuiltinTrainer TrainJob carries only ``command: [tune, run]`` and the overrides in ``args``.
The Trainer's torch plugin completes the command: a rendezvous endpoint when more than one
process trains, the recipe and ``--config`` chosen from node/process/GPU counts and the
LoRA/QLoRA overrides, then the runtime's own immutable overrides (``output_dir``,
``tokenizer.path``, ``tokenizer.merges_file``, ``checkpointer.checkpoint_dir``). The
admission webhook refuses what the recipes cannot do; :func:`webhook_errors` says the same
before anything is created.

Example:
    >>> recipe_and_config("torchtune-qwen2.5-1.5b", ["model.lora_attn_modules=[q_proj]"], num_nodes=1,
    ...                   num_proc_per_node="auto", gpus_per_node=2)
    ('lora_finetune_distributed', 'qwen2_5/1.5B_lora')
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from decimal import Decimal
from typing import Any

from kfp_trainer.quantity import parse_quantity

from .runtimes import TORCHTUNE_ENTRYPOINT

#: Overrides the runtime owns; a TrainJob may not set them (the webhook refuses them).
IMMUTABLE_CONFIGS = frozenset({"output_dir", "tokenizer.path", "checkpointer.checkpoint_dir", "tokenizer.merges_file"})
#: ``<family>/<size>`` of the models the Trainer v2.3 torchtune path supports.
SUPPORTED_MODELS = frozenset({"llama3_2/1B", "llama3_2/3B", "llama3_3/70B", "qwen2_5/1.5B"})
MULTI_NODE_MODELS = frozenset({"llama3_3/70B"})
RDZV_ARG = "--rdzv_endpoint"
TRAINER_PORT = 29500


def model_from_runtime_name(runtime_name: str) -> str:
    """``torchtune-qwen2.5-1.5b`` -> ``qwen2_5/1.5B`` (empty when the name has another shape).

    Example:
        >>> model_from_runtime_name("torchtune-llama3.2-3b")
        'llama3_2/3B'
    """
    parts = runtime_name.split("-")
    if len(parts) != 3:
        return ""
    return f"{parts[1].replace('.', '_')}/{parts[2].upper()}"


def _key(arg: str) -> str:
    return arg.split("=", 1)[0]


def _bool_enabled(args: Sequence[str], item: str) -> bool:
    for arg in args:
        name, sep, value = arg.partition("=")
        if sep and item in name and value.strip().lower() == "true":
            return True
    return False


def uses_lora(args: Sequence[str]) -> bool:
    """The controller's test for LoRA: some override mentions ``model.lora_attn_modules``."""
    return any("model.lora_attn_modules" in a for a in args)


def uses_qlora(args: Sequence[str]) -> bool:
    """QLoRA: ``model.quantize_base=True`` and DoRA not enabled."""
    return not _bool_enabled(args, "model.use_dora") and _bool_enabled(args, "model.quantize_base")


def gpus_in(resources: dict[str, Any] | None) -> int:
    """GPUs per node in a ResourceRequirements dict (requests first, then limits; rounded up)."""
    resources = resources or {}
    for section in ("requests", "limits"):
        for name, q in (resources.get(section) or {}).items():
            if "gpu" in name.lower():
                return math.ceil(parse_quantity(q))
    return 0


def cpus_in(resources: dict[str, Any] | None) -> int:
    """Whole CPUs per node (request, else limit; rounded up), 0 when unset."""
    resources = resources or {}
    for section in ("requests", "limits"):
        q = (resources.get(section) or {}).get("cpu")
        if q is not None and parse_quantity(q) != Decimal(0):
            return math.ceil(parse_quantity(q))
    return 0


def recipe_and_config(
    runtime_name: str, args: Sequence[str], *, num_nodes: int, num_proc_per_node: int | str, gpus_per_node: int
) -> tuple[str, str]:
    """The recipe and ``--config`` the controller picks (``getRecipeAndConfig`` in Trainer v2.3.0)."""
    single = num_nodes == 1 and (num_proc_per_node == 1 or gpus_per_node == 1)
    recipe, suffix = "full_finetune_distributed", "_full"
    if single:
        if uses_qlora(args):
            recipe, suffix = "lora_finetune_single_device", "_qlora_single_device"
        elif uses_lora(args):
            recipe, suffix = "lora_finetune_single_device", "_lora_single_device"
        else:
            recipe, suffix = "full_finetune_single_device", "_full_single_device"
    elif num_nodes == 1 and uses_qlora(args):
        recipe, suffix = "lora_finetune_distributed", "_qlora"
    elif num_nodes == 1 and uses_lora(args):
        recipe, suffix = "lora_finetune_distributed", "_lora"
    elif num_nodes > 1:
        suffix = "_full_multinode"
    return recipe, model_from_runtime_name(runtime_name) + suffix


def webhook_errors(
    runtime_name: str, args: Sequence[str], *, num_nodes: int, num_proc_per_node: int | str, gpus_per_node: int
) -> list[tuple[str, object, str]]:
    """What the Trainer v2.3 webhook refuses for a ``tune run`` TrainJob, as (field, value, allowed)."""
    errors: list[tuple[str, object, str]] = []
    model = model_from_runtime_name(runtime_name)
    if model not in SUPPORTED_MODELS:
        errors.append(("runtime", runtime_name, f"a torchtune runtime of a supported model ({', '.join(sorted(SUPPORTED_MODELS))})"))
    if num_nodes > 1 and model not in MULTI_NODE_MODELS:
        multi = ", ".join(sorted(MULTI_NODE_MODELS))
        errors.append(("num_nodes", num_nodes, f"1 for {model or runtime_name} (multi-node torchtune: {multi})"))
    _, config = recipe_and_config(runtime_name, args, num_nodes=num_nodes, num_proc_per_node=num_proc_per_node, gpus_per_node=gpus_per_node)
    if "_qlora" in config:
        if model == "qwen2_5/1.5B":
            errors.append(("lora.quantize_base", True, f"False: QLoRA is not supported for {model}"))
        elif "_qlora_single_device" not in config and model in ("llama3_2/1B", "llama3_2/3B"):
            errors.append(("resources_per_node", gpus_per_node, f"exactly 1 GPU per node for QLoRA on {model}"))
    if num_nodes > 1 and (uses_lora(args) or uses_qlora(args)):
        errors.append(("num_nodes", num_nodes, "1: torchtune LoRA fine-tuning is single-node"))
    for arg in args:
        if _key(arg) in IMMUTABLE_CONFIGS:
            errors.append(("args", arg, f"no override of {_key(arg)} (the runtime sets it)"))
    return errors


def runtime_immutable_overrides(runtime_command: Sequence[str]) -> list[str]:
    """The runtime command's ``output_dir=``/``tokenizer.*=``/``checkpointer.checkpoint_dir=`` items, in order."""
    return [c for c in runtime_command if _key(c) in IMMUTABLE_CONFIGS]


def node_shape(
    *, runtime_resources: dict[str, Any] | None, runtime_num_nodes: int, job_trainer: dict[str, Any] | None
) -> tuple[int, int | str, int]:
    """(nodes, processes per node, GPUs per node) as the controller resolves them for a TrainJob.

    The TrainJob's ``numNodes``/``numProcPerNode``/``resourcesPerNode`` win over the runtime's;
    ``numProcPerNode`` stays ``"auto"`` on GPU nodes and becomes the CPU count (at least 1) on
    nodes without GPUs.

    Example:
        >>> node_shape(runtime_resources={"limits": {"nvidia.com/gpu": 2}}, runtime_num_nodes=1,
        ...            job_trainer={"resourcesPerNode": {"limits": {"cpu": 4}}})
        (1, 4, 0)
    """
    job_trainer = job_trainer or {}
    resources = job_trainer.get("resourcesPerNode") if job_trainer.get("resourcesPerNode") is not None else runtime_resources
    gpus = gpus_in(resources)
    nproc: int | str = job_trainer.get("numProcPerNode") or "auto"
    if nproc == "auto" and gpus == 0:
        nproc = max(1, cpus_in(resources))
    return int(job_trainer.get("numNodes") or runtime_num_nodes or 1), nproc, gpus


def effective_argv(
    *,
    runtime_name: str,
    runtime_command: Sequence[str],
    job_command: Sequence[str] = (),
    job_args: Sequence[str] = (),
    job_name: str,
    num_nodes: int,
    num_proc_per_node: int | str,
    gpus_per_node: int,
) -> list[str]:
    """The trainer container's command + args once the controller has completed them.

    Pass the node shape from :func:`node_shape`.

    Example:
        >>> effective_argv(runtime_name="torchtune-llama3.2-1b", job_name="j", num_nodes=1,
        ...                num_proc_per_node="auto", gpus_per_node=2,
        ...                runtime_command=["tune", "run", "x", "output_dir=/workspace/output"],
        ...                job_command=["tune", "run"], job_args=["epochs=2"])
        ['tune', 'run', '--rdzv_endpoint=j-node-0-0.j:29500', 'full_finetune_distributed', '--config', 'llama3_2/1B_full', \
'output_dir=/workspace/output', 'epochs=2']
    """
    if tuple(job_command) != TORCHTUNE_ENTRYPOINT:
        return list(job_command or runtime_command) + list(job_args)
    multi = (
        num_nodes > 1
        or (isinstance(num_proc_per_node, int) and num_proc_per_node > 1)
        or (num_proc_per_node == "auto" and gpus_per_node > 1)
    )
    argv = list(TORCHTUNE_ENTRYPOINT)
    if multi:
        argv.append(f"{RDZV_ARG}={job_name}-node-0-0.{job_name}:{TRAINER_PORT}")
    recipe, config = recipe_and_config(
        runtime_name, job_args, num_nodes=num_nodes, num_proc_per_node=num_proc_per_node, gpus_per_node=gpus_per_node
    )
    argv += [recipe, "--config", config, *runtime_immutable_overrides(runtime_command)]
    return argv + list(job_args)
