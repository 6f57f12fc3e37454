"""A trainjob_component function whose parameters are named like modules runs under ``kfp.local`` with their values.

The component's body once bound ``steps`` and ``inputs`` itself, so such a parameter received a
module (whose repr in the command was a syntax error in the trainer) or the launcher's settings.
"""

import json
import tempfile
from pathlib import Path

import pytest
from kfp import dsl, local

from kfp_trainer.components import trainjob_component


@pytest.fixture
def kfp_local(tmp_path, monkeypatch):
    monkeypatch.setenv("KFP_TRAINER_BACKEND", "local")
    monkeypatch.setenv("KFP_TRAINER_LOCAL_ROOT", str(tmp_path / "trainjobs"))
    root = tmp_path / "pipeline-root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root),
               workspace_root=tempfile.mkdtemp(prefix="ws-", dir=tmp_path))  # fmt: skip
    return root


@pytest.mark.slow
def test_parameters_named_like_modules_reach_the_function_in_a_local_trainjob(kfp_local):
    @trainjob_component(num_nodes=1)
    def fit(output_dir: str, steps: int = 2, inputs: str = "x", os: str = "o", json: dict = None, kfp: float = 0.5):
        import json as json_module
        import os as os_module

        os_module.makedirs(output_dir, exist_ok=True)
        seen = {"steps": steps, "inputs": inputs, "os": os, "json": json, "kfp": kfp}
        with open(os_module.path.join(output_dir, "seen.json"), "w") as f:
            f.write(json_module.dumps(seen))

    @dsl.pipeline(name="fn-names")
    def fn_names():
        fit(steps=7, inputs="batch", os="linux", json={"a": [1, 2]})

    fn_names()
    out = next(kfp_local.glob("*/fit/output_model"))
    assert json.loads((Path(out) / "seen.json").read_text()) == {"steps": 7, "inputs": "batch", "os": "linux", "json": {"a": [1, 2]},
                                                                 "kfp": 0.5}  # fmt: skip
