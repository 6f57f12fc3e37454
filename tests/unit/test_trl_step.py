"""The TRL fine-tune's decisions: its settings (KEP-626 TRLConfig names), the TrainJob's arguments, the runtime, the data."""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from kfp_trainer.backends.local_runtime import BUILTIN_RUNTIMES
from kfp_trainer.compile import generate
from kfp_trainer.components import TRAINER_IMAGE
from kfp_trainer.data import DatasetError, load_preference_split, load_split
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.llm.trl_config import trl_settings
from kfp_trainer.llm.trl_runtime import COMMAND, RUNTIME_NAME, trl_runtime
from kfp_trainer.spec import TrainJobInputs
from kfp_trainer.steps.step_types import StepArtifacts, StepOptions, TrainerContext
from kfp_trainer.steps.trl import TRLFinetune, run_trl_finetune
from kfp_trainer.trainers.builtin import addition_preference_records
from kfp_trainer.trainers.trl_train import last_checkpoint, prepare_argv

REPO = Path(__file__).resolve().parents[2]


def errors_of(excinfo) -> dict[str, str]:
    return {e.field: e.allowed for e in excinfo.value.errors}


def context(tmp_path: Path, rt: dict, *, local: bool = True, with_sources: bool = True) -> tuple:
    """What the step hands the trainer's configure: its context, the runtime as read, the inputs so far."""
    artifact = SimpleNamespace(path=str(tmp_path / "in"), uri="x", metadata={}) if with_sources else None
    ctx = TrainerContext(
        local=local, shared_root=None, key="trl-abc", workspace_path="", output_model=SimpleNamespace(path=str(tmp_path / "out")),
        dataset=artifact, model=artifact,
    )  # fmt: skip
    return ctx, SimpleNamespace(document=rt), TrainJobInputs.parse(runtime=rt["metadata"]["name"])


def test_the_inputs_render_as_the_kep_626_trl_config_renders_them():
    s = trl_settings(method="dpo", learning_rate=5e-6, per_device_train_batch_size=4, num_train_epochs=2, bf16=False, use_peft=True,
                     lora_r=16, lora_alpha=32, lora_target_modules=["q_proj", "v_proj"], beta=0.1, extra_args=["--warmup_steps", "5"])
    assert s.to_args() == [
        "dpo", "--learning_rate", "5e-06", "--per_device_train_batch_size", "4", "--num_train_epochs", "2", "--bf16", "false",
        "--use_peft", "--lora_r", "16", "--lora_alpha", "32", "--lora_target_modules", "q_proj", "v_proj", "--beta", "0.1",
        "--warmup_steps", "5",
    ]  # fmt: skip
    assert s.adapter
    # A pipeline's 0 / "" / -1 mean: TRL's default, so nothing is rendered for them.
    assert trl_settings(method="sft", learning_rate=0.0, max_steps=0, seed=-1, lora_r=0, beta=0.0).to_args() == ["sft"]


def test_every_bad_input_is_reported_at_once_with_what_is_allowed():
    with pytest.raises(InvalidSpecErrors) as excinfo:
        trl_settings(
            method="ppo", learning_rate=-1.0, per_device_train_batch_size=2.5, lora_r=8,
            lora_target_modules=["q_proj;rm"], extra_args=["--output_dir", "/tmp/x", "--learning_rate", "1", "--Bad"],
        )  # fmt: skip
    errors = errors_of(excinfo)
    assert errors["method"] == "sft, dpo or grpo"
    assert "positive" in errors["learning_rate"] and "whole number" in errors["per_device_train_batch_size"]
    assert "use_peft" in errors["lora_r"]
    assert "module names" in errors["lora_target_modules"]
    assert "does not set itself" in errors["extra_args[0]"] and "set learning_rate instead" in errors["extra_args[2]"]
    assert "TRL flag" in errors["extra_args[4]"]
    with pytest.raises(InvalidSpecErrors) as excinfo:
        trl_settings(method="sft", use_peft=True, lora_dropout=1.5)
    assert "0 to 1" in errors_of(excinfo)["lora_dropout"]


def test_dpo_settings_on_sft_and_qlora_without_peft_are_refused():
    with pytest.raises(InvalidSpecErrors) as excinfo:
        trl_settings(method="sft", beta=0.1)
    assert "method='dpo'" in errors_of(excinfo)["beta"]
    with pytest.raises(InvalidSpecErrors) as excinfo:
        trl_settings(method="sft", load_in_4bit=True, use_peft=False)
    assert "QLoRA" in errors_of(excinfo)["use_peft"]
    assert trl_settings(method="sft", load_in_4bit=True, lora_r=4).adapter  # QLoRA is LoRA on the 4-bit base


