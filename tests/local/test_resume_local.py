"""A training node killed mid-run, then the step retried: the replacement job resumes from the last checkpoint.

Real runs on this machine: the torchtune runtime's own recipe under a whole pipeline whose
fine-tune KFP (``kfp.local``) retries, the sample SFT trainer under the ``train_job`` step run
twice on the same artifacts (what a KFP retry does), and the classifier crashed right after
a checkpoint. Each node is killed with SIGKILL, every process of it (torchrun starts each rank
in a session of its own), as a lost machine would be.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kfp_trainer.backends.procs import descendants, signal_all
from kfp_trainer.cli import task_outputs

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).with_name("kfp-trainer")


def clean_env(**extra: str) -> dict[str, str]:
    return {**{k: v for k, v in os.environ.items() if not k.startswith("KFP_TRAINER_")}, **extra}


def kill_node(job_dir: Path) -> list[int]:
    """SIGKILL every process of the local TrainJob's nodes (launcher and ranks)."""
    status = json.loads((job_dir / "trainjob.json").read_text())["status"]
    roots = [p[0] for p in status["processes"]]
    victims = [pid for root in roots for pid in (root, *descendants(root))]
    signal_all(victims, signal.SIGKILL)
    return victims


def wait_for(what: str, check, proc: subprocess.Popen, timeout: float):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = check()
        if found:
            return found
        if proc.poll() is not None:
            pytest.fail(f"the run ended (exit {proc.returncode}) before {what}")
        time.sleep(0.2)
    pytest.fail(f"timed out waiting for {what}")


def jobs(root: Path) -> list[dict]:
    found = []
    for path in sorted(root.glob("*/*/trainjob.json"), key=lambda p: p.stat().st_mtime):
        job = json.loads(path.read_text())
        job["_dir"] = path.parent
        found.append(job)
    return found


def phase(job: dict) -> str:
    return next((c["type"] for c in job["status"]["conditions"] if c["status"] == "True"), "Running")


# --------------------------------------------------------------------------- torchtune


@pytest.mark.slow
def test_a_killed_torchtune_node_is_resumed_by_the_kfp_retry_from_its_last_epoch_with_identical_losses(tmp_path):
    pytest.importorskip("torchtune", reason="the [llm] extra (torchtune) is not installed")
    from kfp_trainer.llm.local_tune import tune_losses

    out = tmp_path / "run"
    args = [str(CLI), "run", str(REPO / "pipelines" / "llm_finetune_torchtune"), "--local", "--output", str(out),
            "--param", "epochs=2", "--param", "eval_examples=8"]  # fmt: skip
    started = time.monotonic()
    with open(tmp_path / "run.log", "w") as log:
        proc = subprocess.Popen(args, stdout=log, stderr=subprocess.STDOUT, env=clean_env())
        try:
            # 64 rows on 2 ranks, batch 4: 8 steps an epoch. Kill once epoch 2 has logged its second step.
            def second_step_of_epoch_two():
                for job in jobs(out / "trainjobs"):
                    node_log = job["_dir"] / "logs" / "node-0.log"
                    if node_log.is_file() and (2, 10) in tune_losses(node_log.read_text(errors="replace")):
                        return job["_dir"]
                return None

            first_dir = wait_for("epoch 2's second step", second_step_of_epoch_two, proc, 600)
            killed_at = time.monotonic() - started
            assert kill_node(first_dir)
            proc.wait(timeout=900)
        finally:
            if proc.poll() is None:
                proc.kill()
    assert proc.returncode == 0, (tmp_path / "run.log").read_text()[-4000:]

    first, resumed = jobs(out / "trainjobs")
    assert first["_dir"] == first_dir and phase(first) == "Failed" and first["status"]["exitCodes"] == {"0": -9}
    assert phase(resumed) == "Complete"
    assert resumed["spec"]["trainer"]["args"][-3:] == [
        "resume_from_checkpoint=True",
        "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.safetensors]",
        "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt",
    ]
    before = tune_losses((first["_dir"] / "logs" / "node-0.log").read_text(errors="replace"))
    after = tune_losses((resumed["_dir"] / "logs" / "node-0.log").read_text(errors="replace"))
    assert sorted(after) == [(2, step) for step in range(9, 17)], f"the retry did not start at epoch 2: {sorted(after)}"
    assert [after[s] for s in ((2, 9), (2, 10))] == [before[s] for s in ((2, 9), (2, 10))]  # the same steps, the same losses

    outputs = dict(task_outputs(out / "artifacts"))
    model = outputs["torchtune-finetune"]["artifacts"]["output_model"]["artifacts"][0]
    assert (model["metadata"]["resumed_from"], model["metadata"]["epochs"]) == ("epoch_0", 2)
    assert (Path(model["uri"]) / "model-00001-of-00001.safetensors").is_file()
    report = Path(outputs["torchtune-finetune"]["artifacts"]["report"]["artifacts"][0]["uri"]).read_text()
    assert "resumed" in report and "epoch_0 of an earlier try (1 of 2 epochs done)" in report
    base = outputs["evaluate-model"]["artifacts"]["metrics"]["artifacts"][0]["metadata"]["loss"]
    tuned = outputs["evaluate-model-2"]["artifacts"]["metrics"]["artifacts"][0]["metadata"]["loss"]
    assert tuned < base - 0.5 and outputs["evaluate-model-2"]["parameterValues"]["Output"] is True
    took = time.monotonic() - started
    print(f"torchtune resume: node killed at {killed_at:.0f} s, pipeline {took:.0f} s, loss {base:.3f} -> {tuned:.3f}")


# --------------------------------------------------------------------------- the SFT trainer

