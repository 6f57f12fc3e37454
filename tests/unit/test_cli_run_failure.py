"""``kfp-trainer run --local`` ends a failed pipeline with the failing step's name and its error, in one block.

Real ``kfp.local`` runs of tiny pipelines (one Python step each, no torch) and the block's
formatter on kfp.local's own error texts.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from kfp_trainer.errors import EXIT_JOB_FAILED, EXIT_USER
from kfp_trainer.local_failure import TaskLog, failed_tasks, failure_block, is_step_failure, step_error

REPO = Path(__file__).resolve().parents[2]

PIPELINE = '''
from kfp import dsl


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def prepare(rate: float) -> float:
    print("preparing, rate", rate)
    return rate


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def train(rate: float):
    print("training with rate", rate)
    if rate <= 0:
        raise ValueError(f"the learning rate must be positive, got {rate}")


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def ours():
    from kfp_trainer.errors import JobFailedError
    from kfp_trainer.steps.common import exit_on_error

    def fail():
        diagnosis = "pod x-node-0-0: exit code 3\\nlast log lines: OOM"
        raise JobFailedError("TrainJob team/x-1 failed: BackoffLimitExceeded", diagnosis=diagnosis)

    exit_on_error(fail)


@dsl.pipeline(name="tiny")
def pipeline(rate: float = 0.1, our_step: bool = False):
    prepared = prepare(rate=rate)
    train(rate=prepared.output)
    with dsl.If(our_step == True):  # noqa: E712
        ours()
'''


def run_local(tmp_path: Path, *params: str) -> subprocess.CompletedProcess:
    (tmp_path / "tiny").mkdir(exist_ok=True)
    (tmp_path / "tiny" / "pipeline.py").write_text(PIPELINE)
    args = [sys.executable, "-m", "kfp_trainer.cli", "run", str(tmp_path / "tiny"), "--local", "-o", str(tmp_path / "out")]
    for param in params:
        args += ["--param", param]
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KFP_TRAINER_")}, "PYTHONPATH": str(REPO)}
    return subprocess.run(args, capture_output=True, text=True, env=env, timeout=300, cwd=tmp_path)


def test_a_failed_step_ends_the_run_with_its_name_and_error_and_exit_1(tmp_path):
    done = run_local(tmp_path, "rate=-1")
    assert done.returncode == EXIT_JOB_FAILED, done.stdout[-3000:] + done.stderr[-3000:]
    assert "Traceback" not in done.stderr and "RuntimeError" not in done.stderr, done.stderr
    block = done.stderr.strip().splitlines()
    assert block[0] == "error: step 'train' of pipeline 'tiny' failed:", done.stderr
    assert block[1] == "    ValueError: the learning rate must be positive, got -1.0", done.stderr
    assert block[-1].startswith("The step's whole log is above") and str(tmp_path / "out") in block[-1]
    assert len(block) == 3
    assert "training with rate -1.0" in done.stdout  # the step's own log is still shown, above


def test_this_packages_step_error_is_shown_whole_without_the_prefix(tmp_path):
    done = run_local(tmp_path, "our_step=true")
    assert done.returncode == EXIT_JOB_FAILED, done.stdout[-3000:] + done.stderr[-3000:]
    err = done.stderr
    assert err.startswith("error: step 'ours' (inside 'condition-1') of pipeline 'tiny' failed:\n"), err
    assert "    error: TrainJob team/x-1 failed: BackoffLimitExceeded\n" in err
    assert "    pod x-node-0-0: exit code 3\n    last log lines: OOM\n" in err
    assert "[kfp-trainer] error" not in err and "Traceback" not in err


def test_a_run_that_succeeds_is_unchanged(tmp_path):
    done = run_local(tmp_path)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "finished in" in done.stdout and "error" not in done.stderr


def test_bad_run_input_is_one_line_and_exit_2(tmp_path):
    done = run_local(tmp_path, "rate=fast")
    assert done.returncode == EXIT_USER
    assert done.stderr.strip() == "error: --param rate='fast': expected a float"


LISTS = """
from kfp import dsl


@dsl.component(base_image="python:3.11", install_kfp_package=False)
def show(sizes: list):
    print(sizes)


@dsl.pipeline(name="lists")
def lists(sizes: list = [1]):
    show(sizes=sizes)
