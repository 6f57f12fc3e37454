"""The command line follows kubectl's conventions: short argument errors, ``-n``, ``-A``, ``-o yaml|json``, plain help.

An argument error is two lines -- ``kfp-trainer COMMAND: error: ...`` and where the help is --
not the whole usage first; ``--help`` shows no reST markup; ``-n`` is ``--namespace`` wherever
there is one; ``-o`` picks the output format of ``render``, ``launch``'s summary and ``gc``'s
listing, each keeping its old output as the default.
"""

from __future__ import annotations

import http.server
import json
import os
import re
import subprocess
import sys
import threading
from pathlib import Path

import pytest
import yaml
from hostile_cases import HF

from kfp_trainer import cli
from kfp_trainer.errors import EXIT_USER

REPO = Path(__file__).resolve().parents[2]
COMMANDS = ("render", "launch", "run", "gc", "compile")
RENDER = ("render", "--api-version", "v2.2", "--run-id", "r1", "--task-name", "train")


def run(argv: list[str], capsys) -> tuple[int | None, str, str]:
    """``kfp-trainer ARGV`` in this process: exit code, stdout, stderr."""
    try:
        code: int | None = cli.main(argv)
    except SystemExit as e:
        code = e.code if isinstance(e.code, int) else 1
    captured = capsys.readouterr()
    return code, captured.out, captured.err


# ------------------------------------------------------------------ argument errors


@pytest.mark.parametrize(
    ("argv", "prog", "words"),
    [
        (["render", "--num-nodes", "many"], "kfp-trainer render", ("argument --num-nodes", "got 'many'", "ASCII digits")),
        (["launch", "--logs-for", "all"], "kfp-trainer launch", ("unrecognized arguments: --logs-for all",)),
        (["render", "--api-version", "v3"], "kfp-trainer render", ("invalid choice: 'v3'",)),
        (["gc", "-n", "team", "--all-namespaces"], "kfp-trainer gc", ("not allowed with argument -n/--namespace",)),
        (["run"], "kfp-trainer run", ("the following arguments are required: pipeline",)),
        (["compile", "--check", "extra"], "kfp-trainer compile", ("unrecognized arguments: extra",)),
        (["lanch"], "kfp-trainer", ("invalid choice: 'lanch'",)),
        ([], "kfp-trainer", ("required: COMMAND",)),
    ],
    ids=["bad-number", "unknown-flag", "bad-choice", "exclusive", "missing-positional", "extra-positional", "bad-command", "no-command"],
)
def test_an_argument_error_is_two_lines_naming_the_command_and_its_help(argv, prog, words, capsys):
    code, out, err = run(argv, capsys)
    assert code == EXIT_USER and out == ""
    assert err.splitlines() == [err.splitlines()[0], f"see '{prog} --help'"], err
    assert err.startswith(f"{prog}: error: "), err
    for word in words:
        assert word in err, err
    assert "usage:" not in err


def test_an_unknown_flag_holding_a_secret_is_not_echoed(capsys):
    code, _, err = run(["launch", f"--hf-token={HF}"], capsys)
    assert code == EXIT_USER and "unrecognized arguments: --hf-token=" in err and HF not in err


def test_as_a_process_the_terminal_shows_the_two_lines():
    done = subprocess.run([sys.executable, "-m", "kfp_trainer.cli", "launch", "--num-nodes", "two"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)  # fmt: skip
    assert done.returncode == EXIT_USER
    assert done.stderr.splitlines() == [
        "kfp-trainer launch: error: argument --num-nodes: got 'two'; expected a whole number written with ASCII digits 0-9",
        "see 'kfp-trainer launch --help'",
    ]


# ------------------------------------------------------------------ help without markup

MARKUP = re.compile(r"``|`[^`]+`|:[a-z]+:`|\*\*")


def helps() -> dict[str, str]:
    parser = cli.build_parser()
    return {"kfp-trainer": parser.format_help(), **{name: sub.format_help() for name, sub in cli.subparsers(parser).items()}}


def test_every_subcommand_is_covered():
    assert set(helps()) == {"kfp-trainer", *COMMANDS}


@pytest.mark.parametrize("name", ["kfp-trainer", *COMMANDS])
def test_help_shows_no_rest_markup(name):
    text = helps()[name]
    assert not MARKUP.findall(text), MARKUP.findall(text)


def test_help_as_a_process_is_plain_and_keeps_the_words():
    done = subprocess.run([sys.executable, "-m", "kfp_trainer.cli", "gc", "--help"], capture_output=True, text=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)}, timeout=120)  # fmt: skip
    assert done.returncode == 0 and not MARKUP.findall(done.stdout)
    flat = " ".join(done.stdout.split())
    assert "task gone -- it has not finished" in flat and "Nothing is deleted without --yes;" in flat


@pytest.mark.parametrize(
    ("text", "plain"),
    [
        ("``render`` prints", "render prints"),
        ("``compile\n--check`` found", "compile\n--check found"),
        (":func:`~kfp_trainer.spec.render`", "render"),
        (":mod:`kfp_trainer.gc`", "kfp_trainer.gc"),
        (":py:class:`the error <kfp_trainer.errors.UserError>`", "the error"),
        ("**run gone** -- `x`", "run gone -- x"),
        ("* a bullet, 2 * 3, a*b", "* a bullet, 2 * 3, a*b"),
    ],
)
def test_plain_text(text, plain):
    assert cli.plain_text(text) == plain


# ------------------------------------------------------------------ -n, -A, -o