def test_the_trainjob_carries_only_the_arguments_with_the_artifact_placeholders(tmp_path):
    rt = trl_runtime("img")
    ctx, runtime, inputs = context(tmp_path, rt)
    out = TRLFinetune(trl_settings(method="sft", max_steps=5, use_peft=True), merge_adapter=False).configure(ctx, runtime, inputs)
    assert out == {"args": ["sft", "--max_steps", "5", "--use_peft", "--model_name_or_path", "{model}", "--dataset_name", "{dataset}",
                            "--output_dir", "{output_model}", "--merge_adapter", "false"]}  # fmt: skip
    assert ctx.metadata["method"] == "sft" and json.loads(ctx.metadata["trl_settings"])["max_steps"] == 5
    assert "LoRA adapter" in ctx.report["TRL"]


def test_a_runtime_that_is_not_a_trl_runtime_is_refused_with_its_label(tmp_path):
    with pytest.raises(InvalidSpecErrors) as excinfo:
        TRLFinetune(trl_settings(method="sft")).configure(*context(tmp_path, BUILTIN_RUNTIMES["torch-distributed"]))
    allowed = errors_of(excinfo)["runtime"]
    assert "trainer.kubeflow.org/framework: trl" in allowed and "labelled torch" in allowed and RUNTIME_NAME in allowed


def test_qlora_is_refused_locally_on_a_machine_without_cuda(tmp_path):
    with pytest.raises(InvalidSpecErrors) as excinfo:
        TRLFinetune(trl_settings(method="sft", load_in_4bit=True)).configure(*context(tmp_path, trl_runtime("img")))
    assert "CUDA" in errors_of(excinfo)["load_in_4bit"]


def test_model_and_dataset_need_exactly_one_source_each_before_anything_runs(tmp_path):
    out = SimpleNamespace(path=str(tmp_path / "out"))
    given = SimpleNamespace(path=str(tmp_path), uri="u", metadata={})
    artifacts = StepArtifacts(output_model=out, metrics=None, report=None, trainjob_path="", model=given)
    with pytest.raises(InvalidSpecErrors) as excinfo:
        run_trl_finetune(method="sft", settings={}, inputs={}, artifacts=artifacts, options=StepOptions(), model_uri="hf://org/m")
    errors = errors_of(excinfo)
    assert "one source" in errors["model_uri"] and "dataset_initializer" in errors["dataset"]
    assert not list(tmp_path.iterdir())  # nothing fetched or written


def test_the_trainer_adds_this_machines_defaults_and_refuses_what_it_cannot_run():
    argv = prepare_argv("dpo", ["--save_steps", "3"], cuda=False, bf16_ok=False, bitsandbytes=False)
    assert argv[:2] == ["--save_steps", "3"] and argv.count("--save_steps") == 1
    assert argv[argv.index("--use_cpu") + 1] == "true" and argv[argv.index("--bf16") + 1] == "false"
    with pytest.raises(SystemExit, match="bf16 needs a GPU"):
        prepare_argv("sft", ["--bf16"], cuda=False, bf16_ok=False, bitsandbytes=False)
    with pytest.raises(SystemExit, match="QLoRA .* needs CUDA .* and the bitsandbytes package"):
        prepare_argv("sft", ["--load_in_4bit", "true"], cuda=False, bf16_ok=False, bitsandbytes=False)
    with pytest.raises(SystemExit, match="bitsandbytes"):
        prepare_argv("sft", ["--load_in_4bit"], cuda=True, bf16_ok=True, bitsandbytes=False)
    assert "--use_cpu" not in prepare_argv("sft", ["--load_in_4bit"], cuda=True, bf16_ok=True, bitsandbytes=True)
    with pytest.raises(SystemExit, match="method 'ppo'"):
        prepare_argv("ppo", [], cuda=False, bf16_ok=False, bitsandbytes=False)


def test_the_newest_complete_checkpoint_is_the_one_resumed(tmp_path):
    assert last_checkpoint(tmp_path / "missing") is None
    for step, complete in ((10, True), (20, True), (30, False)):
        (tmp_path / f"checkpoint-{step}").mkdir()
        if complete:
            (tmp_path / f"checkpoint-{step}" / "trainer_state.json").write_text("{}")
    assert last_checkpoint(tmp_path) == (20, tmp_path / "checkpoint-20")


