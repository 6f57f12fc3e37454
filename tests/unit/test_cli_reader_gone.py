"""``kfp-trainer render ... | head -1``: no traceback when the reader goes away; exit 141, as git and kubectl end there.

Each command runs as a real process writing into a real pipe: once through ``head -1`` in bash
(with an output larger than the pipe's buffer, so the writer meets the closed pipe while
writing), once into a pipe whose reading end is closed before the process starts.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLI = [sys.executable, "-m", "kfp_trainer.cli"]
ENV = {**os.environ, "PYTHONPATH": str(REPO)}


def big_inputs(folder: Path) -> Path:
    """Inputs whose TrainJob is ~200 KiB: more than a pipe holds (64 KiB) and than head reads before it exits."""
    path = folder / "inputs.json"
    path.write_text(json.dumps({"run_id": "r1", "pod_annotations": {f"note-{i}": "x" * 1000 for i in range(200)}}))
    return path


@pytest.mark.parametrize("output", ["yaml", "json"])
def test_render_piped_to_head_ends_quietly_with_141(tmp_path, output):
    command = shlex.join([*CLI, "render", "--inputs-file", str(big_inputs(tmp_path)), "-o", output])
    script = f'set -o pipefail; {command} 2>"$ERR" | head -1; echo "status: ${{PIPESTATUS[*]}}"'
    err = tmp_path / "stderr"
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, env={**ENV, "ERR": str(err)}, timeout=120)
    first, status = done.stdout.splitlines()
    assert first == ("apiVersion: trainer.kubeflow.org/v1alpha1" if output == "yaml" else "{")
    assert status == "status: 141 0"
    assert err.read_text() == "", err.read_text()


@pytest.mark.parametrize(
    "argv",
    [["render", "--api-version", "v2.2", "--run-id", "r1"], ["--version"]],
    ids=["render", "version"],
)
def test_a_pipe_closed_before_anything_is_written(argv):
    read, write = os.pipe()
    os.close(read)  # every write now meets a closed pipe
    try:
        done = subprocess.run([*CLI, *argv], stdout=write, stderr=subprocess.PIPE, text=True, env=ENV, timeout=120)
    finally:
        os.close(write)
    assert done.returncode == 141  # 128 + SIGPIPE
    assert done.stderr == ""


def test_bad_input_still_says_so_on_stderr_with_exit_2():
    read, write = os.pipe()
    os.close(read)
    try:
        done = subprocess.run([*CLI, "render", "--run-id", "r1", "--num-nodes", "0"], stdout=write, stderr=subprocess.PIPE,
                              text=True, env=ENV, timeout=120)  # fmt: skip
    finally:
        os.close(write)
    assert done.returncode == 2 and "num_nodes: got 0" in done.stderr and "Traceback" not in done.stderr
