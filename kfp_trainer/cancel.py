"""Stop signals (SIGTERM, SIGINT) as one process-wide latch with three modes.

A KFP cancel reaches the launcher as SIGTERM; a person at a terminal sends SIGINT. Where the
signal lands decides what is safe to do, so code declares the mode of each region:

* ``cancellable()`` -- the signal raises :class:`~kfp_trainer.errors.CancelledError` at once.
  The mode everywhere once :func:`install` ran, unless a region says otherwise.
* ``deferred()`` -- the signal is only recorded; leaving the region raises it if the region
  around is cancellable. For a request whose effect must be known (creating the TrainJob):
  the request finishes, then the cancel deletes what it made.
* ``shielded()`` -- the same rule, for deletions: a second signal cannot abort one; it is
  raised once the deletion is done.

Before :func:`install` a stop signal keeps its default action (the process ends): harmless
as long as nothing was created, which is why the entry points install first thing.

Only the main thread receives signals; in other threads the modes do nothing.

A raised cancel can be lost: Python drops an exception raised inside a weakref callback, a
finalizer or a logging handler ("Exception ignored in ..."), and a library may catch it as an
``Exception``. So a raised cancel stays on record until the code that handles it calls
:func:`acknowledge` (the launcher does, as it deletes the job; :func:`handling` does, when one
leaves it); until then a watchdog thread sends the signal to the main thread again every
:data:`REDELIVER_AFTER` seconds, which also wakes a blocking read. A signal that arrives while a
cancel is on its way out (in a ``finally`` or an ``except`` it passes through) raises nothing:
the cleanup on its way runs to its end. Nor does one that arrives while a thread is being
started (``threading.Thread.start`` cannot be interrupted safely): it is put on record and
sent again by the watchdog at once, to be raised right after the start.

Example:
    >>> install()                                 # doctest: +SKIP
    >>> with deferred():                          # doctest: +SKIP
    ...     created = create_trainjob()           # a SIGTERM here waits for the answer
"""

from __future__ import annotations

import contextlib
import functools
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .errors import CancelledError

F = TypeVar("F", bound=Callable[..., Any])
SIGNALS = (signal.SIGTERM, signal.SIGINT)
RAISE, RECORD = "raise", "record"
REDELIVER_AFTER = 0.5  # seconds a raised cancel may stay unacknowledged before it is sent again
_POLL = 0.1


class _Latch:
    # The handler runs on the main thread between any two bytecodes, even inside a lock's owner,
    # so it takes no lock: it only reads and writes attributes. The watchdog thread only sends.
    def __init__(self) -> None:
        self.installed = False
        self.mode = RAISE
        self.pending: int | None = None  # recorded inside a RECORD region, raised on leaving it
        self.fired: int | None = None  # raised and not yet acknowledged
        self.fired_at = 0.0
        self.sent = 0  # redeliveries sent (watchdog thread only)
        self.received = 0  # signals the handler took as redeliveries (main thread only)
        self.previous: dict[int, Any] = {}
        self.stop = threading.Event()
        self.watchdog: threading.Thread | None = None

    def handler(self, signum: int, frame: Any) -> None:
        if self.sent > self.received:  # our redelivery (or a signal in its place)
            self.received += 1
            if self.fired is None:  # acknowledged since it was sent
                return
            signum = self.fired
        if self.mode == RAISE:
            if isinstance(sys.exc_info()[1], CancelledError):  # one is on its way out (a finally, an except): let it go
                return
            if _starting_thread(frame):  # raised there, it breaks threading's books: the watchdog sends it again at once
                if self.fired is None:
                    self.fired = signum
                self.fired_at = time.monotonic() - REDELIVER_AFTER
                return
            raise self.deliver(signum)
        if self.pending is None:
            self.pending = signum

    def deliver(self, signum: int) -> CancelledError:
        if self.fired is None:
            self.fired, self.fired_at = signum, time.monotonic()
        return cancelled(self.fired)

    def redeliver(self, stop: threading.Event, main: int) -> None:
        while not stop.wait(_POLL):
            fired = self.fired
            if fired is None or time.monotonic() - self.fired_at < REDELIVER_AFTER:
                continue
            if signal.getsignal(fired) != self.handler:  # someone replaced ours: theirs may end the process
                return
            self.fired_at = time.monotonic()
            self.sent += 1
            signal.pthread_kill(main, fired)


_latch = _Latch()
_THREAD_START = threading.Thread.start.__code__


