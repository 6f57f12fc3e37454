"""The torchtune fine-tune step's decisions: its settings, its TrainJob inputs, the output mount, the resume."""

from __future__ import annotations

import os
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.llm import checkpoints, tune_output
from kfp_trainer.spec import TrainJobInputs
from kfp_trainer.steps.finetune import TorchTuneFinetune, dataset_path_arg, torchtune_settings
from kfp_trainer.steps.step_types import TrainerContext

SHARED = Path(os.environ.get("KFP_TRAINER_CRDS_DIR", Path(__file__).resolve().parents[3] / "shared" / "kubeflow-trainer-v2.3.0"))
WORKSPACE_MOUNT = {"name": "kfp-workspace", "mountPath": "/kfp-workspace"}


def runtime(file: str) -> dict:
    return yaml.safe_load((SHARED / "runtimes" / file).read_text())


def context(tmp_path: Path, rt: dict, *, local: bool = False, mounts: list | None = None) -> tuple:
    """What the step hands the trainer's configure: its context, the runtime as read, the inputs so far."""
    ctx = TrainerContext(
        local=local,
        shared_root=None if local else "/kfp-workspace",
        key="finetune-abc123",
        workspace_path="" if local else "/kfp-workspace",
        output_model=SimpleNamespace(path=str(tmp_path / "output_model")),
    )
    inputs = TrainJobInputs.parse(
        volume_mounts=mounts if mounts is not None else [WORKSPACE_MOUNT],
        volumes=[{"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "run-1-kfp-workspace"}}],
    )
    return ctx, SimpleNamespace(document=rt), inputs


# --------------------------------------------------------------------------- settings


def test_flat_component_inputs_become_the_sdks_torchtune_config():
    s = torchtune_settings(
        "qlora", epochs=2, lora_rank=8, lora_alpha=16.0, lora_target_modules=["q_proj"], dataset_source="json",
        column_map={"input": "q"}, dtype="",
    )  # fmt: skip
    assert s.dtype is None  # "" from a pipeline parameter means: the runtime's value
    assert (s.peft_config.lora_rank, s.peft_config.lora_alpha, s.peft_config.quantize_base) == (8, 16, True)
    assert isinstance(s.peft_config.lora_alpha, int)  # KFP's 16.0 is rendered as the SDK renders 16
    assert s.peft_config.lora_attn_modules == ["q_proj"] and s.dataset_preprocess_config.column_map == {"input": "q"}
    assert torchtune_settings("full", epochs=1).peft_config is None
    assert torchtune_settings("lora").peft_config.lora_attn_modules == ["q_proj", "v_proj", "output_proj"]


def test_bad_settings_are_named_by_the_components_inputs():
    with pytest.raises(InvalidSpecErrors) as e:
        torchtune_settings("lora", lora_dropout=1.5, lora_target_modules=["mlp"], dataset_source="yaml", dtype="fp16")
    text = str(e.value)
    for name in ("lora_dropout", "lora_target_modules.0", "dataset_source", "dtype"):
        assert f"- {name}:" in text, text
    with pytest.raises(InvalidSpecErrors, match="method: got 'adapter'; expected full or lora or qlora"):
        torchtune_settings("adapter")


def test_a_dataset_path_stays_inside_the_dataset_folder():
    assert dataset_path_arg("data") == "dataset.data_dir=/workspace/dataset/data"
    assert dataset_path_arg("/workspace/dataset/splits/train.jsonl") == "dataset.data_files=/workspace/dataset/splits/train.jsonl"
    for bad in ("../model", "/etc/passwd", "data,x=1"):
        with pytest.raises(Exception, match="dataset_path"):
            dataset_path_arg(bad)


# --------------------------------------------------------------------------- the TrainJob inputs


def test_the_trainjob_inputs_are_the_sdks_plus_a_workspace_folder_mounted_at_the_runtimes_output(tmp_path):
    settings = torchtune_settings("lora", epochs=2, batch_size=4, lora_rank=8, dataset_source="parquet")
    step = TorchTuneFinetune(
        settings, dataset_uri="hf://org/data/train", dataset_secret="hf-token", model_uri="hf://org/model", learning_rate=1e-4
    )
    mounts = [{"name": "kfp-workspace", "mountPath": "/kfp-workspace", "subPath": "runs/r1"}]
    ctx, rt, inputs = context(tmp_path, runtime("qwen2_5_1.5B.yaml"), mounts=mounts)
    out = step.configure(ctx, rt, inputs)
    assert (out["runtime"], out["runtime_kind"], out["command"]) == ("torchtune-qwen2.5-1.5b", "ClusterTrainingRuntime", ["tune", "run"])
    assert out["args"] == [
        "batch_size=4", "epochs=2", "dataset.data_dir=/workspace/dataset/train", "model.lora_rank=8",
        "model.lora_attn_modules=[q_proj,v_proj,output_proj]", "dataset=torchtune.datasets.instruct_dataset",
        "dataset.source=parquet", "optimizer.lr=0.0001",
    ]  # fmt: skip
    assert (out["dataset_uri"], out["dataset_secret"], out["dataset_env"]) == ("hf://org/data/train", "hf-token", [])
    assert out["model_env"] == [{"name": "IGNORE_PATTERNS", "value": "*.msgpack,*.h5,*.bin,*.pt,*.pth"}]
    # the folder on the workspace PVC (below the task's own subPath) is the trainer's /workspace/output
    assert out["volume_mounts"][-1] == {
        "name": "kfp-trainer-output", "mountPath": "/workspace/output", "subPath": "runs/r1/.kfp-trainer/finetune-abc123/output",
    }  # fmt: skip
    # the same claim as a second volume: the Trainer's patches key a container's mounts by volume name
    assert out["volumes"][-1] == {"persistentVolumeClaim": {"claimName": "run-1-kfp-workspace"}, "name": "kfp-trainer-output"}
    assert out["volumes"][0]["name"] == "kfp-workspace"
    assert str(step.output_dir) == "/kfp-workspace/.kfp-trainer/finetune-abc123/output"
    assert ctx.report["fine-tune"] == "tune run lora_finetune_distributed --config qwen2_5/1.5B_lora (LoRA adapter)"
    assert "resumed" not in ctx.report


def test_a_retry_that_finds_an_earlier_tries_epoch_resumes_after_it(tmp_path):
    out_dir = tmp_path / "output_model.torchtune-output"
    (out_dir / "epoch_0").mkdir(parents=True)
    for name in ("model-00001-of-00001.safetensors", "model.safetensors.index.json", "config.json"):
        (out_dir / "epoch_0" / name).write_text("x")
    (out_dir / "recipe_state").mkdir()
    (out_dir / checkpoints.RECIPE_STATE).write_bytes(b"PK\x05\x06" + b"\0" * 18)  # an empty, whole zip archive
    step = TorchTuneFinetune(torchtune_settings("full", epochs=3), dataset_uri="builtin://datasets/instruct-sums")
    ctx, rt, inputs = context(tmp_path, runtime("qwen2_5_1.5B.yaml"), local=True)
    out = step.configure(ctx, rt, inputs)
    assert out["resume_args"] == [
        "resume_from_checkpoint=True",
        "checkpointer.checkpoint_files=[epoch_0/model-00001-of-00001.safetensors]",
        "checkpointer.recipe_checkpoint=recipe_state/recipe_state.pt",
    ]
    assert ctx.report["resumed"].startswith("from epoch_0 of an earlier try (1 of 3 epochs done)")
    assert ctx.metadata["resumed_from"] == "epoch_0"
    # locally the folder is a hostPath link into the job's workspace; builtin:// goes to the local initializer
    assert out["volumes"][-1] == {"name": "kfp-trainer-output", "hostPath": {"path": str(out_dir)}}
    assert out["volume_mounts"][-1] == {"name": "kfp-trainer-output", "mountPath": "/workspace/output"}
    assert out["dataset_uri"] == "builtin://datasets/instruct-sums" and "dataset_env" not in out


def test_a_runtime_that_is_not_torchtune_is_refused_with_what_it_is(tmp_path):
    step = TorchTuneFinetune(torchtune_settings("full"))
    with pytest.raises(InvalidSpecErrors, match=r"runtime: got 'torch-distributed'; expected a torchtune runtime .* torch runtime"):
        step.configure(*context(tmp_path, runtime("torch_distributed.yaml")))


def test_overrides_the_runtime_owns_or_the_inputs_set_are_refused(tmp_path):
    step = TorchTuneFinetune(torchtune_settings("full", epochs=1), overrides=["output_dir=/tmp/x", "epochs=3", "not an override"])
    with pytest.raises(InvalidSpecErrors) as e:
        step.configure(*context(tmp_path, runtime("llama3_2_1B.yaml")))
    assert [err.field for err in e.value.errors] == ["overrides[0]", "overrides[1]", "overrides[2]"]


def test_without_a_volume_shared_with_the_trainjob_the_step_says_how_to_get_one(tmp_path):
    ctx, rt, inputs = context(tmp_path, runtime("llama3_2_1B.yaml"), mounts=[])
    ctx.shared_root = None
    with pytest.raises(Exception, match="workspace_path: .* configure the pipeline workspace"):
        TorchTuneFinetune(torchtune_settings("full")).configure(ctx, rt, inputs)


def test_qlora_on_two_gpus_is_refused_as_the_trainer_would(tmp_path):
    step = TorchTuneFinetune(torchtune_settings("qlora", resources_per_node={"gpu": 2}))
    with pytest.raises(InvalidSpecErrors, match="exactly 1 GPU per node for QLoRA"):
        step.configure(*context(tmp_path, runtime("llama3_2_1B.yaml")))


# --------------------------------------------------------------------------- the output


def test_the_loss_log_of_a_resumed_run_keeps_each_steps_newest_value(tmp_path):
    logs = tmp_path / "logs"
    logs.mkdir()
    (logs / "log_1.txt").write_text("Step 1 | loss:3.0 lr:0.1 \nStep 2 | loss:2.5 lr:0.1 \nStep 3 | loss:9.9 lr:0.1 \n")
    (logs / "log_2.txt").write_text("Step 3 | loss:2.0 lr:0.1 \nStep 4 | loss:1.5 lr:0.1 \n")
    os.utime(logs / "log_1.txt", (1, 1))
    losses = [(p.step, p.value) for p in tune_output.log_points(tmp_path) if p.name == "loss"]
    assert losses == [(1.0, 3.0), (2.0, 2.5), (3.0, 2.0), (4.0, 1.5)]
