"""torchtune_finetune as the SDK's BuiltinTrainer: values written as given, explicit None, quantize_base, no overrides.

Compared with the SDK on the API server in tests/integration/test_sdk_interop_components.py.
"""

from __future__ import annotations

import pytest

from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.llm import render
from kfp_trainer.llm.inputs import LoraSettings, StorageSource, TorchTuneSettings, parse
from kfp_trainer.spec import TrainJobInputs
from kfp_trainer.spec import render as render_trainjob
from kfp_trainer.steps.finetune import TorchTuneFinetune, torchtune_settings


def test_an_integer_dropout_is_written_as_the_sdk_writes_it():
    assert render.torchtune_args(parse(TorchTuneSettings, peft_config={"lora_dropout": 0})) == [
        "model.lora_dropout=0", "model.lora_attn_modules=[q_proj,v_proj,output_proj]",
    ]  # fmt: skip
    assert "model.lora_dropout=0.05" in render.torchtune_args(parse(TorchTuneSettings, peft_config={"lora_dropout": 0.05}))
    assert "model.lora_dropout=0" in render.torchtune_args(torchtune_settings("lora", lora_dropout=0))
    with pytest.raises(InvalidSpecErrors, match="lora_dropout: got True; expected a number, not a bool"):
        parse(LoraSettings, lora_dropout=True)


def test_ignore_patterns_given_as_none_means_none_and_left_out_means_the_sdks_default():
    def env(**source):
        return render.initializer_inputs(None, parse(StorageSource, storage_uri="hf://org/model", **source))["model_env"]

    assert env(ignore_patterns=None) == []
    assert env() == [{"name": "IGNORE_PATTERNS", "value": "*.msgpack,*.h5,*.bin,*.pt,*.pth"}]
    assert env(ignore_patterns=[]) == [{"name": "IGNORE_PATTERNS", "value": ""}]
    step = TorchTuneFinetune(torchtune_settings(), model_uri="hf://org/model", model_options={"ignore_patterns": None})
    source = step.storage()[0]["model"]
    assert "ignore_patterns" in source.model_fields_set and source.ignore_patterns is None


def test_quantize_base_false_is_sent_with_lora_and_contradictions_are_refused():
    assert "model.quantize_base=False" in render.torchtune_args(torchtune_settings("lora", quantize_base=False))
    assert "model.quantize_base=True" in render.torchtune_args(torchtune_settings("qlora"))
    assert not any("quantize_base" in a for a in render.torchtune_args(torchtune_settings("lora")))
    for method, value, message in (
        ("lora", True, "quantize_base: got True; expected False or unset with method='lora'"),
        ("qlora", False, "quantize_base: got False; expected True or unset with method='qlora'"),
        ("full", False, "quantize_base: got False; expected nothing with method='full'"),
    ):
        with pytest.raises(InvalidSpecErrors, match=message):
            torchtune_settings(method, quantize_base=value)


def test_an_explicit_empty_args_list_is_sent_and_none_given_sends_none():
    base = {"name": "job", "runtime": "torchtune-qwen2.5-1.5b", "run_id": "r", "task_name": "t", "command": ["tune", "run"]}
    assert render_trainjob(TrainJobInputs.parse(**base, args=[]))["spec"]["trainer"]["args"] == []
    assert "args" not in render_trainjob(TrainJobInputs.parse(**base))["spec"]["trainer"]
