"""Runs the test suite as three pytest sessions side by side, and fails if any fails.

The integration tests spend most of their time waiting on the control plane (controllers'
resyncs, pods' back-offs, Kueue's admission); the unit and local tests keep the CPUs busy
(torch training). Run one after the other they left the two cores half idle (`make test`
used 0.55 of a core on average); side by side the suite takes about as long as its longer half.
The groups share nothing: the local tests need no cluster, the integration session starts
one (and the real node, one per machine), and the files that start clusters of their own (other
Trainer releases, the oldest Kubernetes) run in a third session, with some of the files that need
only KWOK's nodes on a session cluster of that session's own.

Each session's lines are printed as they come, prefixed with the group's name; at the end,
each group's summary line again, one after the other.

    python hack/pytest_groups.py [pytest args for every session...]
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
# The lines of pytest's short summary that name a failed or erroring test ("-ra" prints them).
PROBLEM = re.compile(r"^(FAILED|ERROR) ")
# How many of them are repeated per group at the end, where a CI log's tail shows them.
MAX_PROBLEMS = 40
SUMMARY = re.compile(r"\d+ (passed|failed|errors?|skipped|deselected|xfailed|xpassed|warnings?)\b.* in [\d.]+s")
# Test files that run clusters of their own (other Trainer releases, Kubernetes 1.32), without the
# real node: a session of their own beside the one that runs the session cluster and the real node.
OWN_CLUSTERS = ["tests/integration/test_trainer_versions.py", "tests/integration/test_k8s_v1_32.py"]
# Files whose tests need only KWOK's nodes (no real node, no images) and that mostly wait on the
# control plane: they run in that second session, on a session cluster of its own, so the
# integration session (the longest, the real pods' training at its end) is shorter by their
# minutes. A new machine starts both sessions after the same Go build.
KWOK_ONLY = [
    "tests/integration/test_launcher_k8s.py",
    "tests/integration/test_faults_controlplane.py",
    "tests/integration/test_faults_start.py",
    "tests/integration/test_faults_lineage.py",
    "tests/integration/test_cancel_k8s.py",
    "tests/integration/test_faults_cancel.py",
    "tests/integration/test_controlplane_smoke.py",
    "tests/integration/test_faults_logs.py",
]
GROUPS = {
    "integration": ["tests/integration", *(f"--ignore={path}" for path in OWN_CLUSTERS + KWOK_ONLY)],
    "own clusters": [*OWN_CLUSTERS, *KWOK_ONLY],
    "unit+local": ["--doctest-modules", "kfp_trainer", "tests/unit", "tests/local"],
}
# The unit and local tests (torch training, CPU-bound) have slack: the integration session is the
# longer one, and on a new machine it first waits for the control plane's Go build. Run at a lower
# priority, they take the CPU time the build and the real pods' training leave, not theirs.
NICE = {"unit+local": 10}


def run(extra: list[str], groups: dict[str, list[str]] = GROUPS, cwd: Path = REPO, nice: dict[str, int] = NICE) -> int:
    """Starts every group, relays their output, and returns 0 only if every session passed."""
    lock = threading.Lock()
    width = max(map(len, groups))
    procs: dict[str, subprocess.Popen[str]] = {}
    last_lines: dict[str, list[str]] = {name: [] for name in groups}
    problems: dict[str, list[str]] = {name: [] for name in groups}
    env = {**os.environ, "PYTHONUNBUFFERED": "1"}

    def relay(name: str, proc: subprocess.Popen[str]) -> None:
        assert proc.stdout is not None
        for line in proc.stdout:
            with lock:
                sys.stdout.write(f"[{name:<{width}}] {line}")
                sys.stdout.flush()
            last_lines[name] = [*last_lines[name][-40:], line.rstrip("\n")]
            if PROBLEM.match(line):
                problems[name].append(line.rstrip("\n")[:300])

    threads = []
    for name, args in groups.items():
        cmd = [sys.executable, "-m", "pytest", *args, *extra]
        lower = nice.get(name, 0)
        procs[name] = subprocess.Popen(cmd, cwd=cwd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                                       preexec_fn=(lambda n=lower: os.nice(n)) if lower else None)  # fmt: skip
        t = threading.Thread(target=relay, args=(name, procs[name]), daemon=True)
        t.start()
        threads.append(t)
    try:
        codes = {name: proc.wait() for name, proc in procs.items()}
    except KeyboardInterrupt:
        for proc in procs.values():
            proc.terminate()
        codes = {name: proc.wait() for name, proc in procs.items()}
    for t in threads:
        t.join(10)
    print("=" * 30 + " summary of the test groups " + "=" * 30)
    for name in groups:
        for line in problems[name][:MAX_PROBLEMS]:
            print(f"{name}: {line}")
        if len(problems[name]) > MAX_PROBLEMS:
            print(f"{name}: ... and {len(problems[name]) - MAX_PROBLEMS} more failed or erroring tests above")
    for name in groups:
        summary = [line for line in last_lines[name] if SUMMARY.search(line)]
        print(f"{name}: exit {codes[name]}: {summary[-1].strip('= ') if summary else '(no summary line)'}")
    return 0 if all(code == 0 for code in codes.values()) else 1


if __name__ == "__main__":
    sys.exit(run(sys.argv[1:]))
