"""Import time of each side's entry points, each in a fresh interpreter, interleaved.

Measured inside the child, around the import statement alone (interpreter start-up excluded,
the same for both sides).
"""

from __future__ import annotations

import statistics
import subprocess
import sys
from pathlib import Path
from typing import Any

from bench.procs import python_env

OURS = {
    "launcher": "import kfp_trainer.launcher",
    "launch_cli": "import kfp_trainer.cli, kfp_trainer.launcher, kfp_trainer.backends.kubernetes",
    "components": "import kfp_trainer.components",
    "kfp": "import kfp",
}
PEER = {"sdk": "from kubeflow.trainer import TrainerClient"}
_PROBE = "import time; t = time.perf_counter(); {stmt}; print(time.perf_counter() - t)"


def _once(python: str, stmt: str) -> float:
    done = subprocess.run([python, "-c", _PROBE.format(stmt=stmt)], capture_output=True, text=True, env=python_env(), check=True)
    return float(done.stdout.strip().splitlines()[-1])


def run(peer_python: Path, *, reps: int) -> dict[str, Any]:
    """Median (and all) import seconds of each entry point over ``reps`` fresh interpreters."""
    targets = [(name, sys.executable, stmt) for name, stmt in OURS.items()] + [(n, str(peer_python), s) for n, s in PEER.items()]
    for _, python, stmt in targets:  # warm the file cache and the bytecode caches first
        _once(python, stmt)
    times: dict[str, list[float]] = {name: [] for name, _, _ in targets}
    for _ in range(reps):
        for name, python, stmt in targets:
            times[name].append(_once(python, stmt))
    return {name: {"median_s": statistics.median(v), "min_s": min(v), "runs": v, "statement": s}
            for (name, _, s), v in zip(targets, times.values(), strict=True)}  # fmt: skip
