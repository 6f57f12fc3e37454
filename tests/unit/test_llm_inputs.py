"""Bad LLM-path input gets one clear error per field: the field, the value, what is allowed."""

from __future__ import annotations

import pytest

from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.llm.inputs import FunctionTrainerSettings, StorageSource, TorchTuneSettings, parse


@pytest.mark.parametrize(
    "values, line",
    [
        ({"dtype": "fp16"}, "dtype: got 'fp16'; expected one of 'bf16', 'fp32'"),
        ({"batch_size": 0}, "batch_size: got 0; expected greater than or equal to 1"),
        ({"epochs": "two"}, "epochs: got 'two'; expected a valid integer"),
        ({"loss": "mse"}, "loss: got 'mse'; expected one of 'torchtune.modules.loss.CEWithChunkedOutputLoss'"),
        ({"num_nodes": 0}, "num_nodes: got 0; expected greater than or equal to 1"),
        (
            {"peft_config": {"lora_attn_modules": ["q_proj", "gate"]}},
            "peft_config.lora_attn_modules.1: got 'gate'; expected one of 'q_proj'",
        ),
        ({"peft_config": {"lora_attn_modules": ["q_proj", "q_proj"]}}, "modules listed twice"),
        ({"peft_config": {"lora_dropout": 1.0}}, "peft_config.lora_dropout: got 1.0; expected less than 1"),
        ({"peft_config": {"lora_rank": 0}}, "peft_config.lora_rank: got 0"),
        ({"peft_config": {"rank": 8}}, "peft_config.rank: got 8; expected no such setting"),
        ({"dataset_preprocess_config": {"source": "yaml"}}, "dataset_preprocess_config.source: got 'yaml'; expected one of 'json', 'csv'"),
        ({"dataset_preprocess_config": {"column_map": {"prompt": "q"}}}, "keys 'input' and/or 'output'"),
        ({"dataset_preprocess_config": {"new_system_prompt": "a=b"}}, "text without '='"),
        ({"resources_per_node": {"cpu": 0.5}}, "cpu: 0.5 is not a whole number; write it as a string, e.g. '500m'"),
        ({"resources_per_node": {"memory": "lots"}}, "memory: 'lots' is not a quantity"),
        ({"resources_per_node": {"gpu": True}}, "gpu: True is not a quantity"),
        ({"resources_per_node": {}}, "at least one resource"),
        ({"learning_rate": 1e-4}, "learning_rate: got 0.0001; expected no such setting"),
    ],
)
def test_torchtune_settings_name_the_bad_field_and_what_is_allowed(values, line):
    with pytest.raises(InvalidSpecErrors) as e:
        parse(TorchTuneSettings, **values)
    assert line in str(e.value)


def test_all_problems_are_reported_together():
    with pytest.raises(InvalidSpecErrors) as e:
        parse(TorchTuneSettings, dtype="x", epochs=0, batch_size=-1)
    assert len(e.value.errors) == 3


def test_whole_number_floats_are_accepted_as_integers():
    assert parse(TorchTuneSettings, resources_per_node={"cpu": 4.0, "memory": "8Gi"}).resources_per_node == {"cpu": 4, "memory": "8Gi"}


@pytest.mark.parametrize(
    "values, line",
    [
        ({"storage_uri": "gs://bucket/x"}, "an hf://<org>/<name>[/<path>] or s3://<bucket>/<path> URI"),
        (
            {"storage_uri": "hf://org/m", "endpoint": "http://minio"},
            "endpoint: got 'http://minio'; expected nothing: it applies to s3:// sources only",
        ),
        ({"storage_uri": "s3://b/p", "secret_ref": "My_Secret"}, "secret_ref: got 'My_Secret'; expected the name of a Secret"),
        ({"storage_uri": "s3://b/p", "ignore_patterns": ["*.bin,*.pt"]}, "without commas"),
        ({"storage_uri": "s3://b/p", "secret_access_key": "abc"}, "secret_access_key: got '<hidden>'; expected no such setting"),
    ],
)
def test_storage_sources_are_checked_and_hold_no_secret_values(values, line):
    with pytest.raises(InvalidSpecErrors) as e:
        parse(StorageSource, **values)
    assert line in str(e.value)


@pytest.mark.parametrize(
    "values, line",
    [
        ({"func_name": "class"}, "func_name: got 'class'; expected a Python function name"),
        ({"func_file": "../x.py"}, "func_file: got '../x.py'"),
        ({"func_args": {"not valid": 1}}, "keyword-argument names"),
        ({"env": {"PET_NNODES": "2"}}, "are set by the Trainer"),
        ({"pip_index_urls": ["ftp://mirror"]}, "http(s) URLs of package indexes"),
        ({"pip_index_urls": []}, "pip_index_urls: got []"),
        ({"packages_to_install": [""]}, "pip requirement strings"),
        ({"func_source": "def other():\n    pass\n"}, "defines no top-level function 'train' (it defines ['other'])"),
        ({"func_source": "def train(:\n"}, "does not parse as Python"),
    ],
)
def test_function_trainer_settings_are_checked(values, line):
    base = {"func_source": "def train():\n    pass\n", "func_name": "train", "func_file": "train.py"}
    with pytest.raises(InvalidSpecErrors) as e:
        parse(FunctionTrainerSettings, **{**base, **values})
    assert line in str(e.value)


def test_a_function_defined_in_a_notebook_cell_keeps_the_sdks_file_name():
    s = parse(FunctionTrainerSettings, func_source="def train():\n    pass\n", func_name="train", func_file="<ipython-input-3-abc>")
    assert s.func_file == "<ipython-input-3-abc>"
