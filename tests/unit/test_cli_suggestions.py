"""Every flag an error suggests is a flag of the command that printed it.

Each command meets the failures a first day brings -- no cluster configured, a kubeconfig that
is missing or not YAML, an API server that refuses connections, bad flags and files -- and
every ``--flag`` its error names must be one the command takes. ``render`` has no ``--local``:
without a cluster it points at ``--api-version v2.2``; ``gc`` has no way without a cluster.
"""

from __future__ import annotations

import argparse
import json
import re
import socket

import pytest

from kfp_trainer import cli
from kfp_trainer.errors import EXIT_INFRA, EXIT_USER

FLAG = re.compile(r"(?<![\w/-])--[a-z][a-z0-9-]*")
COMMANDS = {
    "render": ["render", "--api-version", "auto", "--run-id", "r1"],
    "launch": ["launch", "--run-id", "r1", "--logs", "none"],
    "gc": ["gc"],
}


def flags_of(command: str) -> set[str]:
    commands = next(a for a in cli.build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return {flag for action in commands.choices[command]._actions for flag in action.option_strings}


def run(argv: list[str], capsys) -> tuple[int | None, str]:
    try:
        code: int | None = cli.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    return code, capsys.readouterr().err


@pytest.fixture
def no_cluster(tmp_path, monkeypatch):
    """A user with no kubeconfig anywhere."""
    monkeypatch.setenv("HOME", str(tmp_path))
    monkeypatch.delenv("KUBECONFIG", raising=False)
    monkeypatch.delenv("KUBERNETES_SERVICE_HOST", raising=False)
    return tmp_path


def situations(folder) -> dict[str, tuple[list[str], int]]:
    """Extra arguments that make a command fail, and the exit code they fail with."""
    not_yaml = folder / "not-yaml"
    not_yaml.write_text("clusters: [unclosed\n")
    with socket.socket() as s:  # a port nobody listens on (bound, then released)
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    refused = folder / "refused"
    refused.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"https://127.0.0.1:{port}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u"}}], "users": [{"name": "u", "user": {}}],
    }))  # fmt: skip
    return {
        "no-cluster": ([], EXIT_INFRA),
        "missing-kubeconfig": (["--kubeconfig", str(folder / "nowhere")], EXIT_USER),
        "kubeconfig-not-yaml": (["--kubeconfig", str(not_yaml)], EXIT_USER),
        "refused": (["--kubeconfig", str(refused)], EXIT_INFRA),
    }


@pytest.mark.parametrize("situation", ["no-cluster", "missing-kubeconfig", "kubeconfig-not-yaml", "refused"])
@pytest.mark.parametrize("command", COMMANDS)
def test_cluster_errors_suggest_only_the_commands_own_flags(command, situation, no_cluster, capsys):
    extra, expected = situations(no_cluster)[situation]
    code, err = run([*COMMANDS[command], *extra], capsys)
    assert code == expected, err
    named = set(FLAG.findall(err))
    assert named <= flags_of(command), f"{command} has no {sorted(named - flags_of(command))}: {err}"


def test_without_a_cluster_each_command_says_its_own_way_out(no_cluster, capsys):
    _, render = run(COMMANDS["render"], capsys)
    assert "--api-version v2.2" in render and "--local" not in render
    _, launch = run(COMMANDS["launch"], capsys)
    assert "--local" in launch
    _, gc = run(COMMANDS["gc"], capsys)
    assert gc.rstrip().endswith("give --kubeconfig PATH or set KUBECONFIG"), gc


INPUT_ERRORS = {
    "comma-in-code": ["--command", "python,-c,print(1,2)"],
    "env-without-value": ["--env", "EPOCHS"],
    "missing-inputs-file": ["--inputs-file", "/nowhere/inputs.yaml"],
    "bad-json": ["--patch", "{not: [json"],
    "bad-number": ["--num-nodes", "two"],
    "unknown-flag": ["--nodes", "2"],
    "invalid-inputs": ["--num-nodes", "0", "--image", "a b"],
}


@pytest.mark.parametrize("flags", INPUT_ERRORS.values(), ids=INPUT_ERRORS.keys())
@pytest.mark.parametrize("command", ["render", "launch"])
def test_input_errors_name_only_the_commands_flags(command, flags, no_cluster, capsys):
    code, err = run([*COMMANDS[command], *flags], capsys)
    assert code == EXIT_USER, err
    suggested = set(FLAG.findall(err)) - set(flags)  # what the user typed may be echoed
    assert suggested <= flags_of(command), err


@pytest.mark.parametrize("flags", [["--older-than", "soon"], ["-n", "Team"], ["--yes", "--no"]], ids=["age", "namespace", "unknown"])
def test_gc_errors_name_only_its_flags(flags, no_cluster, capsys):
    code, err = run(["gc", *flags], capsys)
    assert code == EXIT_USER, err
    suggested = set(FLAG.findall(err)) - set(flags)
    assert suggested <= flags_of("gc"), err


@pytest.mark.parametrize(
    ("argv", "meant"),
    [
        (["launch", "--nodes", "2"], "--num-nodes"),
        (["render", "--run_id=r1"], "--run-id"),
        (["gc", "--namespaces", "team"], "--namespace"),
        (["launch", "--start-timout", "5"], "--start-timeout"),
    ],
)
def test_a_mistyped_flag_gets_the_closest_real_one(argv, meant, capsys):
    code, err = run(argv, capsys)
    assert code == EXIT_USER and f"(did you mean {meant}?)" in err.splitlines()[0], err