STEP = """
import json, sys
from kfp_trainer.components import train_job
class Artifact:
    def __init__(self, path, metadata=None):
        self.path = self.uri = path
        self.metadata = metadata or {}
    def log_metric(self, name, value):
        self.metadata[name] = value
root, data, base, extra = sys.argv[1], sys.argv[2], sys.argv[3], json.loads(sys.argv[4])
out = {n: Artifact(f"{root}/{n}") for n in ("output_model", "metrics", "report")}
train_job.python_func(
    runtime="torch-distributed", command=["torchrun", "-m", "kfp_trainer.trainers.sft"],
    args=["--model-dir", "{model}", "--dataset-dir", "{dataset}", "--output-dir", "{output_model}", *extra],
    num_proc_per_node="1", dataset=Artifact(data), model=Artifact(base, {"source_uri": "builtin://models/tiny-char-lm"}),
    trainjob=f"{root}/trainjob", backend="local", run_id="run-1", task_name="train", task_id="1", pipeline_name="resume", **out,
)
print(json.dumps({n: a.metadata for n, a in out.items()}))
"""


@pytest.fixture(scope="module")
def addition(tmp_path_factory) -> tuple[Path, Path]:
    from kfp_trainer.trainers import builtin

    root = tmp_path_factory.mktemp("builtin")
    data = builtin.materialize("builtin://datasets/addition", root / "data")
    return data, builtin.materialize("builtin://models/tiny-char-lm", root / "model")


def run_step(root: Path, addition, extra: list[str], local_root: Path, **popen) -> subprocess.Popen:
    data, base = addition
    cmd = [sys.executable, "-c", STEP, str(root), str(data), str(base), json.dumps(extra)]
    return subprocess.Popen(cmd, env=clean_env(KFP_TRAINER_LOCAL_ROOT=str(local_root)), text=True, **popen)


@pytest.mark.slow
def test_a_killed_sft_node_is_resumed_by_the_retried_step_from_its_last_checkpoint_with_the_same_result(tmp_path, addition):
    extra = ["--max-steps", "120", "--checkpoint-steps", "40", "--logging-steps", "10", "--learning-rate", "3e-3"]
    root, local_root = tmp_path / "step", tmp_path / "trainjobs"
    first = run_step(root, addition, extra, local_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        wait_for("the checkpoint at step 80", lambda: (root / "output_model" / ".checkpoints" / "step-80").is_dir(), first, 300)
        [job_dir] = (local_root / "local").iterdir()
        kill_node(job_dir)
        log, _ = first.communicate(timeout=120)
    finally:
        if first.poll() is None:
            first.kill()
    assert first.returncode == 1 and "TrainJob local/" in log and "failed" in log, log[-3000:]

    retry = run_step(root, addition, extra, local_root, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log, _ = retry.communicate(timeout=300)
    assert retry.returncode == 0, log[-3000:]
    assert "replaced failed TrainJob" in log and "resuming from the checkpoint at step 80" in log
    steps = [json.loads(line)["step"] for line in log.splitlines() if line.startswith('{"step"')]
    assert steps == [90, 100, 110, 120], steps  # the retry trained only what the killed node had not
    outputs = json.loads(log.strip().splitlines()[-1])
    model = outputs["output_model"]
    assert model["resumed_from_step"] == 80 and model["steps"] == 120
    assert not (root / "output_model" / ".checkpoints").exists()
    assert "from the checkpoint at step 80 of an earlier try" in (root / "report").read_text()

    # The same training without the kill: the resumed run's result is the same.
    whole = run_step(tmp_path / "whole", addition, extra, tmp_path / "trainjobs-whole", stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    log, _ = whole.communicate(timeout=300)
    assert whole.returncode == 0, log[-3000:]
    assert json.loads(log.strip().splitlines()[-1])["output_model"]["train_loss"] == model["train_loss"]
    assert (tmp_path / "whole" / "output_model" / "model.safetensors").read_bytes() == (
        root / "output_model" / "model.safetensors"
    ).read_bytes()


# --------------------------------------------------------------------------- the classifier


def test_the_classifier_crashed_after_a_checkpoint_resumes_after_that_epoch_and_ends_where_an_uninterrupted_run_ends(
    tmp_path, monkeypatch
):
    pytest.importorskip("sklearn")
    from kfp_trainer.trainers import checkpointing, digits

    data = tmp_path / "data"
    digits.prepare(str(data))
    argv = ["train", "--dataset-dir", str(data), "--epochs", "6", "--hidden", "16"]
    whole = digits.train(digits.build_parser().parse_args([*argv, "--output-dir", str(tmp_path / "whole")]))

    real_save = checkpointing.save

    class NodeLost(Exception):
        pass

    def save_then_die(output_dir, step, state, meta, **kw):
        path = real_save(output_dir, step, state, meta, **kw)
        if state["epoch"] == 3:
            raise NodeLost
        return path

    out = tmp_path / "resumed"
    monkeypatch.setattr(checkpointing, "save", save_then_die)
    with pytest.raises(NodeLost):
        digits.train(digits.build_parser().parse_args([*argv, "--output-dir", str(out)]))
    monkeypatch.setattr(checkpointing, "save", real_save)
    assert checkpointing.latest(out).meta["epochs"] == 6
    resumed = digits.train(digits.build_parser().parse_args([*argv, "--output-dir", str(out)]))
    info = json.loads((out / "training_info.json").read_text())
    assert info["resumed_from_step"] == whole["steps"] // 2 and resumed["steps"] == whole["steps"]
    assert (resumed["val_loss"], resumed["val_accuracy"]) == (whole["val_loss"], whole["val_accuracy"])
    assert (out / "model.safetensors").read_bytes() == (tmp_path / "whole" / "model.safetensors").read_bytes()
    assert not (out / checkpointing.FOLDER).exists()
