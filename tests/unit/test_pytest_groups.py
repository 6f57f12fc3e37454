"""make test's runner: pytest sessions side by side; the run fails when any fails."""

from __future__ import annotations

import os
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "hack"))
import pytest_groups  # noqa: E402  (hack/pytest_groups.py)


@pytest.fixture
def tree(tmp_path: Path) -> Path:
    (tmp_path / "test_good.py").write_text("def test_one():\n    pass\n\ndef test_two():\n    pass\n")
    (tmp_path / "test_bad.py").write_text("def test_fails():\n    assert 1 == 2\n")
    return tmp_path


def test_both_groups_passing_pass(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = pytest_groups.run(["-q", "-p", "no:cacheprovider"], {"a": ["test_good.py"], "bb": ["test_good.py::test_one"]}, tree)
    out = capsys.readouterr().out
    assert code == 0
    assert "[a ] " in out and "[bb] " in out  # each line says its group
    assert "a: exit 0: 2 passed" in out and "bb: exit 0: 1 passed" in out


def test_one_failing_group_fails_the_run_and_says_which(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    code = pytest_groups.run(["-q", "-p", "no:cacheprovider"], {"a": ["test_good.py"], "b": ["test_bad.py"]}, tree)
    out = capsys.readouterr().out
    assert code == 1
    assert "a: exit 0: 2 passed" in out and "b: exit 1: 1 failed" in out


def test_failed_tests_are_named_again_at_the_end(tree: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """A CI log's tail names the failing tests, not only the counts (the groups' lines interleave above)."""
    code = pytest_groups.run(["-q", "-ra", "-p", "no:cacheprovider"], {"a": ["test_good.py"], "b": ["test_bad.py"]}, tree)
    out = capsys.readouterr().out
    assert code == 1
    tail = out.split("summary of the test groups", 1)[1]
    assert "b: FAILED test_bad.py::test_fails" in tail
    assert "a: FAILED" not in tail


def test_a_group_can_run_at_a_lower_priority(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    """The unit and local tests yield the CPU to the control plane's build and the integration tests."""
    base = os.nice(0)
    (tmp_path / "test_nice.py").write_text(f"import os\n\ndef test_nice():\n    assert os.nice(0) == {min(19, base + 10)}\n")
    (tmp_path / "test_plain.py").write_text(f"import os\n\ndef test_plain():\n    assert os.nice(0) == {base}\n")
    code = pytest_groups.run(["-q", "-p", "no:cacheprovider"], {"low": ["test_nice.py"], "normal": ["test_plain.py"]}, tmp_path,
                             nice={"low": 10})  # fmt: skip
    assert code == 0, capsys.readouterr().out
    assert pytest_groups.NICE.get("unit+local", 0) > 0
