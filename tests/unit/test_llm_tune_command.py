"""The tune command the Trainer controller completes, and the local command built from it."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from kfp_trainer.llm import cpu_compat, local_tune, tiny_models, tune_command

RUNTIMES = (
    Path(os.environ.get("KFP_TRAINER_CRDS_DIR", Path(__file__).resolve().parents[3] / "shared" / "kubeflow-trainer-v2.3.0")) / "runtimes"
)


def runtime(file: str) -> dict:
    return yaml.safe_load((RUNTIMES / file).read_text())


QWEN_CMD = runtime("qwen2_5_1.5B.yaml")["spec"]["template"]["spec"]["replicatedJobs"][2]["template"]["spec"]["template"]["spec"][
    "containers"
][0]["command"]


def test_the_controller_completes_tune_run_with_rendezvous_recipe_config_and_the_runtimes_paths():
    argv = tune_command.effective_argv(
        runtime_name="torchtune-qwen2.5-1.5b",
        runtime_command=QWEN_CMD,
        job_command=["tune", "run"],
        job_args=["epochs=2", "model.lora_attn_modules=[q_proj]"],
        job_name="ft",
        num_nodes=1,
        num_proc_per_node="auto",
        gpus_per_node=2,
    )
    assert argv == [
        "tune",
        "run",
        "--rdzv_endpoint=ft-node-0-0.ft:29500",
        "lora_finetune_distributed",
        "--config",
        "qwen2_5/1.5B_lora",
        "output_dir=/workspace/output",
        "tokenizer.path=/workspace/model/vocab.json",
        "tokenizer.merges_file=/workspace/model/merges.txt",
        "checkpointer.checkpoint_dir=/workspace/model",
        "epochs=2",
        "model.lora_attn_modules=[q_proj]",
    ]


def test_the_runtimes_dataset_overrides_do_not_survive_into_a_builtin_trainer_job():
    # Only output_dir, tokenizer.* and checkpointer.checkpoint_dir are carried over by the controller.
    kept = tune_command.runtime_immutable_overrides(QWEN_CMD)
    assert not any(a.startswith("dataset") for a in kept)


def test_a_single_process_job_gets_no_rendezvous_and_a_single_device_recipe():
    argv = tune_command.effective_argv(
        runtime_name="torchtune-llama3.2-1b",
        runtime_command=[],
        job_command=["tune", "run"],
        job_args=[],
        job_name="j",
        num_nodes=1,
        num_proc_per_node=1,
        gpus_per_node=0,
    )
    assert argv == ["tune", "run", "full_finetune_single_device", "--config", "llama3_2/1B_full_single_device"]


def test_a_job_with_its_own_command_runs_that_command_and_its_args():
    argv = tune_command.effective_argv(
        runtime_name="torchtune-qwen2.5-1.5b",
        runtime_command=QWEN_CMD,
        job_command=["python", "x.py"],
        job_args=["--a"],
        job_name="j",
        num_nodes=1,
        num_proc_per_node="auto",
        gpus_per_node=2,
    )
    assert argv == ["python", "x.py", "--a"]


def test_node_shape_prefers_the_jobs_settings_and_counts_cpus_without_gpus():
    gpu_rt = {"limits": {"nvidia.com/gpu": 2}}
    assert tune_command.node_shape(runtime_resources=gpu_rt, runtime_num_nodes=1, job_trainer=None) == (1, "auto", 2)
    assert tune_command.node_shape(runtime_resources=gpu_rt, runtime_num_nodes=1, job_trainer={"numNodes": 2, "numProcPerNode": 3}) == (
        2,
        3,
        2,
    )
    assert tune_command.node_shape(runtime_resources={}, runtime_num_nodes=1, job_trainer={}) == (1, 1, 0)


def test_webhook_refuses_immutable_overrides_in_args():
    errors = tune_command.webhook_errors(
        "torchtune-qwen2.5-1.5b", ["output_dir=/tmp/x"], num_nodes=1, num_proc_per_node="auto", gpus_per_node=2
    )
    assert errors == [("args", "output_dir=/tmp/x", "no override of output_dir (the runtime sets it)")]


def test_an_unknown_model_runtime_is_refused():
    errors = tune_command.webhook_errors("torchtune-mistral-7b", [], num_nodes=1, num_proc_per_node="auto", gpus_per_node=1)
    assert errors[0][0:2] == ("runtime", "torchtune-mistral-7b")


# --- local command -------------------------------------------------------------------------------


def test_the_runtimes_own_command_runs_locally_on_cpu_ranks_with_paths_in_the_workspace(tmp_path):
    cmd = local_tune.local_tune_command(runtime("qwen2_5_1.5B.yaml"), None, str(tmp_path), master_port=23456, tune_executable=["tune"])
    assert cmd.argv[:6] == ["tune", "run", "--rdzv_endpoint=127.0.0.1:23456", "full_finetune_distributed", "--config", "qwen2_5/1.5B_full"]
    assert f"dataset.data_dir={tmp_path}/dataset/data" in cmd.argv
    assert f"checkpointer.checkpoint_dir={tmp_path}/model" in cmd.argv
    assert cmd.argv[-4:] == list(local_tune.CPU_OVERRIDES)
    assert not any("/workspace" in a for a in cmd.argv)
    assert (cmd.recipe, cmd.config, cmd.processes) == ("full_finetune_distributed", "qwen2_5/1.5B_full", 2)
    assert cmd.env["PET_NPROC_PER_NODE"] == "2" and cmd.env["PET_NNODES"] == "1" and cmd.env["PET_NODE_RANK"] == "0"
    assert cmd.env[cpu_compat.ENV_FLAG] == "1"
    assert cmd.env["PYTHONPATH"].split(os.pathsep)[0] == cpu_compat.SITE_DIR
    assert cmd.env["HF_HUB_OFFLINE"] == "1" and cmd.env["HF_HOME"].startswith(str(tmp_path))
    assert cmd.cwd == str(tmp_path)


def test_local_mode_replaces_gpu_settings_and_says_which(tmp_path):
    job = {"command": ["tune", "run"], "args": ["dtype=bf16", "epochs=1", "compile=True"]}
    cmd = local_tune.local_tune_command(runtime("llama3_2_1B.yaml"), job, str(tmp_path), extra_overrides=["epochs=2"])
    assert cmd.replaced == ["dtype=bf16", "epochs=1", "compile=True"]
    assert cmd.argv.count("dtype=fp32") == 1 and "dtype=bf16" not in cmd.argv
    assert cmd.argv[-1] == "epochs=2"


def test_the_trainjobs_env_is_passed_on_under_the_local_settings(tmp_path):
    job = {"command": ["tune", "run"], "env": [{"name": "WANDB_MODE", "value": "offline"}, {"name": "PYTHONPATH", "value": "/opt/lib"},
                                              {"name": "HF_TOKEN", "valueFrom": {"secretKeyRef": {"name": "s", "key": "k"}}}]}  # fmt: skip
    cmd = local_tune.local_tune_command(runtime("qwen2_5_1.5B.yaml"), job, str(tmp_path), python_path="/x")
    assert cmd.env["WANDB_MODE"] == "offline" and "HF_TOKEN" not in cmd.env
    assert cmd.env["PYTHONPATH"].split(os.pathsep) == [cpu_compat.SITE_DIR, "/opt/lib", "/x"]


def test_a_single_device_job_runs_one_local_process(tmp_path):
    job = {
        "command": ["tune", "run"],
        "args": ["model.quantize_base=True", "model.lora_attn_modules=[q_proj]"],
        "resourcesPerNode": {"limits": {"nvidia.com/gpu": 1}},
    }
    cmd = local_tune.local_tune_command(runtime("llama3_2_1B.yaml"), job, str(tmp_path))
    assert (cmd.recipe, cmd.config, cmd.processes) == ("lora_finetune_single_device", "llama3_2/1B_qlora_single_device", 1)
    assert not any(a.startswith("--rdzv_endpoint") for a in cmd.argv)


def test_a_non_tune_command_is_refused(tmp_path):
    with pytest.raises(ValueError, match="not a 'tune run' command"):
        local_tune.local_tune_command(runtime("qwen2_5_1.5B.yaml"), {"command": ["python", "x.py"]}, str(tmp_path))


def test_torchtune_progress_lines_give_one_loss_per_step():
    out = "1|1|Loss: 11.92:  3%|x| 1/32 [00:02]\r1|1|Loss: 11.92:  6%\r1|2|Loss: 11.90: 9%\n2|3|Loss: 1.5e-3"
    assert local_tune.tune_losses(out) == {(1, 1): 11.92, (1, 2): 11.90, (2, 3): 0.0015}


# --- tiny models and the CPU layer (no torch needed) ---------------------------------------------------


def test_tiny_model_overrides_keep_the_real_vocabulary_and_switch_to_the_lora_builder():
    arch = tiny_models.architecture_for_config("llama3_2/3B_lora")
    full = tiny_models.tiny_model_overrides(arch, lora=False)
    lora = tiny_models.tiny_model_overrides(arch, lora=True)
    assert "model.vocab_size=128256" in full and "model.num_layers=2" in full and "model.embed_dim=64" in full
    assert full[0] == "model._component_=torchtune.models.llama3_2.llama3_2"
    assert lora[0] == "model._component_=torchtune.models.llama3_2.lora_llama3_2"
    assert arch.checkpoint_files == ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors")
    assert tiny_models.architecture_for_config("qwen2_5/1.5B_full").vocab_size == 151936


def test_overrides_come_from_the_marker_next_to_a_tiny_model_and_not_for_a_real_one(tmp_path):
    assert tiny_models.overrides_for(tmp_path, "qwen2_5/1.5B_full") == []
    (tmp_path / tiny_models.MARKER_FILE).write_text(json.dumps({"model_key": "qwen2_5/1.5B", "dims": tiny_models.QLORA_DIMS}))
    assert "model.embed_dim=128" in tiny_models.overrides_for(tmp_path, "qwen2_5/1.5B_lora")
    assert tiny_models.overrides_for(tmp_path, "qwen2_5/1.5B_lora")[0] == "model._component_=torchtune.models.qwen2.lora_qwen2"


def test_an_unknown_config_has_no_tiny_model():
    with pytest.raises(ValueError, match="no tiny model"):
        tiny_models.architecture_for_config("mistral/7B_full")


@pytest.mark.parametrize(
    "backend, cpu",
    [("cuda:nccl,cpu:gloo", "cpu:gloo"), ("nccl", "gloo"), ("gloo", "gloo"), ("cuda:nccl", "gloo"), ("cpu:gloo,cuda:nccl", "cpu:gloo")],
)
def test_nccl_backends_fall_back_to_gloo_on_cpu(backend, cpu):
    assert cpu_compat.cpu_backend(backend) == cpu


def test_the_cpu_layer_does_nothing_unless_switched_on(monkeypatch):
    monkeypatch.delenv(cpu_compat.ENV_FLAG, raising=False)
    assert cpu_compat.apply_from_env() == []
