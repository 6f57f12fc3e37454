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

Example:
    >>> install()                                 # doctest: +SKIP
    >>> with deferred():                          # doctest: +SKIP
    ...     created = create_trainjob()           # a SIGTERM here waits for the answer
"""

from __future__ import annotations

import contextlib
import signal
import threading
from collections.abc import Iterator
from typing import Any

from .errors import CancelledError

SIGNALS = (signal.SIGTERM, signal.SIGINT)
RAISE, RECORD = "raise", "record"


class _Latch:
    def __init__(self) -> None:
        self.installed = False
        self.mode = RAISE
        self.pending: int | None = None
        self.previous: dict[int, Any] = {}

    def handler(self, signum: int, _frame: Any) -> None:
        if self.mode == RAISE:
            raise cancelled(signum)
        if self.pending is None:
            self.pending = signum


_latch = _Latch()


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
    _latch.previous = {s: signal.signal(s, _latch.handler) for s in SIGNALS}
    _latch.installed, _latch.mode, _latch.pending = True, RAISE, None
    return True


def uninstall() -> None:
    """Restore the handlers that were there before :func:`install`."""
    if _active():
        for s, h in _latch.previous.items():
            signal.signal(s, h)
        _latch.installed, _latch.mode, _latch.pending = False, RAISE, None


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """Stop signals handled inside; handlers restored on leaving if this installed them."""
    mine = install()
    try:
        yield
    finally:
        if mine:
            uninstall()


def installed() -> bool:
    """Whether the handlers are installed (and this is the main thread)."""
    return _active()


@contextlib.contextmanager
def _mode(mode: str) -> Iterator[None]:
    if not _active():
        yield
        return
    outer = _latch.mode
    _latch.mode = mode
    try:
        yield
    finally:
        _latch.mode = outer
        if outer == RAISE and _latch.pending is not None:
            signum, _latch.pending = _latch.pending, None
            raise cancelled(signum)


def cancellable() -> contextlib.AbstractContextManager[None]:
    """A stop signal raises :class:`CancelledError` inside, at once."""
    return _mode(RAISE)


def deferred() -> contextlib.AbstractContextManager[None]:
    """A stop signal is recorded inside and raised on leaving (when the outside is cancellable).

    For a request whose effect must be known: the create finishes, then the cancel deletes.
    """
    return _mode(RECORD)


def shielded() -> contextlib.AbstractContextManager[None]:
    """A stop signal is recorded inside and raised only after it (a deletion must finish)."""
    return _mode(RECORD)
