"""Stop signals (SIGTERM, SIGINT) as a process-wide request that the main flow acts on.

A KFP cancel reaches the launcher as SIGTERM; a person at a terminal sends SIGINT. The
handler raises nothing: it only records the first signal. The main flow looks at the record
where it waits -- the status watch's heartbeat, backoff sleeps, before and right after the
create request, between its steps -- with :func:`check`, which raises
:class:`~kfp_trainer.errors.CancelledError` there. So a request in flight always gets its
answer (a create that went through is known, and deleted), a deletion always runs to its end
(nothing on its way checks), and a second signal changes nothing.

A signal whose handler does not raise does not end a blocking read (PEP 475 retries it). So
the main thread never blocks long where a cancel should act: the status watch and log streams
run in threads, the main thread waits on them with a short timeout (:data:`TICK`), and a long
read it makes itself that may be cut short registers its stream with :func:`closing`, which the
handler shuts down.

Before :func:`install` a stop signal keeps its default action (the process ends): harmless
as long as nothing was created, which is why the entry points install first thing.

Example:
    >>> install()                                 # doctest: +SKIP
    >>> created = create_trainjob()               # doctest: +SKIP
    >>> check()                                   # doctest: +SKIP
    Traceback (most recent call last):
    kfp_trainer.errors.CancelledError: received SIGTERM: the run was cancelled
"""

from __future__ import annotations

import contextlib
import functools
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TypeVar

from .errors import CancelledError

F = TypeVar("F", bound=Callable[..., Any])
SIGNALS = (signal.SIGTERM, signal.SIGINT)
TICK = 0.1  # seconds: the longest the main flow waits between two looks at the record


class _Record:
    # The handler runs on the main thread between two bytecodes, maybe inside a lock's owner:
    # it takes no lock. It stores the signal number and calls the closers registered with
    # closing() -- each shuts a socket down, which takes no Python lock either.
    def __init__(self) -> None:
        self.installed = False
        self.signum: int | None = None
        self.previous: dict[int, Any] = {}
        self.closers: dict[int, Callable[[], None]] = {}

    def handler(self, signum: int, frame: Any) -> None:
        if self.signum is None:
            self.signum = signum
        for close in list(self.closers.values()):
            try:
                close()
            except Exception:  # already closed: the read it was for has ended anyway
                pass


_record = _Record()


def cancelled(signum: int) -> CancelledError:
    """The error a stop signal becomes.

    Example:
        >>> str(cancelled(signal.SIGTERM))
        'received SIGTERM: the run was cancelled'
    """
    return CancelledError(f"received {signal.Signals(signum).name}: the run was cancelled")


def installed() -> bool:
    """Whether the handlers are installed (and still ours)."""
    if _record.installed and signal.getsignal(signal.SIGTERM) != _record.handler:  # someone replaced ours since
        _record.installed = False
    return _record.installed


def install() -> bool:
    """Record SIGTERM and SIGINT from now on (idempotent; main thread only).

    Returns:
        True when this call installed the handlers; False when they were already installed
        or this is not the main thread.
    """
    if installed() or threading.current_thread() is not threading.main_thread():
        return False
    _record.previous = {s: signal.signal(s, _record.handler) for s in SIGNALS}
    _record.installed, _record.signum = True, None
    return True


def uninstall() -> None:
    """Restore the handlers that were there before :func:`install`; forget a recorded signal."""
    if installed() and threading.current_thread() is threading.main_thread():
        for s, h in _record.previous.items():
            signal.signal(s, h)
        _record.installed, _record.signum = False, None


def requested() -> int | None:
    """The stop signal received since :func:`install`, or None."""
    return _record.signum if installed() else None


def check() -> None:
    """Raise :class:`CancelledError` when a stop signal was received; else nothing.

    Call it where stopping is safe: before a request that creates something, right after
    one returns, at each turn of a wait. Never on the way of a deletion.
    """
    signum = requested()
    if signum is not None:
        raise cancelled(signum)


def sleep(seconds: float) -> None:
    """Sleep, looking at the record every :data:`TICK` seconds; raise :class:`CancelledError` on a stop signal."""
    deadline = time.monotonic() + seconds
    while True:
        check()
        left = deadline - time.monotonic()
        if left <= 0:
            return
        time.sleep(min(TICK, left))


def join(thread: threading.Thread, timeout: float) -> None:
    """Wait up to ``timeout`` seconds for ``thread``; return early on a stop signal (raising nothing)."""
    deadline = time.monotonic() + timeout
    while thread.is_alive() and requested() is None:
        left = deadline - time.monotonic()
        if left <= 0:
            return
        thread.join(min(TICK, left))


@contextlib.contextmanager
def closing(close: Callable[[], None]) -> Iterator[None]:
    """Inside, a stop signal also calls ``close`` (at once if one came already).

    For a blocking read the main thread makes that may be cut short (a watch waiting for an
    earlier try's job to go): ``close`` shuts its stream down, so the read ends at once instead
    of when the server ends the stream. Measured on the API server: a watch read went on for
    7.5 s after the signal without it, 0.00 s with it.
    """
    key = id(close)
    _record.closers[key] = close
    try:
        if requested() is not None:
            close()
        yield
    finally:
        _record.closers.pop(key, None)


@contextlib.contextmanager
def handling() -> Iterator[None]:
    """Stop signals recorded inside; handlers restored on leaving if this installed them."""
    mine = install()
    try:
        yield
    finally:
        if mine:
            uninstall()


def entry_point(fn: F) -> F:
    """Decorate a step's function: stop signals are recorded from its first instruction on.

    The handlers stay installed after it returns. A signal that came while it finished its
    work still ends the step cancelled (:class:`CancelledError`), as it would have a moment earlier.
    """

    @functools.wraps(fn)
    def run(*args: Any, **kwargs: Any) -> Any:
        install()
        result = fn(*args, **kwargs)
        check()
        return result

    return run  # type: ignore[return-value]
