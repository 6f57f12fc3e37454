"""BuiltinTrainer / CustomTrainer rendering: the SDK's spelling, the runtime checks, the Trainer webhook's rules."""

from __future__ import annotations

import copy
import os
from pathlib import Path

import pytest
import yaml

from kfp_trainer import custom_trainer
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.llm import render
from kfp_trainer.llm.inputs import FunctionTrainerSettings, StorageSource, TorchTuneSettings, parse
from kfp_trainer.llm.runtimes import RuntimeTrainer

RUNTIMES = (
    Path(os.environ.get("KFP_TRAINER_CRDS_DIR", Path(__file__).resolve().parents[3] / "shared" / "kubeflow-trainer-v2.3.0")) / "runtimes"
)


def runtime(file: str) -> dict:
    return yaml.safe_load((RUNTIMES / file).read_text())


def renamed(file: str, name: str) -> dict:
    rt = copy.deepcopy(runtime(file))
    rt["metadata"]["name"] = name
    return rt


QWEN, LLAMA1B, TORCH = "qwen2_5_1.5B.yaml", "llama3_2_1B.yaml", "torch_distributed.yaml"


def settings(**kw) -> TorchTuneSettings:
    return parse(TorchTuneSettings, **kw)


def messages(excinfo) -> str:
    return str(excinfo.value)


def test_every_torchtune_setting_becomes_the_sdks_override_in_the_sdks_order():
    s = settings(
        dtype="bf16",
        batch_size=8,
        epochs=3,
        loss="CEWithChunkedOutputLoss",
        peft_config={"apply_lora_to_mlp": True, "apply_lora_to_output": False, "lora_rank": 16, "lora_alpha": 32, "lora_dropout": 0.1},
        dataset_preprocess_config={
            "source": "csv",
            "split": "train[:10%]",
            "train_on_input": False,
            "new_system_prompt": "Be brief.",
            "column_map": {"input": "q", "output": "a"},
        },
    )
    out = render.render_builtin(runtime(LLAMA1B), s, dataset=StorageSource(storage_uri="hf://org/ds/data"))
    assert out.sdk_spec()["trainer"] == {
        "command": ["tune", "run"],
        "args": [
            "dtype=bf16",
            "batch_size=8",
            "epochs=3",
            "loss=torchtune.modules.loss.CEWithChunkedOutputLoss",
            "dataset.data_dir=/workspace/dataset/data",
            "model.apply_lora_to_mlp=True",
            "model.apply_lora_to_output=False",
            "model.lora_rank=16",
            "model.lora_alpha=32",
            "model.lora_dropout=0.1",
            "model.lora_attn_modules=[q_proj,v_proj,output_proj]",
            "dataset=torchtune.datasets.instruct_dataset",
            "dataset.source=csv",
            "dataset.split=train[:10%]",
            "dataset.train_on_input=False",
            "dataset.new_system_prompt=Be brief.",
            "dataset.column_map={'input': 'q', 'output': 'a'}",
        ],
    }
    assert (out.inputs["runtime"], out.inputs["runtime_kind"]) == ("torchtune-llama3.2-1b", "ClusterTrainingRuntime")
    assert (out.recipe, out.config, out.adapter) == ("lora_finetune_distributed", "llama3_2/1B_lora", True)


@pytest.mark.parametrize(
    "uri, arg",
    [
        ("hf://tatsu-lab/alpaca", "dataset.data_dir=/workspace/dataset/."),
        ("hf://tatsu-lab/alpaca/data", "dataset.data_dir=/workspace/dataset/data"),
        ("hf://org/name/data/train.parquet", "dataset.data_files=/workspace/dataset/data/train.parquet"),
    ],
)
def test_a_hugging_face_dataset_points_torchtune_at_its_files_under_workspace(uri, arg):
    assert render.torchtune_args(settings(), StorageSource(storage_uri=uri)) == [arg]


def test_an_s3_dataset_adds_no_path_override():
    assert render.torchtune_args(settings(epochs=1), StorageSource(storage_uri="s3://b/p")) == ["epochs=1"]


def test_defaults_only_still_render_the_tune_entrypoint_with_empty_args():
    out = render.render_builtin(runtime(QWEN), settings())
    assert out.sdk_spec() == {
        "runtimeRef": {"apiGroup": "trainer.kubeflow.org", "name": "torchtune-qwen2.5-1.5b", "kind": "ClusterTrainingRuntime"},
        "trainer": {"command": ["tune", "run"], "args": []},
    }
    assert (out.recipe, out.config, out.adapter) == ("full_finetune_distributed", "qwen2_5/1.5B_full", False)


