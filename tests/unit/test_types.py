"""mypy finds no error in kfp_trainer/ with the settings in pyproject.toml ([tool.mypy]), strict where they say so."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.timeout(300)


def test_mypy_finds_no_error_in_the_package() -> None:
    # From the repository root, so that pyproject.toml is the configuration and .mypy_cache/ is reused.
    run = subprocess.run([sys.executable, "-m", "mypy"], cwd=REPO, capture_output=True, text=True, timeout=280)
    output = run.stdout + run.stderr
    assert run.returncode == 0, f"mypy reports errors in kfp_trainer/ (run `python -m mypy` in {REPO}):\n{output}"
    # Every module of the package checked: a configuration that names fewer files also "succeeds".
    checked = re.search(r"no issues found in (\d+) source files", output)
    modules = sum(1 for _ in (REPO / "kfp_trainer").rglob("*.py"))
    assert checked is not None and int(checked.group(1)) == modules, output
