"""One answer from every entry point: the same inputs are accepted, and rendered the same, or refused, wherever they come in.

The rule (``TrainJobInputs.parse``): numbers and booleans in ``command``, ``args`` and ``env``
values become text (integral numbers without ``.0``, booleans lower case); anything else that is
not text there is refused. Seeded random inputs go through

* :func:`kfp_trainer.spec.build_trainjob` (the Python API);
* ``TrainJobInputs.parse`` and ``prepare`` (the launcher's path, here on a fake backend);
* ``kfp-trainer render --inputs-file`` (the command line; a YAML file of the same values);
* the ``train_job`` component's step: its inputs identified (``steps.train_job.identify``),
  then parsed and prepared;

and each must give the same trainer command, args and env, or refuse.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path

import pytest
import yaml

from kfp_trainer import cli
from kfp_trainer.errors import KfpTrainerError
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs, build_trainjob
from kfp_trainer.steps.train_job import identify
from tests.fakes import FakeBackend

IDENTITY = {"runtime": "torch-distributed", "run_id": "r1", "task_name": "train"}
SCALARS = ["x", "--lr", "5.0", "3", "", "a b", "-1.50", 7, -3, 0, 2.0, 0.5, 1e-3, True, False, None, [1], {"a": 1}, float("nan")]
NAMES = ["EPOCHS", "LR", "A_1", "1BAD", "", "has space"]


def random_inputs(rng: random.Random) -> dict:
    """``command``, ``args`` and ``env`` of one case (each sometimes missing, sometimes not a list or map)."""
    inputs: dict = {}
    for key in ("command", "args"):
        shape = rng.random()
        if shape < 0.7:
            inputs[key] = [rng.choice(SCALARS) for _ in range(rng.randint(0, 3))]
        elif shape < 0.8:
            inputs[key] = rng.choice(["python train.py", 3, {"a": "b"}])
    if rng.random() < 0.8:
        inputs["env"] = {rng.choice(NAMES): rng.choice(SCALARS) for _ in range(rng.randint(0, 3))}
    return inputs


def trainer_part(manifest: dict) -> tuple:
    trainer = manifest["spec"].get("trainer") or {}
    env = {e["name"]: e.get("value") for e in trainer.get("env") or []}
    return ("ok", trainer.get("command"), trainer.get("args"), env)


def through_api(inputs: dict) -> tuple:
    try:
        return trainer_part(build_trainjob(**IDENTITY, **inputs))
    except KfpTrainerError:
        return ("refused",)


def through_launcher(inputs: dict) -> tuple:
    try:
        return trainer_part(prepare(FakeBackend(), TrainJobInputs.parse(**IDENTITY, **inputs)).manifest)
    except KfpTrainerError:
        return ("refused",)


def through_component(inputs: dict, tmp: Path) -> tuple:
    try:
        given = identify({**IDENTITY, **inputs}, output_uri=str(tmp / "output_model"))
        return trainer_part(prepare(FakeBackend(), TrainJobInputs.parse(**given)).manifest)
    except KfpTrainerError:
        return ("refused",)


def through_cli(inputs: dict, tmp: Path, capsys) -> tuple:
    path = tmp / "inputs.yaml"
    path.write_text(yaml.safe_dump(inputs))
    capsys.readouterr()
    code = cli.main(["render", "--api-version", "v2.2", "--runtime", "torch-distributed", "--run-id", "r1", "--task-name", "train",
                     "--inputs-file", str(path), "--output", "json"])  # fmt: skip
    out = capsys.readouterr().out
    return trainer_part(json.loads(out)) if code == 0 else ("refused",)


def same(a: tuple, b: tuple) -> bool:
    """Equal, NaN's text included (``"nan"`` either way)."""
    return json.dumps(a, sort_keys=True, default=str) == json.dumps(b, sort_keys=True, default=str)


@pytest.mark.parametrize("seed", range(4))
def test_every_entry_point_accepts_renders_or_refuses_the_same_inputs_alike(seed, tmp_path, capsys):
    rng = random.Random(seed)
    accepted = refused = 0
    for case in range(60):
        inputs = random_inputs(rng)
        answers = {
            "build_trainjob": through_api(inputs),
            "parse + prepare": through_launcher(inputs),
            "the component's step": through_component(inputs, tmp_path),
            "kfp-trainer render": through_cli(inputs, tmp_path, capsys),
        }
        first = answers["build_trainjob"]
        assert all(same(first, other) for other in answers.values()), f"case {seed}/{case}: {inputs!r}\n" + "\n".join(
            f"  {where}: {answer}" for where, answer in answers.items()
        )
        accepted += first[0] == "ok"
        refused += first[0] == "refused"
    assert accepted and refused  # the cases cover both answers


def test_the_rule_numbers_and_booleans_become_text_and_other_values_are_refused():
    ok = build_trainjob(**IDENTITY, command=["python", 3], args=["--lr", 0.5, "--steps", 5.0, "--fast", True], env={"A": 3, "B": False})
    assert trainer_part(ok) == ("ok", ["python", "3"], ["--lr", "0.5", "--steps", "5", "--fast", "true"], {"A": "3", "B": "false"})
    assert through_launcher({"command": ["python", 3], "env": {"A": 3}}) == ("ok", ["python", "3"], None, {"A": "3"})
    for bad in ({"command": ["python", [1]]}, {"env": {"A": {"b": 1}}}, {"args": "--lr 0.5"}):
        assert through_api(bad) == through_launcher(bad) == ("refused",), bad
    assert math.isnan(float(trainer_part(build_trainjob(**IDENTITY, args=[float("nan")]))[2][0]))