def _starting_thread(frame: Any) -> bool:
    """Whether ``frame`` runs inside ``threading.Thread.start``.

    An exception raised there after the new thread began makes ``start`` and the thread both
    remove it from ``threading._limbo``: ``KeyError``, a traceback, in one of them.
    """
    while frame is not None:
        if frame.f_code is _THREAD_START:
            return True
        frame = frame.f_back
    return False


def cancelled(signum: int) -> CancelledError:
    """The error a stop signal becomes.

    Example:
        >>> str(cancelled(signal.SIGTERM))
        'received SIGTERM: the run was cancelled'
    """
    return CancelledError(f"received {signal.Signals(signum).name}: the run was cancelled")


def _active() -> bool:
    if not _latch.installed or threading.current_thread() is not threading.main_thread():
        return False
    if signal.getsignal(signal.SIGTERM) != _latch.handler:  # someone replaced ours since
        _latch.installed = False
        return False
    return True


def install() -> bool:
    """Handle SIGTERM and SIGINT from now on (idempotent; main thread only).

    Returns:
        True when this call installed the handlers; False when they were already
        installed or this is not the main thread.
    """
    if _active() or threading.current_thread() is not threading.main_thread():
        return False
    _stop_watchdog()
    _latch.previous = {s: signal.signal(s, _latch.handler) for s in SIGNALS}
    _latch.installed, _latch.mode, _latch.pending, _latch.fired = True, RAISE, None, None
    _latch.stop = threading.Event()
    _latch.watchdog = threading.Thread(
        target=_latch.redeliver, args=(_latch.stop, threading.get_ident()), name="kfp-trainer-cancel", daemon=True
    )
    _latch.watchdog.start()
    return True


def _stop_watchdog() -> None:
    _latch.stop.set()
    if _latch.watchdog is not None:
        _latch.watchdog.join()
        _latch.watchdog = None


def uninstall() -> None:
    """Restore the handlers that were there before :func:`install`."""
    if _active():
        _latch.fired = None
        _stop_watchdog()
        # A redelivery still on its way must reach our handler (which drops it), not the default one.
        deadline = time.monotonic() + 1.0
        while _latch.sent > _latch.received and time.monotonic() < deadline:
            time.sleep(0.005)
        for s, h in _latch.previous.items():
            signal.signal(s, h)
        _latch.installed, _latch.mode, _latch.pending = False, RAISE, None


def acknowledge() -> None:
    """The cancel raised last has reached code that handles it: stop sending it again.

    Call it where a :class:`CancelledError` is caught and acted on (deleting the job, exiting).
    """
    _latch.fired = None


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """Stop signals handled inside; handlers restored on leaving if this installed them."""
    mine = install()
    try:
        yield
    except CancelledError:
        acknowledge()  # it got out: whoever called handles it
        raise
    finally:
        if mine:
            uninstall()


def entry_point(fn: F) -> F:
    """Decorate a step's function: stop signals are handled from its first instruction on.

    The handlers stay installed after it returns; a :class:`CancelledError` leaving it is
    acknowledged (the step ends with it).
    """

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        install()
        try:
            return fn(*args, **kwargs)
        except CancelledError:
            acknowledge()
            raise

    return run  # type: ignore[return-value]


def installed() -> bool:
    """Whether the handlers are installed (and this is the main thread)."""
    return _active()


@contextlib.contextmanager
def _mode(mode: str, *, refuse_cancelled: bool = False) -> Iterator[None]:
    if not _active():
        yield
        return
    outer = _latch.mode
    if refuse_cancelled and outer == RAISE and _latch.fired is not None:  # a lost cancel: do not start the work
        raise _latch.deliver(_latch.fired)
    _latch.mode = mode
    try:
        yield
    finally:
        _latch.mode = outer
        if outer == RAISE and _latch.pending is not None:
            signum, _latch.pending = _latch.pending, None
            if not isinstance(sys.exc_info()[1], CancelledError):  # else the cancel on its way out stands for this one
                raise _latch.deliver(signum)


def cancellable() -> contextlib.AbstractContextManager[None]:
    """A stop signal raises :class:`CancelledError` inside, at once."""
    return _mode(RAISE)


def deferred() -> contextlib.AbstractContextManager[None]:
    """A stop signal is recorded inside and raised on leaving (when the outside is cancellable).

    For a request whose effect must be known: the create finishes, then the cancel deletes.
    A cancel raised before and lost on the way (see the module notes) is raised on entering:
    the request is not made.
    """
    return _mode(RECORD, refuse_cancelled=True)


def shielded() -> contextlib.AbstractContextManager[None]:
    """A stop signal is recorded inside and raised only after it (a deletion must finish)."""
    return _mode(RECORD)
