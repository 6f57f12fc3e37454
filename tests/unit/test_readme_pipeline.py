"""The user guide's headline pipeline (docs/guide/pipelines.md) can be copied: it builds, compiles and passes the backend's rules."""

from __future__ import annotations

import re
from pathlib import Path

from kfp import compiler
from test_compiled_yaml_rules import violations

REPO = Path(__file__).resolve().parents[2]


def _headline_block() -> str:
    text = (REPO / "docs" / "guide" / "pipelines.md").read_text()
    section = text.split("# Using the components in a pipeline", 1)[1]
    return re.search(r"```python\n(.*?)```", section, re.S).group(1)


def test_the_readme_pipeline_compiles_and_is_accepted_by_a_kfp_backend(tmp_path):
    scope: dict = {}
    exec(compile(_headline_block(), "docs/guide/pipelines.md", "exec", dont_inherit=True), scope)  # noqa: S102 -- the guide's own example
    out = tmp_path / "finetune.yaml"
    compiler.Compiler().compile(scope["finetune"], str(out))
    text = out.read_text()
    assert violations(text) == []
    assert "tatsu-lab/alpaca" in text and "kfp_trainer.trainers.sft" in text


def test_the_readme_pipeline_fine_tunes_a_pretrained_model_at_a_fine_tuning_rate():
    block = _headline_block()
    rate = re.search(r'"--learning-rate", "([0-9.e-]+)"', block)
    assert rate and float(rate.group(1)) <= 1e-4, "a pretrained model at the tiny demo model's rate forgets what it knew"
