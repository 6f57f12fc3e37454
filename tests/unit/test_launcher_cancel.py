"""A stop signal at any point of a launch ends with the job deleted or never created (fake backend)."""

from __future__ import annotations

import io
import os
import signal
import threading
import time

import pytest

from kfp_trainer import cancel
from kfp_trainer.cancel import Stop, stopping
from kfp_trainer.errors import EXIT_CANCELLED, CancelledError
from kfp_trainer.jobstatus import JobStatus, Phase
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs
from tests.fakes import FakeBackend

INPUTS = TrainJobInputs(run_id="run-1", task_name="train", namespace="ns")
LEFT = "after deleting TrainJob ns/x, still present after 30s: Pod x-node-0-0-abcde (terminating)"


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)


def backend(script=(), **hooks) -> FakeBackend:
    return FakeBackend(script, idle=True, left=LEFT, hooks=hooks)


def launch(backend, inputs=INPUTS, options=None, **kwargs):
    """What an entry point does: a stop token first, handed to prepare and the launcher."""
    with stopping() as stop:
        job = prepare(backend, inputs, stop=stop)
        return Launcher(backend, options or LaunchOptions(), stop=stop, **kwargs).run(job)


def run(backend, **options):
    out = io.StringIO()
    with pytest.raises(CancelledError) as info:
        launch(backend, options=LaunchOptions(**{"blocker_check_interval": 0, "logs": "none", **options}), out=out)
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
    with pytest.raises(CancelledError):
        launch(fake, options=LaunchOptions(logs="none"), out=out, on_submitted=lambda ref: sigterm())
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


def test_stopping_restores_the_handlers_and_each_block_has_its_own_token():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(CancelledError), stopping() as stop:
        sigterm()
        assert stop.requested == signal.SIGTERM
        stop.check()
    assert signal.getsignal(signal.SIGTERM) == before and stop.requested == signal.SIGTERM
    with stopping() as fresh:
        fresh.check()  # a new run starts with nothing requested
    assert fresh is not stop and fresh.requested is None


def test_a_block_inside_another_shares_its_token():
    with pytest.raises(CancelledError), stopping() as outer:
        with stopping() as inner:
            assert inner is outer
            sigterm()
        assert outer.requested == signal.SIGTERM  # the inner block left it to the outer one


def test_a_cancellable_sleep_ends_at_the_signal():
    with pytest.raises(CancelledError), stopping() as stop:
        threading.Timer(0.1, sigterm).start()
        began = time.monotonic()
        try:
            stop.sleep(10)
        finally:
            assert time.monotonic() - began < 1


def test_a_step_that_got_a_signal_while_finishing_ends_cancelled():
    def step():
        with stopping():
            sigterm()
            return "done"

    with pytest.raises(CancelledError):
        step()


def test_outside_the_main_thread_signals_are_left_alone():
    seen = []
    before = signal.getsignal(signal.SIGTERM)

    def elsewhere():
        with stopping() as stop:
            seen.append((signal.getsignal(signal.SIGTERM) == before, stop.requested))

    thread = threading.Thread(target=elsewhere)
    thread.start()
    thread.join()
    assert seen == [(True, None)] and signal.getsignal(signal.SIGTERM) == before


def test_a_token_nobody_installed_is_set_only_by_a_request():
    stop = Stop()
    stop.check()
    closed = []
    with stop.closing(lambda: closed.append(1)):
        stop.request(signal.SIGINT)
    assert closed == [1] and stop.requested == signal.SIGINT
    with pytest.raises(CancelledError, match="received SIGINT"):
        stop.check()
    assert cancel.cancelled(signal.SIGTERM).exit_code == EXIT_CANCELLED


def test_the_launcher_without_a_token_of_its_entry_point_acts_on_none():
    # A library caller that made no token: nothing is installed, so a request can come only through a token it passes.
    fake = backend([JobStatus(Phase.SUCCEEDED)])
    before = signal.getsignal(signal.SIGTERM)
    outcome = Launcher(fake, LaunchOptions(logs="none"), out=io.StringIO()).run(prepare(fake, INPUTS))
    assert outcome.succeeded and signal.getsignal(signal.SIGTERM) == before


def test_sigint_twice_while_following_deletes_the_job_once_and_says_sigint():
    def two_sigints():
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # the second changes nothing

    fake = backend([JobStatus(Phase.RUNNING)], watch=two_sigints)
    with pytest.raises(CancelledError, match="received SIGINT: the run was cancelled"):
        launch(fake, options=LaunchOptions(logs="none"), out=io.StringIO())
    assert len(fake.deleted) == 1 and fake.delete_finished
