"""The command line refuses the component's artifact placeholders: nothing fills them in there."""

from __future__ import annotations

import pytest

from kfp_trainer import cli


@pytest.mark.parametrize(
    ("flags", "field", "name"),
    [
        (["--args=--data,{dataset}"], "args[1]", "dataset"),
        (["--command", "python,train.py,{model}"], "command[2]", "model"),
        (["--env", "OUT={output_model}/final"], "env[OUT]", "output_model"),
    ],
)
def test_render_and_launch_refuse_a_component_placeholder(flags, field, name, capsys):
    for command in (["render"], ["launch", "--local"]):
        code = cli.main([*command, "--runtime", "torch-distributed", "--image", "my/trainer:1", "--run-id", "r1", *flags])
        err = capsys.readouterr().err
        assert code == 2, err
        assert field in err and f"the train_job component fills in {{{name}}}" in err and "a path" in err


def test_other_braces_pass_through(capsys):
    code = cli.main(["render", "--runtime", "torch-distributed", "--image", "my/trainer:1", "--run-id", "r1", "--args=--fmt,{epoch}"])
    assert code == 0 and "'{epoch}'" in capsys.readouterr().out
