"""GRPO for real on CPU: TRL's GRPOTrainer on the tiny builtin model, a user's reward function shipped as source.

Each run is ``torchrun -m kfp_trainer.trainers.trl_train grpo`` as the ``kfp-trainer-trl``
runtime's node runs it, on ``builtin://models/tiny-char-lm`` and ``builtin://datasets/addition``:
two processes with a shipped reward (what the TrainJob's arguments carry), a reward that breaks
and is named with its sample, a run killed after a checkpoint that resumes, and a step whose
dataset lacks the prompt column, refused before any TrainJob exists.
"""

from __future__ import annotations

import json
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from kfp_trainer.components import reward
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.llm.trl_config import trl_settings
from kfp_trainer.trainers.builtin import materialize

TORCHRUN = [str(Path(sys.executable).with_name("torchrun")), "--nnodes", "1", "--standalone"]
TRAINER = ["-m", "kfp_trainer.trainers.trl_train"]


def digits_only(completions, **kwargs):
    """A shaping reward: the completion is a number."""
    return [1.0 if c.strip().isdigit() else 0.0 for c in completions]


def breaks_on_long_answers(completions, prompts, **kwargs):
    return [1.0 / (len(c) < 4) for c in completions]  # ZeroDivisionError on a completion of 4 characters or more


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("grpo")
    return materialize("builtin://models/tiny-char-lm", root / "model"), materialize("builtin://datasets/addition", root / "data")


def grpo(model: Path, data: Path, out: Path, rewards: list, *flags: str, procs: int = 1) -> list[str]:
    """The trainer's command line as the step renders it (the same settings check, then the folders)."""
    settings = trl_settings(method="grpo", rewards=rewards, num_generations=4, per_device_train_batch_size=8, max_completion_length=4,
                            learning_rate=0.001, logging_steps=1, world_size=procs)  # fmt: skip
    return [*TORCHRUN, "--nproc-per-node", str(procs), *TRAINER, *settings.to_args(), "--model_name_or_path", str(model),
            "--dataset_name", str(data), "--output_dir", str(out), *flags]  # fmt: skip


def run(args: list[str], *, ok: bool = True) -> subprocess.CompletedProcess:
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env={"PYTHONUNBUFFERED": "1", **_env()})
    assert (done.returncode == 0) == ok, done.stdout[-3000:] + done.stderr[-3000:]
    return done


def _env() -> dict[str, str]:
    import os

    return {k: v for k, v in os.environ.items() if not k.startswith(("MLFLOW_", "KFP_TRAINER_"))}


def lines_of(done: subprocess.CompletedProcess) -> list[dict]:
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_grpo_on_two_processes_calls_the_shipped_reward_and_logs_each_rewards_mean_and_spread(inputs, tmp_path):
    model, data = inputs
    out = tmp_path / "out"
    done = run(grpo(model, data, out, ["exact_answer", reward(digits_only, weight=0.2)], "--max_steps", "3", procs=2))
    steps = [line for line in lines_of(done) if "rewards/digits_only/mean" in line]
    assert [line["step"] for line in steps] == [1, 2, 3]
    assert {"rewards/exact_answer/std", "rewards/digits_only/std", "reward", "completions/mean_length"} <= set(steps[0])
    assert "num_tokens" not in steps[0] and "step_time" not in steps[0]  # TRL's counters stay out of the metrics
    info = json.loads((out / "training_info.json").read_text())
    assert (info["method"], info["world_size"], info["steps"]) == ("grpo", 2, 3)
    assert info["rewards"] == [{"name": "exact_answer", "weight": 1.0}, {"name": "digits_only", "weight": 0.2}]
    samples = [json.loads(line) for line in (out / "completions.jsonl").read_text().splitlines()]
    assert samples and all(set(s["rewards"]) == {"exact_answer", "digits_only"} for s in samples)
    assert all(s["rewards"]["digits_only"] == float(s["completion"].strip().isdigit()) for s in samples)  # the shipped source ran
    assert (out / "model.safetensors").is_file()


def test_a_reward_that_raises_fails_the_run_with_its_name_and_sample_not_a_trl_traceback(inputs, tmp_path):
    model, data = inputs
    done = run(grpo(model, data, tmp_path / "out", [reward(breaks_on_long_answers)], "--max_steps", "2"), ok=False)
    said = [line for line in done.stderr.splitlines() if "reward function breaks_on_long_answers raised ZeroDivisionError" in line]
    assert said and re.search(r"on sample \d+ \(prompt '\d+\+\d+=', completion ['\"]", said[0]), done.stderr[-3000:]
    assert "Traceback" not in done.stderr.split(said[0])[0].rsplit("trl_train: rewards:", 1)[-1]


def test_a_grpo_run_killed_after_a_checkpoint_resumes_from_it(inputs, tmp_path):
    model, data = inputs
    out = tmp_path / "out"
    args = grpo(model, data, out, ["exact_answer"], "--max_steps", "60", "--save_steps", "3")
    first = subprocess.Popen([sys.executable, *args[len(TORCHRUN) + 2 :]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoint-3" / "trainer_state.json").is_file() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)
    finally:
        first.send_signal(signal.SIGKILL)  # a lost node
        first.wait()
    assert first.returncode != 0 and not (out / "training_info.json").exists()
    saved = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if (p / "trainer_state.json").is_file())
    done = run(grpo(model, data, out, ["exact_answer"], "--max_steps", str(saved + 3), "--save_steps", "3"))
    assert {"resumed_from_step": saved} in lines_of(done)
    info = json.loads((out / "training_info.json").read_text())
    assert info["resumed_from_step"] == saved and info["steps"] == saved + 3


def test_a_dataset_without_the_prompt_column_is_refused_when_the_step_starts_before_any_trainjob(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from kfp_trainer import steps

    monkeypatch.setenv("KFP_TRAINER_LOCAL_ROOT", str(tmp_path / "trainjobs"))
    data = tmp_path / "data"
    data.mkdir()
    (data / "train.jsonl").write_text("".join(json.dumps({"question": f"{i}+1=", "answer": str(i + 1)}) + "\n" for i in range(9)))
    values = {"method": "grpo", "rewards": ["exact_answer"], "num_generations": 4, "per_device_train_batch_size": 8,
              "model_uri": "builtin://models/tiny-char-lm", "runtime": "kfp-trainer-trl", "num_proc_per_node": "1",
              "run_id": "run-1", "task_name": "grpo", "task_id": "1", "backend": "local"}  # fmt: skip
    out = tmp_path / "artifacts"
    artifacts = steps.StepArtifacts(
        output_model=SimpleNamespace(path=str(out / "model"), uri=str(out / "model"), metadata={}),
        metrics=SimpleNamespace(path=str(out / "metrics"), metadata={}, log_metric=lambda *a: None),
        report=SimpleNamespace(path=str(out / "report"), uri="", metadata={}),
        trainjob_path=str(out / "trainjob"), dataset=SimpleNamespace(path=str(data), uri=str(data), metadata={}), model=None,
    )  # fmt: skip
    said = r"dataset: got 'data'; expected a prompt dataset for GRPO: train.jsonl: has no prompt column"
    with pytest.raises(InvalidSpecErrors, match=said):
        steps.run_trl_finetune(**steps.trl_arguments(values), artifacts=artifacts, options=steps.StepOptions(backend="local"))
    assert not (tmp_path / "trainjobs").exists() and not (out / "trainjob").exists()  # no TrainJob, not even its name