def test_a_builtin_trainer_on_a_torch_runtime_is_refused_naming_the_runtime_and_its_framework():
    with pytest.raises(InvalidSpecErrors) as e:
        render.render_builtin(runtime(TORCH), settings())
    assert "runtime: got 'torch-distributed'; expected a torchtune runtime" in messages(e)
    assert "is a torch runtime" in messages(e)


def test_a_runtime_without_a_framework_label_is_refused():
    rt = runtime(QWEN)
    del rt["metadata"]["labels"]
    with pytest.raises(InvalidSpecErrors, match="trainer.kubeflow.org/framework"):
        render.render_builtin(rt, settings())


def test_multi_node_fine_tunes_are_refused_except_for_llama_3_3_70b():
    with pytest.raises(InvalidSpecErrors, match=r"num_nodes: got 2; expected 1 for qwen2_5/1.5B"):
        render.render_builtin(runtime(QWEN), settings(num_nodes=2))
    out = render.render_builtin(renamed(LLAMA1B, "torchtune-llama3.3-70b"), settings(num_nodes=2))
    assert out.sdk_spec()["trainer"]["numNodes"] == 2
    assert (out.recipe, out.config) == ("full_finetune_distributed", "llama3_3/70B_full_multinode")


def test_lora_across_nodes_is_refused():
    with pytest.raises(InvalidSpecErrors, match="LoRA fine-tuning is single-node"):
        render.render_builtin(renamed(LLAMA1B, "torchtune-llama3.3-70b"), settings(num_nodes=2, peft_config={"lora_rank": 8}))


def test_qlora_is_refused_for_qwen_and_needs_one_gpu_per_node_for_llama():
    with pytest.raises(InvalidSpecErrors, match="QLoRA is not supported for qwen2_5/1.5B"):
        render.render_builtin(runtime(QWEN), settings(peft_config={"quantize_base": True}))
    with pytest.raises(InvalidSpecErrors, match="exactly 1 GPU per node for QLoRA on llama3_2/1B"):
        render.render_builtin(runtime(LLAMA1B), settings(peft_config={"quantize_base": True}))
    out = render.render_builtin(runtime(LLAMA1B), settings(peft_config={"quantize_base": True}, resources_per_node={"gpu": 1}))
    assert (out.recipe, out.config, out.adapter) == ("lora_finetune_single_device", "llama3_2/1B_qlora_single_device", True)


def test_dora_turns_a_quantized_base_into_plain_lora_as_the_controller_does():
    out = render.render_builtin(runtime(LLAMA1B), settings(peft_config={"quantize_base": True, "use_dora": True}))
    assert (out.recipe, out.config) == ("lora_finetune_distributed", "llama3_2/1B_lora")


def test_cpu_only_resources_pick_the_recipe_for_that_many_processes():
    one = render.render_builtin(runtime(QWEN), settings(resources_per_node={"cpu": 1}))
    assert (one.recipe, one.config) == ("full_finetune_single_device", "qwen2_5/1.5B_full_single_device")
    four = render.render_builtin(runtime(QWEN), settings(resources_per_node={"cpu": "3500m"}))
    assert (four.recipe, four.config) == ("full_finetune_distributed", "qwen2_5/1.5B_full")


def test_resources_use_the_sdks_aliases_and_set_requests_equal_to_limits():
    assert render.resources_per_node({"CPU": 8, "Memory": "32Gi", "GPU": 2, "storage": "100Gi", "example.com/Fpga": 1}) == {
        "requests": {"cpu": 8, "memory": "32Gi", "nvidia.com/gpu": 2, "ephemeral-storage": "100Gi", "example.com/Fpga": 1},
        "limits": {"cpu": 8, "memory": "32Gi", "nvidia.com/gpu": 2, "ephemeral-storage": "100Gi", "example.com/Fpga": 1},
    }
    assert render.resources_per_node({"mig-1g.5gb": 1}) == {
        "requests": {"nvidia.com/mig-1g.5gb": 1},
        "limits": {"nvidia.com/mig-1g.5gb": 1},
    }


@pytest.mark.parametrize(
    "resources, problem",
    [({"gpu": 1, "mig-1g.5gb": 1}, "not both"), ({"mig-1g.5gb": 1, "mig-2g.10gb": 1}, "at most one MIG profile")],
)
def test_gpu_and_mig_conflicts_are_refused_before_anything_is_created(resources, problem):
    with pytest.raises(InvalidSpecErrors, match=problem):
        render.render_builtin(runtime(LLAMA1B), settings(resources_per_node=resources))


