"""A raised cancel that something swallows is raised again until the code that handles it says so.

Python drops an exception raised inside a weakref callback or a finalizer ("Exception ignored
in ..."), and libraries catch ``Exception`` (logging handlers do): a SIGTERM landing there
must still end the run.
"""

from __future__ import annotations

import io
import logging
import os
import signal
import sys
import time
import weakref

import pytest

from kfp_trainer import cancel
from kfp_trainer.errors import CancelledError
from kfp_trainer.launcher import Launcher, LaunchOptions
from tests.unit.test_launcher_cancel import INPUTS, Backend


def sigterm() -> None:
    os.kill(os.getpid(), signal.SIGTERM)
    for _ in range(10_000):  # the handler runs at one of these bytecodes, still inside the caller
        pass


def blocked(seconds: float = 10.0) -> float:
    """Sleep (a blocking call, as a socket read) until a cancel ends it; how long that took."""
    began = time.monotonic()
    with pytest.raises(CancelledError, match="received SIGTERM"):
        time.sleep(seconds)
    return time.monotonic() - began


@pytest.fixture
def unraisable(monkeypatch):
    seen: list[BaseException | None] = []
    monkeypatch.setattr(sys, "unraisablehook", lambda hook: seen.append(hook.exc_value))
    return seen


def test_a_cancel_raised_inside_a_weakref_callback_is_raised_again(unraisable):
    class Thing:
        pass

    with cancel.handling():
        thing = Thing()
        ref = weakref.ref(thing, lambda _ref: sigterm())
        del thing  # the last reference: the callback runs now; the cancel raised in it is dropped by Python
        assert blocked() < cancel.REDELIVER_AFTER + 2
        assert ref() is None
        # It was really lost (a redelivery landing in a finalizer the collector runs is lost again, and sent again).
        assert unraisable and {type(e) for e in unraisable} == {CancelledError}


def test_a_cancel_a_library_catches_is_raised_again():
    with cancel.handling():
        try:
            sigterm()
        except Exception:  # as a library retrying on any error
            pass
        assert blocked() < cancel.REDELIVER_AFTER + 2


def test_a_cancel_lost_in_a_logging_handler_is_raised_again(monkeypatch):
    class Slow(logging.Handler):
        def emit(self, record):
            try:
                sigterm()
            except Exception:
                self.handleError(record)  # what logging.Handler subclasses do

    monkeypatch.setattr(logging, "raiseExceptions", False)
    log = logging.getLogger("kfp-trainer-test-lost-cancel")
    handler = Slow()
    log.addHandler(handler)
    try:
        with cancel.handling():
            log.warning("a line")
            assert blocked() < cancel.REDELIVER_AFTER + 2
    finally:
        log.removeHandler(handler)


def test_an_acknowledged_cancel_is_not_sent_again():
    with cancel.handling():
        with pytest.raises(CancelledError):
            sigterm()
        cancel.acknowledge()
        time.sleep(cancel.REDELIVER_AFTER * 4)  # no second CancelledError
    assert signal.getsignal(signal.SIGTERM) is not cancel._latch.handler


def test_a_cancel_that_leaves_handling_is_acknowledged_and_handlers_are_restored():
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(CancelledError):
        with cancel.handling():
            sigterm()
    time.sleep(cancel.REDELIVER_AFTER * 3)  # a redelivery now would hit the default handler and end pytest
    assert signal.getsignal(signal.SIGTERM) == before


def test_a_lost_cancel_is_not_followed_by_a_create(unraisable):
    with cancel.handling():
        try:
            sigterm()
        except Exception:
            pass
        created = []
        with pytest.raises(CancelledError):
            with cancel.deferred():  # as the create request
                created.append("job")
        assert created == []
        cancel.acknowledge()


def test_a_cancel_lost_while_following_still_deletes_the_job():
    backend = Backend()

    def watch(ref):
        while True:
            try:
                sigterm()  # the first lands in a retry loop that swallows it
            except Exception:
                pass
            while True:
                time.sleep(0.05)
                yield None

    backend.watch = watch  # type: ignore[method-assign]
    launcher = Launcher(backend, LaunchOptions(blocker_check_interval=0, logs="none"), out=io.StringIO())
    began = time.monotonic()
    with pytest.raises(CancelledError):
        launcher.run(INPUTS)
    assert len(backend.deleted) == 1 and not backend.exists
    assert time.monotonic() - began < cancel.REDELIVER_AFTER + 3


def test_a_cancel_on_its_way_out_is_not_raised_again_inside_the_cleanup_it_passes():
    cleaned = []
    with cancel.handling():
        with pytest.raises(CancelledError):
            try:
                sigterm()
            finally:
                time.sleep(cancel.REDELIVER_AFTER * 3)  # a slow cleanup: redeliveries arrive here
                sigterm()  # and a second signal from outside
                cleaned.append(True)
    assert cleaned == [True]


def test_a_signal_recorded_during_a_cancels_cleanup_does_not_cut_the_rest_of_it():
    said = []
    with cancel.handling():
        with pytest.raises(CancelledError):
            try:
                sigterm()
            except CancelledError:
                cancel.acknowledge()
                with cancel.shielded():  # the deletion
                    sigterm()
                said.append("deleted")  # what the cleanup says after the deletion
                raise
    assert said == ["deleted"]
