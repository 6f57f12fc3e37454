"""The TRL trainer program for real on CPU: SFT and DPO steps on the tiny builtin model, and a killed run that resumes.

Each run is ``torchrun -m kfp_trainer.trainers.trl_train`` (one process), as the
``kfp-trainer-trl`` runtime's node runs it, on ``builtin://models/tiny-char-lm`` and
``builtin://datasets/addition-preference``.
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

from kfp_trainer.trainers.builtin import materialize

TORCHRUN = [str(Path(sys.executable).with_name("torchrun")), "--nnodes", "1", "--nproc-per-node", "1", "--standalone"]
TRAINER = ["-m", "kfp_trainer.trainers.trl_train"]


@pytest.fixture(scope="module")
def inputs(tmp_path_factory):
    root = tmp_path_factory.mktemp("trl")
    model = materialize("builtin://models/tiny-char-lm", root / "model")
    return model, materialize("builtin://datasets/addition-preference", root / "data")


def trl(method: str, model: Path, data: Path, out: Path, *flags: str) -> list[str]:
    return [*TORCHRUN, *TRAINER, method, "--model_name_or_path", str(model), "--dataset_name", str(data), "--output_dir", str(out),
            "--per_device_train_batch_size", "16", *flags]  # fmt: skip


def run(args: list[str]) -> list[dict]:
    done = subprocess.run(args, capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONUNBUFFERED": "1"})
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]


def test_sft_then_dpo_with_lora_train_and_save_full_then_merged_models(inputs, tmp_path):
    model, data = inputs
    lines = run(trl("sft", model, data, tmp_path / "sft", "--max_steps", "12", "--learning_rate", "0.003", "--logging_steps", "4"))
    losses = [line["loss"] for line in lines if "loss" in line and "step" in line]
    assert len(losses) == 3 and losses[-1] < losses[0]  # it learns
    info = json.loads((tmp_path / "sft" / "training_info.json").read_text())
    assert (info["method"], info["weights"], info["steps"], info["framework"]) == ("sft", "full", 12, "trl")
    assert (tmp_path / "sft" / "model.safetensors").is_file() and not list((tmp_path / "sft").glob("checkpoint-*"))

    lines = run(trl("dpo", tmp_path / "sft", data, tmp_path / "dpo", "--max_steps", "6", "--learning_rate", "0.005", "--beta", "0.1",
                    "--use_peft", "--lora_r", "4", "--lora_target_modules", "all-linear", "--logging_steps", "2"))  # fmt: skip
    assert any("rewards/margins" in line for line in lines) and lines[-1]["train_steps"] == 6
    info = json.loads((tmp_path / "dpo" / "training_info.json").read_text())
    assert (info["method"], info["weights"], info["merged_model"], info["hyperparameters"]["beta"]) == ("dpo", "adapter", True, 0.1)
    assert (tmp_path / "dpo" / "model.safetensors").is_file()  # the merged model, what from_pretrained loads
    assert json.loads((tmp_path / "dpo" / "adapter" / "adapter_config.json").read_text())["r"] == 4

    from kfp_trainer.trainers.preference_eval import evaluate_preferences

    scores = evaluate_preferences(tmp_path / "dpo", data, max_examples=20, reference_dir=tmp_path / "sft", exact_match=False)
    assert scores["pairs"] == 20 and 0 <= scores["win_rate"] <= 1 and scores["reward_margin"] != 0  # the adapter moved the policy


def test_a_fixed_seed_and_step_count_train_the_same_model_every_time(inputs, tmp_path):
    """The preference pipeline's figures (win rates) come from these runs: a busy machine must not move them."""
    model, data = inputs
    runs = []
    for i in range(2):
        lines = run(trl("sft", model, data, tmp_path / f"sft-{i}", "--max_steps", "6", "--learning_rate", "0.003", "--logging_steps", "2"))
        losses = [line["loss"] for line in lines if "loss" in line and "step" in line]
        runs.append((losses, (tmp_path / f"sft-{i}" / "model.safetensors").read_bytes()))
    assert len(runs[0][0]) == 3 and runs[0] == runs[1]


def test_a_run_killed_after_a_checkpoint_resumes_from_it_when_run_again(inputs, tmp_path):
    model, data = inputs
    out = tmp_path / "out"
    args = trl("sft", model, data, out, "--max_steps", "100", "--save_steps", "5", "--learning_rate", "0.003")
    # The first try as one plain process (torchrun's workers outlive a killed torchrun): killed like a lost node.
    first = subprocess.Popen([sys.executable, *args[len(TORCHRUN) :]], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 240
        while not (out / "checkpoint-5" / "trainer_state.json").is_file() and first.poll() is None and time.monotonic() < deadline:
            time.sleep(0.2)
        time.sleep(0.5)  # let the checkpoint's files settle
    finally:
        first.send_signal(signal.SIGKILL)  # a lost node: nothing runs to the end
        first.wait()
    assert first.returncode != 0 and not (out / "training_info.json").exists()
    saved = max(int(p.name.split("-")[1]) for p in out.glob("checkpoint-*") if (p / "trainer_state.json").is_file())
    lines = run(trl("sft", model, data, out, "--max_steps", "100", "--save_steps", "5", "--learning_rate", "0.003"))
    assert {"resumed_from_step": saved} in lines
    info = json.loads((out / "training_info.json").read_text())
    assert info["resumed_from_step"] == saved and info["steps"] == 100
    assert not list(out.glob("checkpoint-*"))  # gone once the final model is saved


def test_qlora_on_a_node_without_cuda_is_refused_before_training(inputs, tmp_path):
    model, data = inputs
    done = subprocess.run(trl("sft", model, data, tmp_path / "q", "--load_in_4bit"), capture_output=True, text=True, timeout=300)
    assert done.returncode != 0 and "QLoRA (load_in_4bit) needs CUDA (a GPU)" in done.stderr
    assert not (tmp_path / "q").exists()


def test_the_component_fetches_uri_sources_itself_and_trains_under_kfp_local(tmp_path, monkeypatch):
    import tempfile

    from kfp import dsl, local

    from kfp_trainer.components import trl_finetune

    monkeypatch.setenv("KFP_TRAINER_BACKEND", "local")
    monkeypatch.setenv("KFP_TRAINER_LOCAL_ROOT", str(tmp_path / "trainjobs"))
    root = tmp_path / "pipeline-root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root),
               workspace_root=tempfile.mkdtemp(prefix="ws-", dir=tmp_path))  # fmt: skip

    @dsl.pipeline(name="trl-uris")
    def trl_uris():
        trl_finetune(method="dpo", model_uri="builtin://models/tiny-char-lm", dataset_uri="builtin://datasets/addition-preference",
                     max_steps=3, per_device_train_batch_size=8, beta=0.2, num_proc_per_node="1")  # fmt: skip

    trl_uris()
    [out] = root.glob("*/trl-finetune/output_model")
    info = json.loads((out / "training_info.json").read_text())
    assert (info["method"], info["steps"], info["weights"], info["hyperparameters"]["beta"]) == ("dpo", 3, "full", 0.2)
    meta = json.loads((out.parent / "executor_output.json").read_text())["artifacts"]["output_model"]["artifacts"][0]["metadata"]
    assert meta["base_model"] == "builtin://models/tiny-char-lm" and meta["runtime"] == "ClusterTrainingRuntime/kfp-trainer-trl"
    assert (out.parent / "output_model.trl-model" / "config.json").is_file()  # fetched next to the artifact, then used
