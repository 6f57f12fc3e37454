"""Overhead of the local TrainJob backend against running the same script with torchrun.

Runs one small distributed torch workload (2 processes, gloo, a few hundred all-reduce
steps of a small MLP) alternately

  peer:  torchrun --standalone --nnodes 1 --nproc-per-node 2 workload.py
  ours:  kfp-trainer launch --local --num-proc-per-node 2 --command torchrun,workload.py

and prints the wall time of each (min / median / max over the rounds) and the ratio of
medians. Both sides run in this one process' session, interleaved, so machine noise hits
both alike.

    .venv/bin/python bench/local_overhead.py [--rounds 5] [--steps 300]

(``make bench`` runs it too, as one of its figures.)
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
import time
from pathlib import Path
from typing import Any

WORKLOAD = textwrap.dedent(
    """
    import sys, torch, torch.distributed as dist
    dist.init_process_group("gloo")
    torch.manual_seed(dist.get_rank())
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 1))
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    for step in range(int(sys.argv[1])):
        x = torch.randn(32, 64)
        loss = ddp(x).pow(2).mean()
        opt.zero_grad(); loss.backward(); opt.step()
        if dist.get_rank() == 0 and step % 100 == 0:
            print(f"step={step} loss={loss.item():.4f}", flush=True)
    dist.destroy_process_group()
    """
)


def timed(cmd: list[str], env: dict[str, str]) -> float:
    start = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    return time.perf_counter() - start


def measure(*, rounds: int, steps: int) -> dict[str, Any]:
    """Wall seconds of each round of both commands, and the ratio of the medians (ours / torchrun)."""
    bin_dir = Path(sys.executable).parent
    with tempfile.TemporaryDirectory() as tmp:
        script = Path(tmp) / "workload.py"
        script.write_text(WORKLOAD)
        env = {**os.environ, "KFP_TRAINER_LOCAL_ROOT": str(Path(tmp) / "jobs"), "OMP_NUM_THREADS": "1"}
        peer = [str(bin_dir / "torchrun"), "--standalone", "--nnodes", "1", "--nproc-per-node", "2", str(script), str(steps)]
        times: dict[str, list[float]] = {"torchrun": [], "kfp-trainer local": []}
        for i in range(rounds):
            ours = [str(bin_dir / "kfp-trainer"), "launch", "--local", "--run-id", f"bench-{i}", "--task-name", "bench",
                    "--num-proc-per-node", "2", "--command", f"torchrun,{script},{steps}", "--delete-after-success"]
            times["torchrun"].append(timed(peer, env))
            times["kfp-trainer local"].append(timed(ours, env))
    ours_s, peer_s = statistics.median(times["kfp-trainer local"]), statistics.median(times["torchrun"])
    return {"rounds": rounds, "steps": steps, "times": times, "ours_median_s": ours_s, "torchrun_median_s": peer_s,
            "ratio": ours_s / peer_s, "extra_s": ours_s - peer_s}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--steps", type=int, default=300)
    args = parser.parse_args()
    result = measure(rounds=args.rounds, steps=args.steps)
    print(f"workload: 2 processes x {args.steps} DDP steps (gloo, CPU); {args.rounds} interleaved rounds")
    print(f"{'command':<20}{'min s':>8}{'median s':>10}{'max s':>8}")
    for name, values in result["times"].items():
        print(f"{name:<20}{min(values):>8.2f}{statistics.median(values):>10.2f}{max(values):>8.2f}")
    print(f"ratio of medians (kfp-trainer local / torchrun): {result['ratio']:.2f}  (+{result['extra_s']:.2f} s)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