"""


@pytest.mark.parametrize(
    ("argv", "said"),
    [
        (["run", "{dir}/nowhere", "--local"], "no pipeline file at"),
        (["run", "{dir}/lists", "--local", "--param", "sizes=[1,"], "--param sizes: not valid JSON or YAML"),
        (["run", "{dir}/lists", "--local", "--param", "nothing=1"], "--param nothing: the pipeline has no such parameter; it has sizes"),
        (["run", "{dir}/lists"], "only --local runs are supported"),
    ],
)
def test_bad_run_arguments_are_one_line_errors(tmp_path, argv, said, capsys):
    from kfp_trainer import cli

    (tmp_path / "lists").mkdir()
    (tmp_path / "lists" / "pipeline.py").write_text(LISTS)
    assert cli.main([a.replace("{dir}", str(tmp_path)) for a in argv]) == EXIT_USER
    err = capsys.readouterr().err
    assert err.startswith("error: ") and said in err and len(err.strip().splitlines()) == 1, err


# --------------------------------------------------------------------------- the formatter, on kfp.local's texts

RED, CYAN, RESET = "\x1b[91m", "\x1b[96m", "\x1b[0m"


def kfp_error(*chain: str) -> RuntimeError:
    names = " inside ".join(f"{CYAN}{name!r}{RESET}" for name in chain)
    return RuntimeError(f"Pipeline \x1b[95m'p'{RESET} finished with status {RED}FAILURE{RESET}. Inner task failed: {names}.")


def test_kfp_errors_are_parsed_with_their_colours():
    assert is_step_failure(kfp_error("train")) and not is_step_failure(RuntimeError("The SubprocessRunner only supports ..."))
    assert failed_tasks(kfp_error("train", "for-loop-2", "exit-handler-1")) == ("p", ["train", "for-loop-2", "exit-handler-1"])
    assert failed_tasks(RuntimeError(f"Task {CYAN}'solo'{RESET} finished with status {RED}FAILURE{RESET}")) == ("", ["solo"])


def test_the_tee_files_lines_under_the_running_task_and_passes_everything_on(tmp_path):
    sink = (tmp_path / "out.txt").open("w+")
    log = TaskLog(sink)
    log.write(f"12:00:00.000 - INFO - Executing task {CYAN}'prepare'{RESET}\n12:00:00.001 - INFO - Streamed logs:\n\n    one\n")
    log.write("    tw")
    log.write("o\n12:00:00.500 - INFO - Task 'prepare' finished with status SUCCESS\n" + "-" * 80 + "\n")
    log.write("12:00:01.000 - INFO - Executing task 'train'\n    three\n")
    sink.seek(0)
    assert "Executing task" in sink.read()
    assert list(log.tails["prepare"]) == ["", "    one", "    two"] and list(log.tails["train"]) == ["    three"]
    assert log.last_task == "train"


@pytest.mark.parametrize(
    ("lines", "said"),
    [
        (["    Traceback (most recent call last):", '      File "/x.py", line 3, in f', "        raise KeyError('k')",
          "    KeyError: 'k'", "    ", ""], ["KeyError: 'k'"]),
        (["    Traceback (most recent call last):", '      File "a"', "    OSError: first", "",
          "    During handling of the above exception, another exception occurred:", "",
          "    Traceback (most recent call last):", '      File "b"', "    RuntimeError: second", "    with a second line"],
         ["RuntimeError: second", "with a second line"]),
        (["    step output", "    [kfp-trainer] error: 2 invalid input(s):", "      - num_nodes: got 0", ""],
         ["error: 2 invalid input(s):", "  - num_nodes: got 0"]),
        (["    just", "    some", "    lines", "    "], ["just", "some", "lines"]),
    ],
    ids=["traceback", "chained", "ours", "no-traceback"],
)  # fmt: skip
def test_the_step_error_is_found_in_its_log(lines, said):
    assert step_error(lines) == said


def test_a_long_error_is_cut_and_secrets_are_hidden():
    lines = ["    [kfp-trainer] error: boom with hf_abcdefghijklmnopqrstuvwxyz0123456789"] + [f"    line {i}" for i in range(100)]
    block = failure_block(kfp_error("train"), {"train": lines})
    assert "hf_abcdefghijklmnopqrstuvwxyz0123456789" not in block
    assert len(block.splitlines()) == 41 and "more lines in the step's log above" in block.splitlines()[-1]
    assert textwrap.dedent(block).startswith("error: step 'train' of pipeline 'p' failed:")
