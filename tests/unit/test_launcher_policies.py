"""Launcher policies with a scripted in-memory backend (pure logic: no cluster needed).

The real backend is exercised against a real API server in tests/integration.
"""

from __future__ import annotations

import io
import os
import signal
import threading

import pytest

from kfp_trainer.backends.base import Blocker
from kfp_trainer.cancel import stopping
from kfp_trainer.errors import CancelledError, CannotStartError, JobFailedError, TimeLimitError
from kfp_trainer.jobstatus import JobStatus, Phase
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs
from tests.fakes import FakeBackend, FakeClock

INPUTS = TrainJobInputs(run_id="run-1", task_name="train", namespace="ns")


class ScriptedBackend(FakeBackend):
    """The shared fake with an ``on_watch`` hook (kept for the tests that read better with it)."""

    def __init__(self, script, clock, *, on_watch=None, **kwargs) -> None:
        super().__init__(script, clock, hooks={"watch": on_watch}, **kwargs)


def launch(backend, clock, **options):
    out = io.StringIO()
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=0, **options), out=out, clock=clock)
    return launcher, out


def test_success_collects_metrics_and_keeps_the_job_by_default():
    clock = FakeClock()
    backend = ScriptedBackend(
        [JobStatus(Phase.PENDING), JobStatus(Phase.RUNNING), JobStatus(Phase.SUCCEEDED, "AllJobsCompleted")],
        clock,
        lines=['{"step": 1, "loss": 2.0}', '{"step": 2, "loss": 1.0}'],
    )
    launcher, out = launch(backend, clock)
    outcome = launcher.run(prepare(launcher.backend, INPUTS))
    assert outcome.succeeded and outcome.reason == "AllJobsCompleted"
    assert outcome.metrics.final() == {"loss": 1.0}
    assert backend.deleted == []
    assert '{"step": 2, "loss": 1.0}' in out.getvalue()


def test_delete_after_success_option():
    clock = FakeClock()
    backend = ScriptedBackend([JobStatus(Phase.SUCCEEDED)], clock)
    launcher, _ = launch(backend, clock, delete_after_success=True)
    launcher.run(prepare(launcher.backend, INPUTS))
    assert len(backend.deleted) == 1


def test_failure_raises_with_reason_and_diagnosis_and_keeps_the_job():
    clock = FakeClock()
    backend = ScriptedBackend([JobStatus(Phase.RUNNING), JobStatus(Phase.FAILED, "FailedJobs", "node-0 exited 1")], clock)
    launcher, _ = launch(backend, clock)
    with pytest.raises(JobFailedError) as info:
        launcher.run(prepare(launcher.backend, INPUTS))
    assert "FailedJobs: node-0 exited 1" in str(info.value) and "x-node-0-0: Failed" in str(info.value)
    assert backend.deleted == []


def test_start_timeout_deletes_the_job():
    clock = FakeClock()
    backend = ScriptedBackend([JobStatus(Phase.PENDING)] + [10] * 20, clock)
    launcher, _ = launch(backend, clock, start_timeout=60)
    with pytest.raises(TimeLimitError, match="did not start within start_timeout=60s"):
        launcher.run(prepare(launcher.backend, INPUTS))
    assert len(backend.deleted) == 1 and 60 < clock.now <= 80


def test_run_timeout_counts_from_start():
    clock = FakeClock()
    backend = ScriptedBackend([JobStatus(Phase.PENDING), 50, JobStatus(Phase.RUNNING)] + [10] * 20, clock)
    launcher, _ = launch(backend, clock, start_timeout=100, run_timeout=30)
    with pytest.raises(TimeLimitError, match="ran longer than run_timeout=30s"):
        launcher.run(prepare(launcher.backend, INPUTS))
    assert 80 < clock.now <= 100 and len(backend.deleted) == 1


def test_persistent_blocker_fails_within_its_grace():
    clock = FakeClock()
    backend = ScriptedBackend([JobStatus(Phase.PENDING)] + [5] * 30, clock, blockers=[Blocker("Unschedulable", "0/1 nodes available")])
    launcher, out = launch(backend, clock, blocker_grace=30)
    with pytest.raises(CannotStartError, match="Unschedulable: 0/1 nodes available") as info:
        launcher.run(prepare(launcher.backend, INPUTS))
    assert "Blockers:" in str(info.value) and len(backend.deleted) == 1
    assert 30 <= clock.now <= 40
    assert "not starting yet: Unschedulable" in out.getvalue()


def test_fatal_blocker_uses_the_short_grace():
    clock = FakeClock()
    backend = ScriptedBackend(
        [JobStatus(Phase.PENDING)] + [5] * 30, clock, blockers=[Blocker("TrainJobResourcesCreationFailed", "runtime missing", fatal=True)]
    )
    launcher, _ = launch(backend, clock, fatal_blocker_grace=10)
    with pytest.raises(CannotStartError, match="TrainJobResourcesCreationFailed"):
        launcher.run(prepare(launcher.backend, INPUTS))
    assert clock.now <= 15


def test_suspended_job_waits_and_counts_toward_the_start_limit():
    clock = FakeClock()
    backend = ScriptedBackend(
        [JobStatus(Phase.SUSPENDED, "Suspended", "queued")] + [10] * 3 + [JobStatus(Phase.RUNNING), JobStatus(Phase.SUCCEEDED)], clock
    )
    launcher, out = launch(backend, clock, start_timeout=100)
    assert launcher.run(prepare(launcher.backend, INPUTS)).succeeded
    assert "suspended" in out.getvalue()


def test_sigterm_deletes_the_job_and_raises_cancelled_then_restores_the_handlers():
    clock = FakeClock()
    backend = ScriptedBackend([JobStatus(Phase.RUNNING)] + [0] * 100000, clock, on_watch=lambda: os.kill(os.getpid(), signal.SIGTERM))

    def before(signum, frame):  # the caller's own handler, which the entry point's token must give back
        raise AssertionError("not expected to run")

    previous = signal.signal(signal.SIGTERM, before)
    try:
        with pytest.raises(CancelledError, match="SIGTERM"), stopping() as stop:
            launcher = Launcher(backend, LaunchOptions(blocker_check_interval=0), out=io.StringIO(), clock=clock, stop=stop)
            launcher.run(prepare(backend, INPUTS))
        assert signal.getsignal(signal.SIGTERM) is before
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert len(backend.deleted) == 1


def test_invalid_inputs_fail_before_the_backend_is_asked_anything():
    class Untouchable(ScriptedBackend):
        def resolve_runtime(self, inputs):
            raise AssertionError("must not be called")

    clock = FakeClock()
    launcher, _ = launch(Untouchable([], clock), clock)
    with pytest.raises(ValueError, match="num_nodes"):
        launcher.run(prepare(launcher.backend, INPUTS.model_copy(update={"num_nodes": 0})))


def test_all_nodes_prefixes_lines_and_leaves_no_log_thread_behind():
    clock = FakeClock()
    backend = ScriptedBackend([JobStatus(Phase.SUCCEEDED)], clock, lines=["hello"])
    launcher, out = launch(backend, clock, logs="all")
    before = set(threading.enumerate())
    outcome = launcher.run(prepare(launcher.backend, INPUTS))
    assert "[node-0] hello" in out.getvalue() and outcome.log_lines == 1
    assert [t.name for t in set(threading.enumerate()) - before] == []
