"""Settings for every pytest run in this tree: its skips listed at its end, and a skip fails CI.

What a run skipped is said at its end, with the reason; under CI (``CI=true``) a skipped test
fails the run.

A test that the suite never runs is not a test: under CI the only skips allowed are doctests whose
examples are all marked ``+SKIP`` (examples that need a cluster or a trained model to show).
"""

from __future__ import annotations

import os

import pytest

DOCTEST_ALL_SKIPPED = "all tests skipped by +SKIP option"


def in_ci() -> bool:
    """Whether this run is CI's (``CI`` set to 1, true or yes)."""
    return os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def skip_reason(report: pytest.TestReport) -> str:
    """The reason a skipped test's report gives."""
    longrepr = report.longrepr
    if isinstance(longrepr, tuple) and len(longrepr) == 3:
        return str(longrepr[2]).removeprefix("Skipped: ")
    return str(longrepr)


def refused_skips(reports: list[pytest.TestReport]) -> list[pytest.TestReport]:
    """The skips CI does not accept: all but doctests whose examples are all ``+SKIP``."""
    return [r for r in reports if skip_reason(r) != DOCTEST_ALL_SKIPPED]


def skipped_reports(reporter: pytest.TerminalReporter) -> list[pytest.TestReport]:
    """The run's skipped tests (skips in setup, as a missing fixture gives, and in the test itself)."""
    return [r for r in reporter.stats.get("skipped", []) if r.when in ("setup", "call")]


def pytest_terminal_summary(terminalreporter: pytest.TerminalReporter, exitstatus: int, config: pytest.Config) -> None:
    """Lists what was skipped, and why, after everything else the run printed."""
    skipped = skipped_reports(terminalreporter)
    xfailed = terminalreporter.stats.get("xfailed", [])
    refused = refused_skips(skipped) + xfailed
    terminalreporter.section(f"skipped: {len(skipped) + len(xfailed)}, {len(refused)} of them not a doctest's +SKIP", sep="-")
    for r in skipped:
        terminalreporter.write_line(f"{r.nodeid}: {skip_reason(r)}")
    for r in xfailed:
        terminalreporter.write_line(f"{r.nodeid}: expected to fail ({getattr(r, 'wasxfail', '')})")
    if in_ci() and refused:
        terminalreporter.write_line(f"CI runs every test: the {len(refused)} skipped above (not a doctest's +SKIP) fail this run", red=True)


@pytest.hookimpl(trylast=True)
def pytest_sessionfinish(session: pytest.Session, exitstatus: int) -> None:
    """Under CI, a run that skipped a test (but a doctest's ``+SKIP``) fails."""
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    if not in_ci() or reporter is None:
        return
    refused = refused_skips(skipped_reports(reporter)) + reporter.stats.get("xfailed", [])
    if refused and session.exitstatus == pytest.ExitCode.OK:
        session.exitstatus = pytest.ExitCode.TESTS_FAILED
