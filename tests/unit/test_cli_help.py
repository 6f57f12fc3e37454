"""The command line explains itself: every subcommand listed, every flag with help and its default, ``--version``,
and list flags that cannot cut code at its commas."""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from kfp_trainer import __version__, cli
from kfp_trainer.errors import EXIT_USER

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("render", "launch", "run", "gc", "compile")


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    action = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(action.choices)


def test_every_subcommand_is_listed_in_the_help():
    text = cli.build_parser().format_help()
    for name in COMMANDS:
        assert f"\n    {name} " in text, name
    assert set(subparsers(cli.build_parser())) == set(COMMANDS)


@pytest.mark.parametrize("name", COMMANDS)
def test_every_flag_has_help_that_states_its_default(name):
    sub = subparsers(cli.build_parser())[name]
    formatter = sub._get_formatter()
    missing = []
    for action in sub._actions:
        if not action.option_strings or action.help == argparse.SUPPRESS or "-h" in action.option_strings:
            continue
        if not action.help:
            missing.append(f"{action.option_strings[0]}: no help")
            continue
        shown = formatter._get_help_string(action) % {"default": action.default}
        if "(default: " not in shown and "when unset" not in shown:
            missing.append(f"{action.option_strings[0]}: no default in {shown!r}")
    assert not missing, missing


def test_defaults_shown_are_the_real_ones():
    launch = subparsers(cli.build_parser())["launch"].format_help()
    flat = " ".join(launch.split())
    assert "(default: 3600.0)" in flat and "(default: auto)" in flat and "(default: torch-distributed)" in flat
    assert "(default: ClusterTrainingRuntime)" in flat
    render = " ".join(subparsers(cli.build_parser())["render"].format_help().split())
    assert "(default: v2.2)" in render


def test_version_names_the_package_and_its_pins():
    done = subprocess.run([sys.executable, "-m", "kfp_trainer.cli", "--version"], capture_output=True, text=True, cwd=REPO,
                          env={"PYTHONPATH": str(REPO), "PATH": ""}, timeout=120)  # fmt: skip
    assert done.returncode == 0, done.stderr
    line = done.stdout.strip()
    assert line.startswith(f"kfp-trainer {__version__} (kfp 2.17.") and "kubernetes 30.1." in line and "Python 3." in line


def test_compile_help_is_the_generators_and_its_flags_parse_through_the_main_parser():
    ns = cli.build_parser().parse_args(["compile", "--check", "--output-dir", "out", "--storage-class", "nfs"])
    assert ns.check and ns.output_dir == Path("out") and ns.storage_class == "nfs"


def render_command(capsys, *flags: str) -> tuple[list[str], list[str]]:
    assert cli.main(["render", "--api-version", "v2.2", "--run-id", "r1", "--task-name", "t", *flags]) == 0
    manifest = yaml.safe_load(capsys.readouterr().out)
    trainer = manifest["spec"]["trainer"]
    return trainer.get("command", []), trainer.get("args", [])


def test_plain_comma_separated_items_still_split(capsys):
    command, args = render_command(capsys, "--command", "torchrun,train.py", "--args=--lr=0.1,--epochs=3,/data")
    assert command == ["torchrun", "train.py"] and args == ["--lr=0.1", "--epochs=3", "/data"]


def test_a_json_list_keeps_commas_inside_items(capsys):
    command, _ = render_command(capsys, "--command", json.dumps(["python", "-c", "print(1,2)"]))
    assert command == ["python", "-c", "print(1,2)"]


@pytest.mark.parametrize(
    "text",
    ["python,-c,print(1,2)", "python,-c,import json; json.dumps([1,2])", "sh,-c,echo 'a,b'", 'python,-c,x = {"a": 1,"b": 2}'],
)
def test_a_comma_inside_brackets_or_quotes_is_refused_with_the_json_form(text, capsys):
    assert cli.main(["render", "--api-version", "v2.2", "--run-id", "r1", "--command", text]) == EXIT_USER
    err = capsys.readouterr().err
    assert err.startswith("error: --command ") and "JSON list" in err and '--command \'["python", "-c", "print(1, 2)"]\'' in err
    assert len(err.strip().splitlines()) == 1


def test_the_refusal_never_shows_a_secret(capsys):
    token = "hf_" + "a" * 34
    assert cli.main(["render", "--api-version", "v2.2", "--run-id", "r1", f"--args=--token={token},f(1,2)"]) == EXIT_USER
    assert token not in capsys.readouterr().err
