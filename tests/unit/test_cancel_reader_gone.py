"""A KFP cancel as the step sees it: the signal, and a stdout whose reader died of the same signal.

The launcher's deletion goes out before anything is written, from a thread of its own the moment
the stop is requested; a write that meets the closed pipe neither ends the process nor stops
the deletion; a reader that went away without a signal cancels too (exit 141); the Python API
without a token cancels like the entry points. Fake backend; the real processes and the real
node are ``tests/local/test_cancel_entry_points_local.py`` and
``tests/integration/test_cancel_kfp_pod.py``.
"""

from __future__ import annotations

import contextlib
import io
import os
import signal
import sys
import threading
import time
from collections.abc import Iterator

import pytest

from kfp_trainer.cancel import READER_GONE, Guarded, Stop, stopping
from kfp_trainer.errors import EXIT_CANCELLED, EXIT_READER_GONE, CancelledError
from kfp_trainer.jobstatus import JobStatus, Phase
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs
from tests.fakes import FakeBackend

INPUTS = TrainJobInputs(run_id="run-1", task_name="train", namespace="ns")
OPTIONS = LaunchOptions(logs="0", blocker_check_interval=0)


class Pipe(io.TextIOBase):
    """A step's stdout: every write recorded with its time, until ``close()``; then each write fails as on a closed pipe."""

    def __init__(self) -> None:
        self.lines: list[tuple[float, str]] = []
        self.closed_at: float | None = None
        self.failed = 0

    def close_reader(self) -> None:
        self.closed_at = time.monotonic()

    def write(self, text: str) -> int:
        if self.closed_at is not None:
            self.failed += 1
            raise BrokenPipeError(32, "Broken pipe")
        self.lines.append((time.monotonic(), text))
        return len(text)

    def flush(self) -> None:
        if self.closed_at is not None:
            raise BrokenPipeError(32, "Broken pipe")

    def text(self) -> str:
        return "".join(t for _, t in self.lines)


@pytest.fixture
def pipe() -> Iterator[Pipe]:
    """``sys.stdout`` and ``sys.stderr`` both a :class:`Pipe` (KFP's launcher reads them together).

    Set in the test's own frame: pytest puts its capture back between a fixture's setup and the test.
    """
    stream = Pipe()
    yield stream


@contextlib.contextmanager
def piped(stream: Pipe) -> Iterator[None]:
    before = sys.stdout, sys.stderr
    sys.stdout = sys.stderr = stream
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before


def signal_in(seconds: float, sig: int = signal.SIGTERM) -> None:
    """``sig`` to this process ``seconds`` from now (a hook starts it: the launcher is waiting by then)."""
    threading.Timer(seconds, os.kill, (os.getpid(), sig)).start()


def kfp_cancel(pipe: Pipe) -> None:
    """What a KFP terminate does to the step: its stdout's reader dies, and SIGTERM comes at the same moment."""
    pipe.close_reader()
    os.kill(os.getpid(), signal.SIGTERM)


def entry_point(fake: FakeBackend, options: LaunchOptions = OPTIONS) -> None:
    """What ``kfp-trainer launch`` and the components' bodies do: a token first, the launcher writing to sys.stdout."""
    with stopping() as stop:
        Launcher(fake, options, stop=stop).run(prepare(fake, INPUTS, stop=stop))


def test_the_deletion_goes_out_before_the_cancel_is_said(pipe):
    fake = FakeBackend([JobStatus(Phase.PENDING)], idle=True, hooks={"watch": lambda: signal_in(0.3)})
    with pytest.raises(CancelledError) as info, piped(pipe):
        entry_point(fake)
    assert info.value.exit_code == EXIT_CANCELLED
    said = next(t for t, text in pipe.lines if "CancelledError: deleting TrainJob" in text)
    assert fake.requested and fake.requested[0][0] < said, (fake.requested, pipe.text())
    assert len(fake.deleted) == 1 and not fake.exists  # and the flow's own deletion waited for it


def test_a_stdout_closed_with_the_signal_neither_ends_the_step_nor_stops_the_deletion(pipe):
    # The closed pipe is met by the cancel's own lines and by every line after: none of them ends the process.
    fake = FakeBackend([JobStatus(Phase.PENDING)], idle=True, hooks={"watch": lambda: threading.Timer(0.3, kfp_cancel, (pipe,)).start()})
    with pytest.raises(CancelledError) as info, piped(pipe):
        entry_point(fake)
    assert len(fake.deleted) == 1 and fake.delete_finished and not fake.exists
    assert pipe.failed >= 1  # the cancel's line met the closed pipe
    assert info.value.exit_code == EXIT_CANCELLED  # the signal says why: it wins over the pipe it came with


