"""Distributed smoke test: every rank contributes ``rank + 1`` to an all-reduce.

Run under ``torchrun``::

    torchrun --standalone --nnodes 1 --nproc-per-node 2 -m kfp_trainer.trainers.allreduce

Each rank prints one JSON line
``{"rank": 0, "world_size": 2, "node_rank": 0, "local_rank": 0, "sum": 3, ...}``
and exits with status 1 if the sum differs from ``world_size * (world_size + 1) / 2``.
Without a launcher it runs as a single rank.
"""

from __future__ import annotations

import argparse
import socket
import sys
from datetime import timedelta

from kfp_trainer.trainers._common import dist_env, emit


def run(backend: str = "gloo", timeout_seconds: float = 300.0) -> dict[str, object]:
    """Joins the process group and all-reduces ``rank + 1`` over all ranks.

    Args:
        backend: torch.distributed backend (``gloo`` works on CPU).
        timeout_seconds: Timeout of the collective operations.

    Returns:
        ``rank``, ``world_size``, ``node_rank``, ``local_rank``, ``sum``,
        ``expected`` and ``hostname`` of this process.
    """
    import torch
    import torch.distributed as dist

    env = dist_env()
    if env.launched:
        dist.init_process_group(backend=backend, timeout=timedelta(seconds=timeout_seconds))
    else:
        # Alone: a one-rank group through an in-memory store.
        store = dist.HashStore()  # type: ignore[attr-defined]  # torch.distributed has it, but not in an __all__
        dist.init_process_group(backend=backend, store=store, rank=0, world_size=1)
    try:
        rank = dist.get_rank()
        world_size = dist.get_world_size()
        device = torch.device("cuda", env.local_rank) if backend == "nccl" else torch.device("cpu")
        value = torch.tensor([float(rank + 1)], dtype=torch.float64, device=device)
        dist.all_reduce(value, op=dist.ReduceOp.SUM)
        total = int(value.item())
    finally:
        dist.destroy_process_group()
    return {
        "rank": rank,
        "world_size": world_size,
        "node_rank": env.node_rank,
        "local_rank": env.local_rank,
        "sum": total,
        "expected": world_size * (world_size + 1) // 2,
        "hostname": socket.gethostname(),
    }


def main(argv: list[str] | None = None) -> int:
    """Command line entry point.

    Args:
        argv: Arguments without the program name; defaults to ``sys.argv[1:]``.

    Returns:
        0 if the all-reduce sum is right, 1 otherwise.
    """
    p = argparse.ArgumentParser(prog="python -m kfp_trainer.trainers.allreduce", description=__doc__.split("\n\n")[0])
    p.add_argument("--backend", default="gloo", help="torch.distributed backend (default %(default)s)")
    p.add_argument("--timeout-seconds", type=float, default=300.0, help="collective timeout (default %(default)s)")
    args = p.parse_args(argv)
    result = run(backend=args.backend, timeout_seconds=args.timeout_seconds)
    emit(result)
    if result["sum"] != result["expected"]:
        print(f"allreduce: sum {result['sum']} != expected {result['expected']}", file=sys.stderr, flush=True)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
