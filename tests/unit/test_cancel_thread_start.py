"""A stop signal while a thread is being started waits until the start is done.

``threading.Thread.start`` puts the thread in ``threading._limbo``, starts it, and on an
exception removes it again -- but the new thread removes itself too, as it begins. A cancel
raised in between made the second removal fail: ``KeyError`` from ``del _limbo[self]``, a
traceback, in ``start`` or in the new thread. The hook below delivers the signal exactly
there (after the new thread took itself out), every time.
"""

from __future__ import annotations

import io
import signal
import sys
import threading
import time

import pytest

from kfp_trainer import cancel
from kfp_trainer.errors import CancelledError
from kfp_trainer.launcher import Launcher, LaunchOptions
from tests.unit.test_cancel_redelivery import blocked
from tests.unit.test_launcher_cancel import INPUTS, Backend


def signal_inside_next_thread_start(monkeypatch) -> list[int]:
    """From now on, the next thread started gets SIGTERM delivered inside ``Thread.start``: after
    the new thread took itself out of ``threading._limbo``, before ``start`` returns."""
    real = threading._start_new_thread  # type: ignore[attr-defined]
    fired: list[int] = []

    def start_then_signal(function, args, *rest):
        ident = real(function, args, *rest)
        if fired:
            return ident
        fired.append(ident)
        thread = function.__self__  # the bound Thread._bootstrap
        deadline = time.monotonic() + 5
        while thread in threading._limbo and time.monotonic() < deadline:  # type: ignore[attr-defined]
            time.sleep(0.001)
        signal.raise_signal(signal.SIGTERM)  # its handler runs here, still inside Thread.start
        return ident

    monkeypatch.setattr(threading, "_start_new_thread", start_then_signal)
    return fired


@pytest.fixture(autouse=True)
def fresh_latch(monkeypatch):
    """A stop-signal latch as a new process has it, whatever earlier tests in this process left
    (a watchdog, redelivery counts, handlers): these tests count on the one signal they send."""
    old = cancel._latch
    old.stop.set()
    if old.watchdog is not None:
        old.watchdog.join(5)
    monkeypatch.setattr(cancel, "_latch", cancel._Latch())
    previous = {signal.SIGTERM: signal.signal(signal.SIGTERM, signal.SIG_DFL),
                signal.SIGINT: signal.signal(signal.SIGINT, signal.default_int_handler)}  # fmt: skip
    yield
    for signum, handler in previous.items():
        signal.signal(signum, handler)


@pytest.fixture
def unraisable(monkeypatch):
    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda hook: seen.append(hook.exc_value))
    monkeypatch.setattr(threading, "excepthook", lambda hook: seen.append(hook.exc_value))
    return seen


def test_a_signal_inside_thread_start_is_raised_once_the_thread_runs(monkeypatch, unraisable):
    release = threading.Event()
    with cancel.handling():  # its watchdog thread starts before the hook is in place
        fired = signal_inside_next_thread_start(monkeypatch)
        thread = threading.Thread(target=release.wait, name="worker", daemon=True)
        thread.start()  # no KeyError: the start completes
        assert fired and thread.is_alive() and thread in threading.enumerate()
        assert blocked() < cancel.REDELIVER_AFTER + 2  # and the cancel comes right after it
    release.set()
    thread.join(5)
    assert not thread.is_alive()
    assert unraisable == []


def test_a_signal_while_the_launcher_starts_its_log_thread_deletes_the_job_without_a_traceback(monkeypatch, unraisable, capsys):
    backend = Backend(script=[])
    out = io.StringIO()
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=0, logs="0"), out=out)
    with pytest.raises(CancelledError):
        with cancel.handling():
            fired = signal_inside_next_thread_start(monkeypatch)  # the first thread the launcher starts: its log follower
            launcher.run(INPUTS)
    assert fired, "no thread was started"
    assert len(backend.deleted) == 1 and not backend.exists, out.getvalue()
    assert f"CancelledError: deleting TrainJob {backend.deleted[0]}" in out.getvalue()
    assert unraisable == []
    assert "Traceback" not in capsys.readouterr().err
