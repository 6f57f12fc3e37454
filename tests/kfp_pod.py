"""A KFP step's container, as a cancel reaches it: the process tree KFP 2.17 on Argo runs a step in.

    unshare --pid --fork --kill-child python tests/kfp_pod.py pod --log LOG --events EVENTS [--linger S] -- STEP...
    python tests/kfp_pod.py launcher --log LOG -- STEP...     (its own process group: the test signals the group)

Roles, each a stand-in for the real program, doing what a cancel depends on:

* ``pod`` -- Argo's emissary, the container's first process (PID 1 of its PID namespace under
  ``unshare``). It starts ``launcher`` as the leader of a process group of its own and, on SIGTERM
  or SIGINT, sends that signal to the whole group. Once ``launcher`` has ended it waits
  ``--linger`` seconds (its own work before it exits: 1.7 s on a real KFP 2.17 backend, from the
  signal to the container's end) and exits: the kernel then kills every process left in the PID
  namespace, the step included, as a container's end does.
* ``launcher`` -- KFP's launcher-v2: it starts the step in its own process group, with the step's
  stdout and stderr in one pipe it copies into ``--log`` (the executor-logs artifact and the
  pod's log). It has no handler for the stop signals: the group's signal ends it at once, and the
  step's output loses its reader at the moment the step gets the signal.

``--events`` gets one line per moment, with ``time.time()``: ``started``, ``step PID``,
``signal N``, ``launcher-exited CODE``, ``exit``.
"""

from __future__ import annotations

import argparse
import os
import signal
import subprocess
import sys
import time


def record(path: str | None, what: str) -> None:
    if path:
        with open(path, "a") as f:
            f.write(f"{time.time():.3f} {what}\n")


def launcher(args: argparse.Namespace) -> int:
    for sig in (signal.SIGTERM, signal.SIGINT):
        signal.signal(sig, signal.SIG_DFL)  # dies of the signal at once, as a Go program without a handler
    step = subprocess.Popen(args.step, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    record(args.events, f"step {step.pid}")
    assert step.stdout is not None
    with open(args.log, "ab") as log:
        while chunk := os.read(step.stdout.fileno(), 65536):
            log.write(chunk)
            log.flush()
    return step.wait()


def pod(args: argparse.Namespace) -> int:
    here = [sys.executable, os.path.abspath(__file__), "launcher", "--log", args.log, *(["--events", args.events] if args.events else [])]
    child = subprocess.Popen([*here, "--", *args.step], process_group=0)
    signalled: list[int] = []

    def forward(signum: int, frame: object) -> None:
        signalled.append(signum)
        record(args.events, f"signal {signum}")
        try:
            os.killpg(child.pid, signum)
        except ProcessLookupError:
            pass

    signal.signal(signal.SIGTERM, forward)
    signal.signal(signal.SIGINT, forward)
    record(args.events, "started")
    code = child.wait()
    record(args.events, f"launcher-exited {code}")
    if signalled:
        time.sleep(args.linger)
    record(args.events, "exit")
    return 0 if code == 0 else 1


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("role", choices=["pod", "launcher"])
    parser.add_argument("--log", required=True)
    parser.add_argument("--events")
    parser.add_argument("--linger", type=float, default=1.7)
    parser.add_argument("step", nargs="+")
    args = parser.parse_args()
    return pod(args) if args.role == "pod" else launcher(args)


if __name__ == "__main__":
    sys.exit(main())
