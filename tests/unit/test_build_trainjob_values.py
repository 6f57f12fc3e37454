"""``build_trainjob`` (the library) takes the values the ``train_job`` component takes, converted the same way."""

import pytest

from kfp_trainer import spec
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.steps import train_job_inputs
from kfp_trainer.steps.train_job import identify


def test_numbers_and_booleans_in_env_and_args_become_text_as_in_the_component():
    given = {"env": {"EPOCHS": 3, "LR": 0.5, "DEBUG": True, "STEPS": 5.0}, "args": ["--epochs", 3, "--lr", 1e-4]}
    manifest = spec.build_trainjob(run_id="r1", task_name="t", **given)
    env = {e["name"]: e["value"] for e in manifest["spec"]["trainer"]["env"]}
    assert env == {"EPOCHS": "3", "LR": "0.5", "DEBUG": "true", "STEPS": "5"}
    assert manifest["spec"]["trainer"]["args"] == ["--epochs", "3", "--lr", "0.0001"]
    # the component's own conversion of the same values (run id and task as the step fills them in)
    step = identify(train_job_inputs({"run_id": "r1", "task_name": "t", **given}), output_uri="")
    assert step["env"] == {k: env[k] for k in given["env"]} and step["args"] == manifest["spec"]["trainer"]["args"]


def test_a_credential_given_as_a_number_is_still_refused_without_showing_it():
    with pytest.raises(InvalidSpecErrors) as info:
        spec.build_trainjob(run_id="r1", env={"DB_PASSWORD": 123456789012})
    assert "123456789012" not in str(info.value) and "DB_PASSWORD" in str(info.value)
