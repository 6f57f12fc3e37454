"""What GRPO adds over the SFT model it starts from: the ``llm_grpo`` sample pipeline over several seeds.

For each seed, runs ``kfp-trainer run pipelines/llm_grpo --local --param seed=<seed>`` (the
sample's own defaults otherwise: a short SFT, then GRPO with the ``exact_sum`` reward, each in a
local TrainJob) and reads the two ``evaluate_model`` steps: held-out exact match on the 500 test
sums after SFT (the peer: the model GRPO started from) and after GRPO, and the GRPO step's time.
Prints one row per seed, then the mean gain and the smallest.

    .venv/bin/python -m bench.grpo_gain [--seeds 0 1 2] [--param name=value ...]

A seed whose pipeline fails is reported and counted as a failure (exit 1); a gain at or below
zero is a result, not an error.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parents[1]
CLI = Path(sys.executable).with_name("kfp-trainer")


def run_seed(seed: int, params: list[str], workdir: Path) -> dict[str, Any]:
    """One pipeline run; its SFT and GRPO exact match and the GRPO step's running seconds."""
    from kfp_trainer.cli import task_outputs

    out = workdir / f"seed-{seed}"
    args = [str(CLI), "run", str(REPO / "pipelines" / "llm_grpo"), "--local", "--output", str(out), "--param", f"seed={seed}"]
    for param in params:
        args += ["--param", param]
    started = time.monotonic()
    done = subprocess.run(args, capture_output=True, text=True, timeout=1800)
    wall = time.monotonic() - started
    if done.returncode != 0:
        return {"seed": seed, "error": (done.stdout + done.stderr)[-2000:], "wall_s": wall}
    outputs = dict(task_outputs(out / "artifacts"))

    def metrics(task: str) -> dict[str, Any]:
        return dict(outputs[task]["artifacts"]["metrics"]["artifacts"][0]["metadata"])

    sft, grpo, job = metrics("evaluate-model"), metrics("evaluate-model-2"), metrics("trl-finetune-2")
    return {"seed": seed, "sft": sft["exact_match"], "grpo": grpo["exact_match"], "gain": grpo["exact_match"] - sft["exact_match"],
            "grpo_running_s": job.get("running_seconds"), "reward": job.get("rewards/exact_sum/mean"), "wall_s": wall}  # fmt: skip


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--param", action="append", default=[], help="a pipeline parameter, name=value (repeatable)")
    args = parser.parse_args()
    rows = []
    with tempfile.TemporaryDirectory(prefix="grpo-gain-") as tmp:
        for seed in args.seeds:
            row = run_seed(seed, args.param, Path(tmp))
            rows.append(row)
            print(json.dumps(row), file=sys.stderr, flush=True)
    print("llm_grpo (pipelines/llm_grpo, its defaults): held-out exact match on 500 test sums")
    print(f"{'seed':>4}{'SFT':>8}{'GRPO':>8}{'gain':>8}{'GRPO step s':>13}{'pipeline s':>12}")
    failed = [r for r in rows if "error" in r]
    for r in rows:
        if "error" in r:
            print(f"{r['seed']:>4}  failed: {r['error'].splitlines()[-1] if r['error'] else ''}")
            continue
        print(f"{r['seed']:>4}{r['sft']:>8.3f}{r['grpo']:>8.3f}{r['gain']:>+8.3f}{r['grpo_running_s'] or 0:>13.1f}{r['wall_s']:>12.1f}")
    gains = [r["gain"] for r in rows if "error" not in r]
    if gains:
        sft = statistics.mean(r["sft"] for r in rows if "error" not in r)
        grpo = statistics.mean(r["grpo"] for r in rows if "error" not in r)
        print(f"mean: SFT {sft:.3f} -> GRPO {grpo:.3f} (gain {statistics.mean(gains):+.3f}, smallest {min(gains):+.3f}, "
              f"ratio {grpo / sft if sft else float('inf'):.2f}x) over {len(gains)} seed(s)")  # fmt: skip
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
