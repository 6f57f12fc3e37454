"""Hostile input through the command line: the whole case table via ``kfp-trainer launch --inputs-file``
(on a recording backend), and bad files and flags of its own -- each ends in a clear message and exit 2,
never a traceback, never a secret shown."""

from __future__ import annotations

import pytest
from hostile_cases import CASES, CLI_CASES, CliCase
from hostile_harness import cli_problems, problems, run, run_cli_case

TABLE = [case for case in CASES if "cli" in case.layers]
# A sample run as real processes too: what a user's terminal shows.
PROCESS = ["file-missing", "file-python-object-tag", "file-not-utf8", "file-binary", "flag-patch-not-json", "flag-num-nodes-text"]


@pytest.mark.parametrize("case", TABLE, ids=[c.id for c in TABLE])
def test_inputs_file_with_a_hostile_input_is_rejected_or_rendered_safely(case, tmp_path):
    assert problems(case, run(case, "cli", tmp_path)) == []


@pytest.mark.parametrize("case", CLI_CASES, ids=[c.id for c in CLI_CASES])
def test_bad_files_and_flags_end_in_a_clear_message_and_exit_2(case: CliCase, tmp_path):
    assert cli_problems(case, run_cli_case(case, tmp_path)) == []


@pytest.mark.parametrize("name", PROCESS)
def test_as_a_process_bad_input_prints_one_error_line_and_no_traceback(name, tmp_path):
    case = next(c for c in CLI_CASES if c.id == name)
    result = run_cli_case(case, tmp_path, subprocess_run=True)
    assert cli_problems(case, result) == []
    assert "error" in result.message.splitlines()[0]  # an argument error adds one line: where the help is


def test_a_python_tag_in_an_inputs_file_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"
    case = CliCase("tag", ("render", "--inputs-file", "{dir}/f.yaml"), "python/object/apply",
                   (("f.yaml", f'runtime: !!python/object/apply:os.system ["touch {marker}"]\n'.encode()),))  # fmt: skip
    assert cli_problems(case, run_cli_case(case, tmp_path)) == []
    assert not marker.exists()
