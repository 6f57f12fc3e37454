"""Local jobs whose launcher died: detected (pid and start time), replaced or failed, never waited on forever."""

from __future__ import annotations

import io
import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from kfp_trainer.backends.local import LocalBackend
from kfp_trainer.backends.procs import ProcessId, pid_alive
from kfp_trainer.errors import JobFailedError
from kfp_trainer.jobstatus import JobRef
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

pytestmark = pytest.mark.timeout(120)

# Sleeps the first time it runs, finishes at once when run again (the marker file exists).
ONCE_SLOW = (
    "import os, sys, time; m = sys.argv[1]; first = not os.path.exists(m); open(m, 'a').close(); "
    "print('started', flush=True); time.sleep(300 if first else 0)"
)


def job_inputs(marker: Path) -> TrainJobInputs:
    return TrainJobInputs(run_id="run-1", task_name="train", command=["python", "-c", ONCE_SLOW, str(marker)])


def launch_in_a_process(root: Path, marker: Path) -> subprocess.Popen:
    args = [
        "launch",
        "--local",
        "--run-id",
        "run-1",
        "--task-name",
        "train",
        "--command",
        json.dumps(["python", "-c", ONCE_SLOW, str(marker)]),
    ]
    env = {**os.environ, "KFP_TRAINER_LOCAL_ROOT": str(root)}
    return subprocess.Popen([sys.executable, "-m", "kfp_trainer.cli", *args], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.STDOUT)


def wait_started(root: Path) -> dict:
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        for state_file in root.rglob("trainjob.json"):
            state = json.loads(state_file.read_text())
            logs = list(state_file.parent.glob("logs/node-*.log"))
            if state["status"].get("processes") and any("started" in p.read_text() for p in logs):
                return state
        time.sleep(0.2)
    raise AssertionError("the first launch did not start its node")


def test_a_rerun_after_the_launcher_was_killed_replaces_the_orphaned_job(tmp_path):
    root, marker = tmp_path / "jobs", tmp_path / "marker"
    first = launch_in_a_process(root, marker)
    state = wait_started(root)
    orphan = ProcessId.from_json(state["status"]["processes"][0])
    first.send_signal(signal.SIGKILL)
    first.wait()
    assert orphan.alive()  # the node outlived its launcher: nobody records its end now

    out = io.StringIO()
    started = time.monotonic()
    backend = LocalBackend(root)
    outcome = Launcher(backend, LaunchOptions(), out=out).run(prepare(backend, job_inputs(marker)))

    assert outcome.succeeded and outcome.replaced and time.monotonic() - started < 30
    assert f"a launcher that is gone (pid {first.pid})" in out.getvalue()
    assert not orphan.alive()


def test_a_recorded_pid_now_held_by_another_process_is_neither_trusted_nor_killed(tmp_path):
    root, marker = tmp_path / "jobs", tmp_path / "marker"
    marker.touch()  # the job finishes at once
    bystander = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        backend = LocalBackend(root)
        launcher = Launcher(backend, LaunchOptions(), out=io.StringIO())
        manifest = prepare(launcher.backend, job_inputs(marker)).manifest
        # An unfinished job whose supervisor and node pids now belong to other processes (pid reuse).
        directory = backend.job_dir(JobRef("local", manifest["metadata"]["name"]))
        (directory / "logs").mkdir(parents=True)
        reused = ProcessId.of(bystander.pid)
        state = {
            **manifest,
            "metadata": {**manifest["metadata"], "namespace": "local", "uid": "local-old"},
            "status": {
                "conditions": [],
                "supervisor": [os.getpid(), ProcessId.of(os.getpid()).start + 1],
                "processes": [[reused.pid, reused.start + 1]],
            },
        }
        (directory / "trainjob.json").write_text(json.dumps(state))

        outcome = launcher.run(prepare(launcher.backend, job_inputs(marker)))

        assert outcome.replaced and outcome.succeeded
        assert pid_alive(bystander.pid)  # not the job's process any more: left alone
    finally:
        bystander.kill()
        bystander.wait()


def test_an_adopted_job_whose_launcher_dies_fails_instead_of_hanging(tmp_path):
    root, marker = tmp_path / "jobs", tmp_path / "marker"
    first = launch_in_a_process(root, marker)
    wait_started(root)
    result: dict = {}

    def adopt():
        try:
            backend = LocalBackend(root)
            Launcher(backend, LaunchOptions(), out=io.StringIO()).run(prepare(backend, job_inputs(marker)))
        except JobFailedError as e:
            result["error"] = e

    thread = threading.Thread(target=adopt, daemon=True)
    thread.start()
    time.sleep(1.0)  # the second launcher adopts and follows the state file
    first.send_signal(signal.SIGKILL)
    first.wait()
    thread.join(30)
    assert not thread.is_alive()
    assert "SupervisorLost" in str(result["error"]) and f"pid {first.pid}" in str(result["error"])
