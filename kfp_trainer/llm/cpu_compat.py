"""Local mode only: lets torchtune's distributed recipes run on CPU ranks (gloo).

torchtune 0.6.1's ``full_finetune_distributed`` and ``lora_finetune_distributed`` assume a GPU in
three places; on a CPU-only machine each one crashes a run that otherwise trains fine:

* rank 0 logs memory with ``training.get_memory_stats``, which raises on CPU devices;
* ``training.cleanup_before_training`` calls ``torch.cpu.empty_cache`` and
  ``torch.cpu.reset_peak_memory_stats``, which do not exist;
* ``lora_finetune_distributed`` calls ``init_process_group("cuda:nccl,cpu:gloo")``, and NCCL
  cannot start without CUDA.

:func:`apply` patches exactly these, and only when CUDA is unavailable. It never changes what a
recipe computes. The local backend switches it on for the trainer processes by putting
:data:`SITE_DIR` on ``PYTHONPATH`` and setting :data:`ENV_FLAG` (see
:func:`kfp_trainer.llm.local_tune.local_tune_command`); nothing on a cluster loads it.

Example:
    >>> cpu_backend("cuda:nccl,cpu:gloo")
    'cpu:gloo'
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

#: Set to ``1`` in a trainer process's environment to apply the patches at interpreter start.
ENV_FLAG = "KFP_TRAINER_TORCHTUNE_CPU_COMPAT"
#: Directory whose ``sitecustomize.py`` calls :func:`apply` when :data:`ENV_FLAG` is set.
SITE_DIR = str(Path(__file__).resolve().parent / "_cpu_site")


def cpu_backend(backend: str) -> str:
    """The part of a ``device:backend,...`` string that runs without CUDA (``gloo`` if none)."""
    parts = [p for p in backend.split(",") if p.strip()]
    if len(parts) == 1 and ":" not in parts[0]:
        return "gloo" if parts[0].strip() == "nccl" else parts[0].strip()
    kept = [p.strip() for p in parts if not p.strip().startswith("cuda:") and "nccl" not in p]
    return ",".join(kept) or "gloo"


def _memory_stats(device: Any = None, reset_stats: bool = True) -> dict[str, float]:
    """CPU stand-in for ``torchtune.training.get_memory_stats``: the process's peak RSS in GiB."""
    import resource

    peak_gib = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024**2  # KiB on Linux
    return {"peak_memory_active": peak_gib, "peak_memory_alloc": peak_gib, "peak_memory_reserved": peak_gib}


def apply() -> list[str]:
    """Apply the CPU patches if CUDA is unavailable; returns what was patched (empty on GPU hosts)."""
    import torch

    if torch.cuda.is_available():
        return []
    applied: list[str] = []

    import torch.distributed as dist
    import torch.distributed.distributed_c10d as c10d

    original = c10d.init_process_group
    if not getattr(original, "_kfp_trainer_cpu", False):

        def init_process_group(backend: Any = None, *args: Any, **kwargs: Any) -> Any:
            if isinstance(backend, str) and "nccl" in backend:
                backend = cpu_backend(backend)
            return original(backend, *args, **kwargs)

        init_process_group._kfp_trainer_cpu = True  # type: ignore[attr-defined]
        dist.init_process_group = init_process_group
        c10d.init_process_group = init_process_group
        applied.append("torch.distributed.init_process_group: NCCL backends fall back to gloo")

    for name in ("empty_cache", "reset_peak_memory_stats"):
        if not hasattr(torch.cpu, name):
            setattr(torch.cpu, name, lambda *a, **k: None)
            applied.append(f"torch.cpu.{name}: no-op")

    from torchtune import training
    from torchtune.training import memory

    for module in (training, memory):
        module.get_memory_stats = _memory_stats
    applied.append("torchtune.training.get_memory_stats: peak RSS on CPU")
    return applied


def apply_from_env() -> list[str]:
    """:func:`apply` when :data:`ENV_FLAG` is ``1``; what ``sitecustomize`` calls at start-up."""
    if os.environ.get(ENV_FLAG) != "1":
        return []
    return apply()