def test_initializers_carry_options_as_env_and_credentials_only_as_a_secret_reference():
    init = render.initializer_inputs(
        StorageSource(storage_uri="s3://bucket/data", endpoint="https://s3.local", region="eu", role_arn="arn:x", secret_ref="s3-creds"),
        StorageSource(storage_uri="hf://meta-llama/Llama-3.2-1B-Instruct", secret_ref="hf-token"),
    )
    assert init == {
        "dataset_uri": "s3://bucket/data",
        "dataset_env": [
            {"name": "ENDPOINT", "value": "https://s3.local"},
            {"name": "REGION", "value": "eu"},
            {"name": "ROLE_ARN", "value": "arn:x"},
        ],
        "dataset_secret": "s3-creds",
        "model_uri": "hf://meta-llama/Llama-3.2-1B-Instruct",
        "model_env": [{"name": "IGNORE_PATTERNS", "value": "*.msgpack,*.h5,*.bin,*.pt,*.pth"}],
        "model_secret": "hf-token",
    }
    spec = render.Rendered({"runtime": "torchtune-llama3.2-1b", **init}).sdk_spec()  # as the TrainJob carries them
    assert spec["initializer"]["dataset"]["secretRef"] == {"name": "s3-creds"}
    assert spec["initializer"]["model"]["env"] == init["model_env"]


def test_plain_credential_fields_do_not_exist():
    with pytest.raises(InvalidSpecErrors, match="access_token"):
        parse(StorageSource, storage_uri="hf://org/model", access_token="hf_secret")


def _train(lr=0.1):
    print("training", lr)


def test_a_function_runs_under_torchrun_with_its_arguments_written_as_python():
    s = FunctionTrainerSettings.from_function(_train, func_args={"lr": 0.5}, num_nodes=2, env={"A": "1"})
    out = custom_trainer.render_function(runtime(TORCH), s)
    cmd = out.sdk_spec()["trainer"]["command"]
    assert cmd[:2] == ["bash", "-c"]
    assert "def _train(lr=0.1):\n" in cmd[2]
    assert "\n_train(**{'lr': 0.5})\n" in cmd[2]
    assert cmd[2].endswith('torchrun "test_llm_render.py"')
    assert out.sdk_spec()["trainer"]["numNodes"] == 2
    assert out.sdk_spec()["trainer"]["env"] == [{"name": "A", "value": "1"}]


def test_packages_are_installed_first_with_each_name_shell_quoted():
    s = FunctionTrainerSettings.from_function(
        _train, packages_to_install=["torch>=2", "it's"], pip_index_urls=["https://a/simple", "https://b"]
    )
    script = custom_trainer.render_function(runtime(TORCH), s).sdk_spec()["trainer"]["command"][2]
    assert "PACKAGES=('torch>=2' 'it'\"'\"'s')" in script
    assert "PIP_OPTS=(--index-url https://a/simple --extra-index-url https://b)" in script
    assert script.index("PACKAGES=") < script.index("read -r -d '' SCRIPT")


def test_mpi_runtimes_run_the_function_from_the_mpi_users_home():
    s = FunctionTrainerSettings.from_function(_train, packages_to_install=["deepspeed"])
    cmd = custom_trainer.render_function(runtime("deepspeed_distributed.yaml"), s).sdk_spec()["trainer"]["command"]
    assert cmd[:5] == ["mpirun", "--hostfile", "/etc/mpi/hostfile", "bash", "-c"]
    assert 'LOG_FILE="/home/mpiuser/pip_install.log"' in cmd[5]
    assert cmd[5].endswith('python "/home/mpiuser/test_llm_render.py"')


def test_a_function_on_a_torchtune_runtime_is_refused():
    with pytest.raises(InvalidSpecErrors, match="torchtune runtimes take torchtune settings"):
        custom_trainer.render_function(runtime(QWEN), FunctionTrainerSettings.from_function(_train))


def test_a_function_source_that_would_end_the_here_document_is_refused():
    with pytest.raises(InvalidSpecErrors, match="line 'EOM'"):
        parse(FunctionTrainerSettings, func_source='def f():\n    x = """\nEOM\n"""\n', func_name="f", func_file="f.py")


def test_runtime_trainer_reads_command_resources_and_the_launcher_kind():
    rt = RuntimeTrainer.from_runtime(runtime(QWEN))
    assert rt.command[:3] == ("tune", "run", "--rdzv_endpoint=localhost:29500")
    assert rt.resources == {"limits": {"nvidia.com/gpu": 2}}
    assert RuntimeTrainer.from_runtime(runtime("mlx_distributed.yaml")).entrypoint == ("mpirun",)
    assert RuntimeTrainer.from_runtime(runtime("xgboost_distributed.yaml")).entrypoint == ("python",)
