"""The Trainer v2.3 torchtune runtimes' own ``tune run`` commands, trained for real on CPU ranks.

Each test lays out a workspace as the runtime's initializers would (a tiny model of the runtime's
architecture in ``model/``, a parquet instruct dataset in ``dataset/data``), builds the local
command with :func:`kfp_trainer.llm.local_tune.local_tune_command` and runs it: torchrun with
two gloo ranks from the ``PET_*`` environment. The only overrides are the tiny model's, the four
CPU ones, and (resume tests) a fixed ``seed`` and ``epochs`` so two runs can be compared.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torchtune  # noqa: F401  (the [llm] extra, installed by make setup)
import yaml

from kfp_trainer.backends.procs import free_port
from kfp_trainer.llm import checkpoints, inputs, local_tune, render, tiny_models  # noqa: E402

pytestmark = pytest.mark.slow

RUNTIMES = (
    Path(os.environ.get("KFP_TRAINER_CRDS_DIR", Path(__file__).resolve().parents[3] / "shared" / "kubeflow-trainer-v2.3.0")) / "runtimes"
)
QWEN, LLAMA1B, LLAMA3B = "qwen2_5_1.5B.yaml", "llama3_2_1B.yaml", "llama3_2_3B.yaml"


def runtime(file: str) -> dict:
    return yaml.safe_load((RUNTIMES / file).read_text())


_built: dict[tuple, Path] = {}


def workspace(tmp_path: Path, config: str, rows: int, qlora: bool = False) -> Path:
    """A fresh workspace; the model and dataset are built once per session and copied."""
    key = (config.split("_")[0] + config.split("/")[1].split("_")[0], rows, qlora)
    if key not in _built:
        src = Path(os.environ.get("PYTEST_TMP_TORCHTUNE", tmp_path.parent)) / f"tiny-{'-'.join(map(str, key)).replace('/', '_')}"
        shutil.rmtree(src, ignore_errors=True)
        tiny_models.write_workspace(src, config, rows=rows, qlora=qlora)
        _built[key] = src
    ws = tmp_path / "workspace"
    shutil.copytree(_built[key] / "model", ws / "model")
    shutil.copytree(_built[key] / "dataset", ws / "dataset")
    return ws


class Run:
    def __init__(self, cmd: local_tune.LocalTuneCommand, returncode: int, output: str, seconds: float, killed: bool):
        self.cmd, self.returncode, self.output, self.seconds, self.killed = cmd, returncode, output, seconds, killed
        self.losses = local_tune.tune_losses(output)

    def tail(self) -> str:
        return self.output[-3000:]


def kill_node(pid: int) -> None:
    """SIGKILL a local node: the launcher and every trainer process under it.

    torchrun starts each rank in a session of its own, so killing the launcher's process group
    would leave the ranks training; a lost node takes all of them.
    """
    import psutil

    try:
        root = psutil.Process(pid)
        procs = [root, *root.children(recursive=True)]
    except psutil.NoSuchProcess:
        return
    for p in procs:
        try:
            p.kill()
        except psutil.NoSuchProcess:
            pass


def run_tune(rt: dict, ws: Path, job: dict | None = None, extra: list[str] = (), kill_when=None, timeout: float = 300) -> Run:
    probe = local_tune.local_tune_command(rt, job, str(ws))
    overrides = tiny_models.overrides_for(ws / "model", probe.config) + list(extra)
    cmd = local_tune.local_tune_command(rt, job, str(ws), master_port=free_port(), extra_overrides=overrides)
    start = time.monotonic()
    proc = subprocess.Popen(
        cmd.argv, cwd=cmd.cwd, env={**os.environ, **cmd.env}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    chunks, killed = [], False
    try:
        while True:
            data = os.read(proc.stdout.fileno(), 65536)
            if not data:
                break
            chunks.append(data.decode(errors="replace"))
            if kill_when is not None and not killed and kill_when(local_tune.tune_losses("".join(chunks))):
                kill_node(proc.pid)
                killed = True
            if time.monotonic() - start > timeout:
                kill_node(proc.pid)
                pytest.fail(f"tune run did not finish in {timeout} s:\n{''.join(chunks)[-3000:]}")
        proc.wait()
    finally:
        if proc.poll() is None:
            kill_node(proc.pid)
            proc.wait()
    return Run(cmd, proc.returncode, "".join(chunks), time.monotonic() - start, killed)


def first_and_last(losses: dict) -> tuple[float, float]:
    steps = sorted(losses)
    return losses[steps[0]], losses[steps[-1]]


def test_qwen_runtimes_own_command_trains_two_cpu_ranks_and_the_loss_falls(tmp_path):
    ws = workspace(tmp_path, "qwen2_5/1.5B_full", rows=32)
    run = run_tune(runtime(QWEN), ws)
    assert run.returncode == 0, run.tail()
    assert (run.cmd.recipe, run.cmd.config, run.cmd.processes) == ("full_finetune_distributed", "qwen2_5/1.5B_full", 2)
    assert "--rdzv_endpoint=127.0.0.1:" in " ".join(run.cmd.argv) and "dataset.source=parquet" in run.cmd.argv
    assert len(run.losses) == 8  # 32 rows / (2 ranks x batch 2)
    first, last = first_and_last(run.losses)
    assert last < first, run.losses
    assert (ws / "output" / "epoch_0" / "model-00001-of-00001.safetensors").is_file()
    assert "[kfp-trainer cpu-compat]" in run.output
    print(f"qwen full: {run.seconds:.1f} s, loss {first:.4f} -> {last:.4f}")


def test_llama_runtimes_own_command_trains_and_the_loss_falls(tmp_path):
    # llama3_2/1B_full accumulates 8 batches of 4 per step: 128 rows give 2 optimizer steps.
    ws = workspace(tmp_path, "llama3_2/1B_full", rows=128)
    run = run_tune(runtime(LLAMA1B), ws)
    assert run.returncode == 0, run.tail()
    assert run.cmd.config == "llama3_2/1B_full" and len(run.losses) == 2
    first, last = first_and_last(run.losses)
    assert last < first, run.losses
    print(f"llama 1B full: {run.seconds:.1f} s, loss {first:.4f} -> {last:.4f}")


def test_llama_3b_runtime_trains_from_a_sharded_checkpoint_and_saves_matching_shards(tmp_path):
    # The 3B configs name two safetensors shards; the tiny model is written as two, the way the Hub ships it.
    ws = workspace(tmp_path, "llama3_2/3B_full", rows=64)
    run = run_tune(runtime(LLAMA3B), ws)
    assert run.returncode == 0, run.tail()
    assert run.cmd.config == "llama3_2/3B_full" and len(run.losses) == 1
    plan = checkpoints.resume_plan(checkpoints.scan(ws / "output"), adapter=False)
    [final] = checkpoints.complete_epochs(checkpoints.scan(ws / "output"), adapter=False)
    assert final.model_files == ("epoch_0/model-00001-of-00002.safetensors", "epoch_0/model-00002-of-00002.safetensors")
    assert plan.epochs_done == 0  # one epoch only: no recipe state, so nothing to resume from
    print(f"llama 3B full: {run.seconds:.1f} s, losses {run.losses}")


def _lora_job(rt: dict, **settings) -> dict:
    """The TrainJob our renderer makes for a LoRA fine-tune of a parquet instruct dataset."""
    s = inputs.parse(
        inputs.TorchTuneSettings,
        peft_config={"lora_rank": 8, "lora_alpha": 16},
        dataset_preprocess_config={"source": "parquet"},
        **settings,
    )
    return render.render_builtin(rt, s, dataset=inputs.StorageSource(storage_uri="hf://example/tiny-sums/data")).sdk_spec()["trainer"]


def test_a_lora_trainjob_runs_the_lora_recipe_and_trains_the_adapter(tmp_path):
    import torch

    rt = runtime(QWEN)
    ws = workspace(tmp_path, "qwen2_5/1.5B_lora", rows=64)
    run = run_tune(rt, ws, _lora_job(rt))
    assert run.returncode == 0, run.tail()
    assert (run.cmd.recipe, run.cmd.config) == ("lora_finetune_distributed", "qwen2_5/1.5B_lora")
    adapter = torch.load(ws / "output" / "epoch_0" / "adapter_model.pt", map_location="cpu", weights_only=True)
    lora_b = [t for k, t in adapter.items() if "lora_b" in k]
    assert lora_b and any(t.abs().sum() > 0 for t in lora_b)  # lora_b starts at zero: non-zero means it learned
    assert (ws / "output" / "epoch_0" / "adapter_config.json").is_file()
    print(f"qwen lora: {run.seconds:.1f} s, losses {run.losses}")


def test_a_qlora_trainjob_on_one_gpu_runs_the_single_device_qlora_recipe_on_cpu(tmp_path):
    rt = runtime(LLAMA1B)
    ws = workspace(tmp_path, "llama3_2/1B_qlora_single_device", rows=64, qlora=True)
    s = inputs.parse(
        inputs.TorchTuneSettings,
        peft_config={"quantize_base": True},
        resources_per_node={"gpu": 1},
        dataset_preprocess_config={"source": "parquet"},
    )
    job = render.render_builtin(rt, s, dataset=inputs.StorageSource(storage_uri="hf://example/tiny-sums/data")).sdk_spec()["trainer"]
    run = run_tune(rt, ws, job)
    assert run.returncode == 0, run.tail()
    assert (run.cmd.recipe, run.cmd.config, run.cmd.processes) == ("lora_finetune_single_device", "llama3_2/1B_qlora_single_device", 1)
    assert len(run.losses) == 2 and (ws / "output" / "epoch_0" / "adapter_model.pt").is_file()
    print(f"llama qlora: {run.seconds:.1f} s, losses {run.losses}")


def test_a_full_fine_tune_killed_mid_epoch_resumes_from_the_last_epoch_with_identical_losses(tmp_path):
    # 2 epochs of 4 steps (16 rows / 2 ranks / batch 2). The node is SIGKILLed once epoch 2's second
    # step is logged; the rerun resumes from epoch_0, repeats those steps exactly, and finishes.
    ws = workspace(tmp_path, "qwen2_5/1.5B_full", rows=16)
    fixed = ["seed=7", "epochs=2"]
    first = run_tune(runtime(QWEN), ws, extra=fixed, kill_when=lambda losses: (2, 6) in losses)
    assert first.killed, first.tail()
    plan = checkpoints.resume_plan(checkpoints.scan(ws / "output"), total_epochs=2, adapter=False)
    assert plan.epochs_done == 1 and plan.checkpoint.folder == "epoch_0", plan
    resumed = run_tune(runtime(QWEN), ws, extra=fixed + plan.overrides)
    assert resumed.returncode == 0, resumed.tail()
    assert min(resumed.losses) == (2, 5), f"the rerun did not start at epoch 2: {sorted(resumed.losses)}"
    assert [resumed.losses[s] for s in ((2, 5), (2, 6))] == [first.losses[s] for s in ((2, 5), (2, 6))]
    assert sorted(resumed.losses) == [(2, step) for step in range(5, 9)]
    assert (ws / "output" / "epoch_1" / "model-00001-of-00001.safetensors").is_file()
    print(f"full resume: killed run {first.seconds:.1f} s, resumed run {resumed.seconds:.1f} s")


def test_a_lora_fine_tune_killed_mid_epoch_resumes_from_its_adapter_with_identical_losses(tmp_path):
    # 32 rows / 2 ranks / batch 2, 4 batches accumulated per step (the config says 8): 2 steps per epoch.
    rt = runtime(QWEN)
    ws = workspace(tmp_path, "qwen2_5/1.5B_lora", rows=32)
    job = _lora_job(rt, epochs=2)
    fixed = ["seed=7", "gradient_accumulation_steps=4"]
    first = run_tune(rt, ws, job, extra=fixed, kill_when=lambda losses: (2, 3) in losses)
    assert first.killed, first.tail()
    plan = checkpoints.resume_plan(checkpoints.scan(ws / "output"), total_epochs=2, adapter=True)
    assert plan.epochs_done == 1 and plan.overrides[1] == "checkpointer.adapter_checkpoint=epoch_0/adapter_model.pt", plan
    resumed = run_tune(rt, ws, job, extra=[*fixed, *plan.overrides])
    assert resumed.returncode == 0, resumed.tail()
    assert min(resumed.losses) == (2, 3) and resumed.losses[(2, 3)] == first.losses[(2, 3)], (first.losses, resumed.losses)
    assert (ws / "output" / "epoch_1" / "adapter_model.pt").is_file()
    print(f"lora resume: killed run {first.seconds:.1f} s, resumed run {resumed.seconds:.1f} s")


def test_a_cancelled_local_torchtune_job_leaves_no_rank_running(tmp_path):
    """SIGTERM to ``kfp-trainer launch --local`` mid-epoch: exit 130, and every process of the node is gone.

    torchrun starts each rank in a session of its own: stopping the node's process group would
    leave the ranks training.
    """
    from kfp_trainer.backends.procs import descendants, pid_alive

    root = tmp_path / "jobs"
    cli = str(Path(sys.executable).with_name("kfp-trainer"))
    args = [cli, "launch", "--local", "--runtime", "torchtune-qwen2.5-1.5b", "--run-id", "cancel", "--task-name", "tune",
            "--command", "tune,run", "--args", "epochs=3,dataset=torchtune.datasets.instruct_dataset,dataset.source=parquet,"
            "dataset.data_dir=/workspace/dataset/data", "--dataset-uri", "builtin://datasets/instruct-sums",
            "--model-uri", "builtin://models/tiny-qwen2.5"]  # fmt: skip
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KFP_TRAINER_")}, "KFP_TRAINER_LOCAL_ROOT": str(root)}
    launcher = subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    seen: set[int] = set()
    try:
        deadline = time.monotonic() + 300
        while time.monotonic() < deadline and launcher.poll() is None:
            logs = list(root.glob("local/*/logs/node-0.log"))
            if logs and "Loss:" in logs[0].read_text(errors="replace"):
                status = json.loads((logs[0].parent.parent / "trainjob.json").read_text())["status"]
                for pid, _ in status["processes"]:
                    seen.update([pid, *descendants(pid)])
                break
            time.sleep(0.2)
        assert len(seen) >= 3, f"no training node with ranks seen: {seen}"  # tune launcher + 2 ranks
        launcher.send_signal(signal.SIGTERM)
        out, _ = launcher.communicate(timeout=120)
    finally:
        if launcher.poll() is None:
            launcher.kill()
    assert launcher.returncode == 130, out.decode(errors="replace")[-3000:]
    assert [pid for pid in seen if pid_alive(pid)] == []
    assert list(root.glob("local/*")) == []  # the job is deleted