def test_preference_pairs_are_read_for_dpo_and_as_the_chosen_answer_for_sft(tmp_path):
    chat = {"prompt": [{"role": "user", "content": "2+2?"}], "chosen": [{"role": "assistant", "content": "4"}], "rejected": "5"}
    rows = [{"prompt": "1+1=", "chosen": "2", "rejected": 3}, chat]
    (tmp_path / "train.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "test.jsonl").write_text(json.dumps(rows[0]) + "\n")
    pairs = load_preference_split(tmp_path, "train", log=lambda _: None)
    assert pairs[0] == {"prompt": "1+1=", "chosen": "2", "rejected": "3"}
    assert pairs[1] == {"prompt": "<|user|>\n2+2?\n<|assistant|>\n", "chosen": "4", "rejected": "5"}
    assert load_split(tmp_path, "train", log=lambda _: None)[1] == {"prompt": "<|user|>\n2+2?\n<|assistant|>\n", "completion": "4"}
    (tmp_path / "test.jsonl").write_text(json.dumps({"prompt": "a", "completion": "b"}) + "\n")
    with pytest.raises(DatasetError, match=r"test.jsonl: columns \['prompt', 'completion'\] are not a preference pair"):
        load_preference_split(tmp_path, "test", log=lambda _: None)
    (tmp_path / "test.jsonl").write_text(json.dumps({"prompt": "a", "chosen": None, "rejected": "c"}) + "\n")
    with pytest.raises(DatasetError, match="test.jsonl, record 1: column 'chosen' is missing"):
        load_preference_split(tmp_path, "test", log=lambda _: None)


def test_the_builtin_preference_set_rejects_a_near_miss_and_keeps_test_sums_out_of_train():
    train, test = addition_preference_records()
    assert len(train) == 9500 and len(test) == 500
    assert all(int(r["chosen"]) == sum(map(int, r["prompt"][:-1].split("+"))) and r["rejected"] != r["chosen"] for r in train + test)
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}
    assert addition_preference_records() == (train, test)  # deterministic


def test_the_deploy_file_is_the_runtime_local_mode_runs_with_the_trainer_image():
    deployed = yaml.safe_load((REPO / "deploy" / "trl-runtime.yaml").read_text())
    assert deployed == trl_runtime(TRAINER_IMAGE)
    assert generate(REPO, trainer_image="registry.example.com/t:1", pipelines=False)[REPO / "deploy" / "trl-runtime.yaml"].count(
        "image: registry.example.com/t:1") == 1  # fmt: skip
    local = BUILTIN_RUNTIMES[RUNTIME_NAME]
    assert local["metadata"] == deployed["metadata"] and local["spec"]["mlPolicy"] == deployed["spec"]["mlPolicy"]
    node = deployed["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert node["command"] == list(COMMAND) == ["torchrun", "-m", "kfp_trainer.trainers.trl_train"]


def test_a_literal_token_in_extra_args_is_refused_hidden_before_anything_is_created(tmp_path, monkeypatch):
    monkeypatch.setenv("KFP_TRAINER_LOCAL_ROOT", str(tmp_path / "jobs"))
    token = "hf_" + "abcdefghijklmnopqrstuvwxyz1234"
    folders = {k: SimpleNamespace(path=str(tmp_path / k), uri=k, metadata={}) for k in ("model", "dataset")}
    for f in folders.values():
        Path(f.path).mkdir()
    artifacts = StepArtifacts(
        output_model=SimpleNamespace(path=str(tmp_path / "out"), uri="out", metadata={}), metrics=None,
        report=SimpleNamespace(path=str(tmp_path / "report")), trainjob_path=str(tmp_path / "trainjob"), **folders,
    )  # fmt: skip
    with pytest.raises(InvalidSpecErrors) as excinfo:
        run_trl_finetune(
            method="sft", settings={}, extra_args=["--hub_token", token],
            inputs={"runtime": RUNTIME_NAME, "run_id": "r1", "task_name": "t"}, artifacts=artifacts,
            options=StepOptions(backend="local", start_timeout=10),
        )  # fmt: skip
    assert token not in str(excinfo.value) and "credential" in str(excinfo.value)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dataset", "model"]  # no job, no output


def test_the_trainers_logs_become_json_lines_and_progress_from_rank_0_only(capsys):
    from kfp_trainer.trainers._common import DistEnv
    from kfp_trainer.trainers.trl_train import _callback

    sent = []
    reporter = SimpleNamespace(report_step=lambda step, total, metrics: sent.append((step, total, metrics)))
    state = SimpleNamespace(global_step=5, max_steps=20)
    logs = {"loss": 0.6931472, "rewards/margins": 0.01, "learning_rate": 5e-3, "note": "text"}
    _callback(DistEnv(rank=0, world_size=2), reporter, "dpo").on_log(None, state, None, logs=logs)
    _callback(DistEnv(rank=1, world_size=2), reporter, "dpo").on_log(None, state, None, logs=logs)
    assert [json.loads(line) for line in capsys.readouterr().out.splitlines()] == [
        {"step": 5, "loss": 0.693147, "rewards/margins": 0.01, "learning_rate": 0.005}
    ]
    assert sent == [(5, 20, {"loss": 0.693147, "learning_rate": 0.005, "rewards/margins": 0.01})]