def test_a_closed_pipe_met_before_the_signal_is_seen_still_deletes_the_job(pipe):
    # The log relay writes first (another thread), before the main thread has seen the signal.
    fake = FakeBackend([JobStatus(Phase.RUNNING)], idle=True, lines=[f"step {i}" for i in range(3)], hold_logs=True,
                       hooks={"logs": pipe.close_reader})  # fmt: skip
    with pytest.raises(CancelledError) as info, piped(pipe):
        entry_point(fake)
    assert info.value.exit_code == EXIT_READER_GONE == 141  # nobody follows the launch any more: cancelled
    assert str(info.value) == "the reader of the output went away: the run was cancelled"
    assert len(fake.deleted) == 1 and not fake.exists


def test_the_early_deletion_does_not_wait_for_a_request_the_flow_is_making():
    # The flow is inside a slow request (a blocker check against a busy API server) when the signal comes.
    signalled: list[float] = []

    def slow_request() -> None:
        if not signalled:
            signalled.append(time.monotonic())
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(3)

    fake = FakeBackend([JobStatus(Phase.PENDING)], idle=True, hooks={"blockers": slow_request})
    with pytest.raises(CancelledError):
        entry_point(fake, LaunchOptions(logs="none", blocker_check_interval=0))
    assert fake.requested, "no early deletion"
    assert fake.requested[0][0] - signalled[0] < 1.0, fake.requested[0][0] - signalled[0]  # not the 3 s the request took
    assert len(fake.deleted) == 1


def test_no_early_deletion_when_the_job_ends_without_a_stop():
    fake = FakeBackend([JobStatus(Phase.RUNNING), JobStatus(Phase.SUCCEEDED)])
    with stopping() as stop:
        outcome = Launcher(fake, LaunchOptions(logs="none"), out=io.StringIO(), stop=stop).run(prepare(fake, INPUTS, stop=stop))
    assert outcome.succeeded
    time.sleep(0.2)
    assert fake.requested == [] and fake.deleted == []


def test_a_time_limit_sends_the_deletion_once_then_says_so():
    fake = FakeBackend([JobStatus(Phase.PENDING), 5.0], idle=True)
    out = io.StringIO()
    with pytest.raises(Exception, match="did not start within"):
        Launcher(fake, LaunchOptions(logs="none", start_timeout=1), out=out, clock=fake.clock).run(prepare(fake, INPUTS))
    assert len(fake.requested) == 1 and len(fake.deleted) == 1
    assert "TimeLimitError: deleting TrainJob" in out.getvalue()


def test_the_python_api_without_a_token_cancels_like_the_entry_points():
    # prepare + Launcher, as a user's script calls them: no stopping() of the script's own.
    before = signal.getsignal(signal.SIGTERM)
    fake = FakeBackend([JobStatus(Phase.RUNNING)], idle=True, hooks={"watch": lambda: signal_in(0.2)})
    out = io.StringIO()
    with pytest.raises(CancelledError):
        Launcher(fake, LaunchOptions(logs="none"), out=out).run(prepare(fake, INPUTS))
    assert len(fake.requested) == 1 and len(fake.deleted) == 1 and not fake.exists
    assert signal.getsignal(signal.SIGTERM) == before  # put back once the run ended


def test_sigint_from_the_python_api_is_a_cancel_not_a_keyboard_interrupt_that_leaks():
    fake = FakeBackend([JobStatus(Phase.RUNNING)], idle=True, hooks={"watch": lambda: signal_in(0.2, signal.SIGINT)})
    with pytest.raises(CancelledError, match="received SIGINT"):
        Launcher(fake, LaunchOptions(logs="none"), out=io.StringIO()).run(prepare(fake, INPUTS))
    assert len(fake.deleted) == 1 and not fake.exists


def test_a_guarded_stream_points_a_closed_pipe_at_dev_null_and_asks_the_flow_to_stop():
    read, write = os.pipe()
    os.close(read)
    stream = os.fdopen(write, "w", buffering=1)
    stop = Stop()
    guarded = Guarded(stream, stop)
    try:
        assert guarded.write("first line\n") == len("first line\n")  # met the closed pipe: dropped, no error
        guarded.write("x" * 100_000)
        guarded.flush()
        assert guarded.gone and stop.requested == READER_GONE
        os.fstat(stream.fileno())  # still open: now /dev/null
        assert os.path.samefile(f"/proc/self/fd/{stream.fileno()}", os.devnull)
    finally:
        stream.close()


def test_a_stop_signal_after_a_reader_went_away_says_why_with_its_own_exit_code():
    stop = Stop()
    stop.request(READER_GONE)
    stop.request(signal.SIGTERM)
    stop.request(READER_GONE)
    with pytest.raises(CancelledError) as info:
        stop.check()
    assert info.value.exit_code == EXIT_CANCELLED and "SIGTERM" in str(info.value)


def test_stopping_guards_stdout_and_stderr_only_inside(pipe):
    with piped(pipe):
        with stopping():
            assert isinstance(sys.stdout, Guarded) and isinstance(sys.stderr, Guarded)
        assert sys.stdout is pipe and sys.stderr is pipe
