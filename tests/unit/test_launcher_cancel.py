"""A stop signal at any point of a launch ends with the job deleted or never created (fake backend)."""

from __future__ import annotations

import io
import os
import signal
import threading
import time

import pytest

from kfp_trainer import cancel
from kfp_trainer.errors import EXIT_CANCELLED, CancelledError
from kfp_trainer.jobstatus import JobStatus, Phase
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.spec import TrainJobInputs
from tests.fakes import FakeBackend, fresh_stop_signals  # noqa: F401  (a fixture)

INPUTS = TrainJobInputs(run_id="run-1", task_name="train", namespace="ns")
LEFT = "after deleting TrainJob ns/x, still present after 30s: Pod x-node-0-0-abcde (terminating)"


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def backend(script=(), **hooks) -> FakeBackend:
    return FakeBackend(script, idle=True, left=LEFT, hooks=hooks)


def run(backend, **options):
    out = io.StringIO()
    launcher = Launcher(backend, LaunchOptions(**{"blocker_check_interval": 0, "logs": "none", **options}), out=out)
    with pytest.raises(CancelledError) as info:
        launcher.run(INPUTS)
    assert info.value.exit_code == EXIT_CANCELLED == 130
    assert str(info.value) == "received SIGTERM: the run was cancelled"
    return out.getvalue()


def test_a_signal_before_the_create_creates_nothing():
    fake = backend(prepare=sigterm)
    run(fake)
    assert not fake.exists and fake.submitted == [] and fake.reclaimed == [] and fake.deleted == []


def test_a_signal_during_the_create_waits_for_it_then_deletes_what_it_made():
    fake = backend(create=sigterm)
    out = run(fake)
    assert len(fake.submitted) == 1  # the create went through
    assert fake.reclaimed and not fake.exists
    assert "cancelled while submitting; deleted TrainJob ns/" in out


def test_a_signal_while_announcing_deletes_the_job():
    fake = FakeBackend([JobStatus(Phase.PENDING)], idle=True, notes=("replaced stale TrainJob ns/old",))
    out = io.StringIO()
    launcher = Launcher(fake, LaunchOptions(logs="none"), out=out, on_submitted=lambda ref: sigterm())
    with pytest.raises(CancelledError):
        launcher.run(INPUTS)
    assert len(fake.deleted) == 1 and not fake.exists
    assert "replaced stale TrainJob ns/old" in out.getvalue()


def test_a_signal_while_following_deletes_the_job_within_a_heartbeat():
    fake = backend([JobStatus(Phase.RUNNING)], watch=lambda: threading.Timer(0.2, sigterm).start())
    began = time.monotonic()
    out = run(fake, logs="0")
    assert len(fake.deleted) == 1 and fake.released == fake.deleted
    assert f"CancelledError: deleting TrainJob {fake.deleted[0]}" in out
    assert time.monotonic() - began < 5


def test_a_cancel_during_failure_diagnosis_exits_130_and_deletes_the_job():
    fake = backend([JobStatus(Phase.FAILED, "FailedJobs", "node-0 exited 1")], diagnose=sigterm)
    out = run(fake)
    assert len(fake.deleted) == 1
    assert "CancelledError: deleting TrainJob" in out


def test_a_second_signal_during_deletion_does_not_abort_it_and_what_is_left_is_reported():
    fake = backend([JobStatus(Phase.RUNNING), None], watch=sigterm, delete=sigterm)
    out = run(fake)
    assert fake.delete_finished and len(fake.deleted) == 1
    assert "Pod x-node-0-0-abcde (terminating)" in out


def test_a_signal_while_the_log_drains_after_success_cuts_the_drain_short_and_deletes_the_job():
    slow_drain = lambda: (threading.Timer(0.2, sigterm).start(), time.sleep(30))  # noqa: E731
    fake = FakeBackend([JobStatus(Phase.RUNNING), JobStatus(Phase.SUCCEEDED)], lines=["step 1"], hooks={"logs": slow_drain})
    began = time.monotonic()
    out = run(fake, logs="0", log_drain_timeout=30)
    assert time.monotonic() - began < 5 and len(fake.deleted) == 1, out


def test_a_signal_a_library_swallows_still_ends_the_run():
    # The handler raises nothing, so nothing can be lost: not in a weakref callback, a
    # logging handler, or an ``except Exception`` of a library on the main thread's way.
    def swallowed():
        try:
            sigterm()
            time.sleep(0.05)
        except Exception:
            pass

    fake = backend([JobStatus(Phase.RUNNING)], watch=swallowed)
    run(fake)
    assert len(fake.deleted) == 1


def test_a_signal_while_the_launcher_starts_its_log_thread_deletes_the_job(monkeypatch):
    real = threading.Thread.start

    def start_then_signal(thread):
        real(thread)
        if thread.name == "trainer-logs":
            signal.raise_signal(signal.SIGTERM)  # the handler runs here, still inside start

    monkeypatch.setattr(threading.Thread, "start", start_then_signal)
    fake = backend([JobStatus(Phase.PENDING)])
    out = run(fake, logs="0")
    assert len(fake.deleted) == 1 and not fake.exists, out


def test_handling_restores_the_handlers_and_forgets_the_signal():
    before = signal.getsignal(signal.SIGTERM)
    with cancel.handling():
        sigterm()
        assert cancel.requested() == signal.SIGTERM
        with pytest.raises(CancelledError):
            cancel.check()
    assert signal.getsignal(signal.SIGTERM) == before and cancel.requested() is None
    with cancel.handling():
        cancel.check()  # a new run starts with nothing on record


def test_a_cancellable_sleep_ends_at_the_signal():
    with cancel.handling():
        threading.Timer(0.1, sigterm).start()
        began = time.monotonic()
        with pytest.raises(CancelledError):
            cancel.sleep(10)
        assert time.monotonic() - began < 1


def test_an_entry_point_that_got_a_signal_while_finishing_ends_cancelled():
    @cancel.entry_point
    def step():
        sigterm()
        return "done"

    try:
        with pytest.raises(CancelledError):
            step()
    finally:
        cancel.uninstall()


def test_outside_the_main_thread_signals_are_left_alone():
    seen = []
    before = signal.getsignal(signal.SIGTERM)
    thread = threading.Thread(target=lambda: seen.append((cancel.install(), cancel.installed())))
    thread.start()
    thread.join()
    assert seen == [(False, False)] and signal.getsignal(signal.SIGTERM) == before


def test_sigint_twice_while_following_deletes_the_job_once_and_says_sigint():
    def two_sigints():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the second changes nothing

    fake = backend([JobStatus(Phase.RUNNING)], watch=two_sigints)
    launcher = Launcher(fake, LaunchOptions(logs="none"), out=io.StringIO())
    with pytest.raises(CancelledError, match="received SIGINT: the run was cancelled"):
        launcher.run(INPUTS)
    assert len(fake.deleted) == 1 and fake.delete_finished
