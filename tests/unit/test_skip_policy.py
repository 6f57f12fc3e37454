"""Under CI a skipped test fails the run; a doctest whose examples are all +SKIP does not; every run lists its skips."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run(tmp_path: Path, source: str, *, ci: bool) -> subprocess.CompletedProcess[str]:
    shutil.copy(REPO / "conftest.py", tmp_path / "conftest.py")
    (tmp_path / "test_it.py").write_text(source)
    env = {k: v for k, v in os.environ.items() if k != "CI"} | ({"CI": "true"} if ci else {})
    args = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "--doctest-modules", "test_it.py"]
    return subprocess.run(args, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120)


SKIPPING = 'import pytest\n\ndef test_ok():\n    pass\n\ndef test_later():\n    pytest.skip("no cluster here")\n'
XFAILING = 'import pytest\n\n@pytest.mark.xfail(reason="known bug")\ndef test_bug():\n    assert False\n'
DOCTEST_SKIP = '"""Example:\n\n    >>> connect()  # doctest: +SKIP\n    ok\n"""\n\ndef test_ok():\n    pass\n'


@pytest.mark.parametrize("source", [SKIPPING, XFAILING])
def test_a_skip_or_an_expected_failure_fails_a_ci_run_and_is_listed_with_its_reason(tmp_path: Path, source: str) -> None:
    done = run(tmp_path, source, ci=True)
    assert done.returncode == 1, done.stdout
    assert "test_it.py::test_" in done.stdout and ("no cluster here" in done.stdout or "known bug" in done.stdout)
    assert "CI runs every test" in done.stdout


def test_outside_ci_a_skip_is_listed_and_the_run_passes(tmp_path: Path) -> None:
    done = run(tmp_path, SKIPPING, ci=False)
    assert done.returncode == 0, done.stdout
    assert "skipped: 1, 1 of them not a doctest's +SKIP" in done.stdout and "test_it.py::test_later: no cluster here" in done.stdout


def test_a_doctest_whose_examples_are_all_skipped_passes_a_ci_run(tmp_path: Path) -> None:
    done = run(tmp_path, DOCTEST_SKIP, ci=True)
    assert done.returncode == 0, done.stdout
    assert "skipped: 1, 0 of them not a doctest's +SKIP" in done.stdout
