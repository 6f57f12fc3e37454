"""A stop signal as KFP (or a terminal) sends it leaves no trainer process behind, from every entry point (local backend).

The step runs under a stand-in of KFP's launcher (``tests/kfp_pod.py launcher``) that holds its
stdout in a pipe, in one process group with it; the signal goes to the whole group, and the
launcher dies of it at once, so the step's output has no reader any more. The local TrainJob's
two nodes (real processes, each in a process group of its own) must be gone once the step has
ended, and its state with them.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path

import pytest

from tests.entry_points import ENTRY_POINTS, step_argv

pytestmark = pytest.mark.timeout(180)
POD = Path(__file__).resolve().parents[1] / "kfp_pod.py"
TRAINER = "import sys, time\nfor i in range(3000):\n    print(f'line {i}', flush=True)\n    time.sleep(0.1)\n"


def marked(marker: str) -> list[int]:
    """Pids of the processes whose command line holds ``marker``."""
    found = []
    for entry in Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                if marker.encode() in (entry / "cmdline").read_bytes():
                    found.append(int(entry.name))
            except OSError:
                pass
    return found


def alive(pid: int) -> bool:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return False
    return not stat.split(") ", 1)[1].startswith("Z")


def wait_until(check, timeout: float, what: str):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        time.sleep(0.1)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
@pytest.mark.parametrize("entry", ENTRY_POINTS)
def test_a_signal_to_the_steps_process_group_leaves_no_trainer_process(tmp_path, entry, sig):
    marker = f"kfp-trainer-test-{uuid.uuid4().hex[:12]}"
    trainer = tmp_path / "trainer.py"
    trainer.write_text(TRAINER)
    inputs = {"run_id": f"run-{marker[-6:]}", "task_name": "train", "num_nodes": 2, "command": ["python", str(trainer), marker]}
    argv = step_argv(entry, inputs, {"logs": "all"}, backend="local", folder=tmp_path / "step")
    log, events = tmp_path / "step.log", tmp_path / "events"
    env = {**os.environ, "KFP_TRAINER_LOCAL_ROOT": str(tmp_path / "jobs"), "PYTHONUNBUFFERED": "1",
           "PATH": f"{Path(sys.executable).parent}:{os.environ.get('PATH', '')}"}  # fmt: skip
    launcher = subprocess.Popen([sys.executable, str(POD), "launcher", "--log", str(log), "--events", str(events), "--", *argv],
                                env=env, process_group=0)  # fmt: skip
    try:
        # both nodes print: the trainer runs
        wait_until(lambda: log.exists() and all(f"[node-{n}] line 2" in log.read_text() for n in (0, 1)), 120, "both nodes' lines")
        nodes = marked(marker)
        assert len(nodes) >= 2, nodes
        step = int(next(line for line in events.read_text().splitlines() if " step " in line).split()[-1])
        os.killpg(launcher.pid, sig)  # KFP's emissary signals the group: the launcher dies at once, the step gets it too
        assert launcher.wait(timeout=10) == -sig  # the reader of the step's output is gone
        wait_until(lambda: not alive(step), 60, "the step to end")
        # no process of the run is left: the nodes (and every process they started), the step, its shell
        wait_until(lambda: not [p for p in marked(marker) if alive(p)], 15, "the trainer processes to go")
    finally:
        if launcher.poll() is None:
            launcher.kill()
        for pid in marked(marker):  # never leave one running past the test, whatever failed
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
    assert not list((tmp_path / "jobs").rglob("trainjob.json")), "the local job's state is still there"
