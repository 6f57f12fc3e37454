"""Two source trees' launchers, interleaved on one control plane: spawn -> TrainJob created, and CPU.

    .venv/bin/python -m bench.ab BEFORE_DIR AFTER_DIR [--rounds N]

Each directory holds a ``kfp_trainer`` package (a checkout, or ``git archive REV kfp_trainer``
unpacked); each launcher runs ``kfp-trainer launch`` with that directory first on
``PYTHONPATH``, the two alternating, so both see the same machine load -- on a shared machine
the figures of two separate ``make bench`` runs are not comparable. Spawn -> created comes from
the API server's audit log, as in ``make bench``. Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import os
import shutil
import sys
import tempfile
from pathlib import Path

from bench import analyze, env
from bench.audit import AuditLog
from bench.launches import Runner, pod_script


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", type=Path)
    parser.add_argument("after", type=Path)
    parser.add_argument("--rounds", type=int, default=10)
    args = parser.parse_args(argv)
    trees = {"before": args.before.resolve(), "after": args.after.resolve()}
    for name, tree in trees.items():
        if not (tree / "kfp_trainer" / "__init__.py").is_file():
            parser.error(f"{name}: {tree} holds no kfp_trainer package")
    workdir = Path(tempfile.mkdtemp(prefix="kfp-bench-ab-"))
    cluster = env.start_cluster()
    launches: dict[str, list] = {name: [] for name in trees}
    load = []
    try:
        ids = env.Identities(cluster, workdir)
        runner = Runner(ids, workdir, env.peer_python())
        ns = env.make_namespace(ids.api, "bench-ab")
        script = pod_script([f"step {k}" for k in range(3)], line_delay=0.1)
        for i in range(args.rounds):
            for name, tree in trees.items():
                os.environ["PYTHONPATH"] = str(tree)  # read by each launcher's environment (bench.procs.python_env)
                launch = runner.run("ours", "none", f"ab-{name}-{i}", ns, script, 600)
                if launch.error:
                    raise RuntimeError(f"{name} launcher failed: {launch.error}")
                launches[name].append(launch)
            load.append(os.getloadavg()[0])
        log = AuditLog.read(cluster.audit_log)
        ids.close()
    finally:
        cluster.stop()
        shutil.rmtree(workdir, ignore_errors=True)
    print(f"{args.rounds} rounds, interleaved; load average {min(load):.1f}–{max(load):.1f}\n")
    print("| tree | spawn → TrainJob created, median (p95) | launcher CPU-seconds, spawn to exit (median) |")
    print("|---|---|---|")
    for name, group in launches.items():
        g = analyze.group_figures(group, log)
        s, c = g["spawn_to_created_s"], g["launcher_cpu_s"]
        print(f"| {name} ({trees[name]}) | {s['median']:.3f} s ({s['p95']:.3f} s) | {c['median']:.3f} s |")
    return 0


if __name__ == "__main__":
    sys.exit(main())