def test_dash_n_is_the_namespace_wherever_there_is_one():
    parser = cli.build_parser()
    for name, sub in cli.subparsers(parser).items():
        long = [a for a in sub._actions if "--namespace" in a.option_strings]
        if long:
            assert long[0].option_strings == ["-n", "--namespace"], name
    assert parser.parse_args(["gc", "-A"]).all_namespaces
    assert parser.parse_args(["launch", "-n", "team"]).namespace == "team"


def test_render_dash_n_and_dash_o_json(capsys):
    code, out, _ = run([*RENDER, "-n", "team"], capsys)
    assert code == 0
    as_yaml = yaml.safe_load(out)
    assert out.startswith("apiVersion: trainer.kubeflow.org/v1alpha1\nkind: TrainJob\n")  # the default is YAML, as before
    assert as_yaml["metadata"]["namespace"] == "team"
    code, out, _ = run([*RENDER, "-n", "team", "-o", "json"], capsys)
    assert code == 0 and json.loads(out) == as_yaml
    assert run([*RENDER, "-n", "team", "--output", "yaml"], capsys)[1] == yaml.safe_dump(as_yaml, sort_keys=False)


def test_launch_summary_dash_o(capsys, monkeypatch):
    from hostile_harness import RecordingBackend

    from kfp_trainer.backends import kubernetes

    monkeypatch.setattr(kubernetes.KubernetesBackend, "from_config", classmethod(lambda cls, *a, **kw: RecordingBackend()))
    launch = ["launch", "--run-id", "r1", "--task-name", "train", "--logs", "none"]
    code, out, _ = run(launch, capsys)
    assert code == 0
    last = out.strip().splitlines()[-1]
    summary = json.loads(last)  # the default: one JSON line at the end, as before
    assert summary["trainjob"].startswith("team-a/") and summary["phase"] == "Succeeded"
    code, out, _ = run([*launch, "-o", "yaml"], capsys)
    assert code == 0
    as_yaml = yaml.safe_load(out[out.index("trainjob: ") :])
    # The same summary, field for field; the phases' seconds are each run's own (wall clock, to the millisecond).
    assert sorted(as_yaml["seconds"]) == sorted(summary["seconds"]) and all(v >= 0 for v in as_yaml["seconds"].values())
    assert {**as_yaml, "seconds": None} == {**summary, "seconds": None}


class TrainJobs(http.server.BaseHTTPRequestHandler):
    """An API server holding one old, finished TrainJob of kfp-trainer in namespace team; nothing else."""

    JOB = {
        "metadata": {
            "name": "train-x", "namespace": "team", "uid": "j1", "creationTimestamp": "2020-01-01T00:00:00Z",
            "labels": {"app.kubernetes.io/managed-by": "kfp-trainer"},
            "annotations": {"kfp-trainer.kubeflow.org/run-id": "run-1", "kfp-trainer.kubeflow.org/task": "train"},
        },
        "spec": {}, "status": {"conditions": [{"type": "Complete", "status": "True", "reason": "x"}]},
    }  # fmt: skip

    def do_GET(self) -> None:  # noqa: N802
        if self.path.startswith("/apis/trainer.kubeflow.org/v1alpha1/namespaces/team/trainjobs"):
            status, body = 200, {"kind": "TrainJobList", "items": [self.JOB], "metadata": {}}
        else:
            status, body = 404, {"kind": "Status", "status": "Failure", "reason": "NotFound", "code": 404}
        data = json.dumps(body).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def cluster(tmp_path):
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), TrainJobs)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    config = tmp_path / "kubeconfig"
    config.write_text(json.dumps({
        "apiVersion": "v1", "kind": "Config", "current-context": "c",
        "clusters": [{"name": "c", "cluster": {"server": f"http://127.0.0.1:{server.server_address[1]}"}}],
        "contexts": [{"name": "c", "context": {"cluster": "c", "user": "u", "namespace": "team"}}],
        "users": [{"name": "u", "user": {"token": "not-a-real-token"}}],
    }))  # fmt: skip
    yield config
    server.shutdown()
    server.server_close()


@pytest.mark.parametrize("output", ["json", "yaml"])
def test_gc_dash_o_prints_the_listing_as_a_document_and_its_notes_on_stderr(cluster, output, capsys):
    code, out, err = run(["gc", "--kubeconfig", str(cluster), "-n", "team", "--older-than", "24h", "-o", output], capsys)
    assert code == 0, err
    listing = json.loads(out) if output == "json" else yaml.safe_load(out)
    assert listing["namespace"] == "team" and listing["found"] == 1
    [item] = listing["items"]
    assert (item["name"], item["run"], item["state"], item["garbage"], item["deleted"]) == ("train-x", "run-1", "Succeeded", True, None)
    assert item["why"] == ["older than 1d"] and item["ageSeconds"] > 86400
    assert "1 TrainJob(s) created by kfp-trainer in namespace team; 1 to collect" in err and "dry run" in err


def test_gc_without_dash_o_prints_the_table_as_before(cluster, capsys):
    code, out, _ = run(["gc", "--kubeconfig", str(cluster), "--older-than", "24h"], capsys)
    assert code == 0
    lines = out.splitlines()
    assert lines[0] == "1 TrainJob(s) created by kfp-trainer in namespace team; 1 to collect"
    assert lines[1].split() == ["NAMESPACE", "NAME", "RUN", "TASK", "AGE", "STATE", "WHY"]
    assert lines[2].split()[:2] == ["team", "train-x"] and lines[-1].startswith("dry run: nothing deleted")
