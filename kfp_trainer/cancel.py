"""Stop signals (SIGTERM, SIGINT) as a token the entry point makes and passes down.

A KFP cancel reaches the launcher as SIGTERM; a person at a terminal sends SIGINT. The entry
points (``kfp-trainer launch``, the launcher components' bodies) make one :class:`Stop` with
:func:`stopping` and hand it to what they call: :func:`~kfp_trainer.prepare.prepare`, the
:class:`~kfp_trainer.launcher.Launcher`, the backend's submit. The signal handler raises
nothing: it only sets the token. The flow looks at the token where it waits -- the status
watch's heartbeat, backoff sleeps, before and right after the create request, between its
steps -- with :meth:`Stop.check`, which raises :class:`~kfp_trainer.errors.CancelledError`
there. So a request in flight always gets its answer (a create that went through is known, and
deleted), a deletion always runs to its end (nothing on its way checks), and a second signal
changes nothing.

A signal whose handler does not raise does not end a blocking read (PEP 475 retries it). So
the main thread never blocks long where a cancel should act: the status watch and log streams
run in threads, the main thread waits on them with a short timeout (:data:`TICK`), and a long
read it makes itself that may be cut short registers its stream with :meth:`Stop.closing`,
which the handler shuts down.

Before :func:`stopping` a stop signal keeps its default action (the process ends): harmless
as long as nothing was created, which is why the entry points make the token first thing. A
token nobody made with :func:`stopping` (``Stop()``, the default of everything that takes one)
is set only by :meth:`Stop.request`.

Example:
    >>> with stopping() as stop:                         # doctest: +SKIP
    ...     job = prepare(backend, inputs, stop=stop)
    ...     Launcher(backend, stop=stop).run(job)
"""

from __future__ import annotations

import contextlib
import signal
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any

from .errors import CancelledError

SIGNALS = (signal.SIGTERM, signal.SIGINT)
TICK = 0.1  # seconds: the longest the main flow waits between two looks at the token


def cancelled(signum: int) -> CancelledError:
    """The error a stop signal becomes.

    Example:
        >>> str(cancelled(signal.SIGTERM))
        'received SIGTERM: the run was cancelled'
    """
    return CancelledError(f"received {signal.Signals(signum).name}: the run was cancelled")


class Stop:
    """One run's stop request: set once by a stop signal (or :meth:`request`), read by the flow.

    Example:
        >>> stop = Stop()
        >>> stop.check()            # nothing requested: returns
        >>> stop.request(signal.SIGINT)
        >>> stop.check()
        Traceback (most recent call last):
        ...
        kfp_trainer.errors.CancelledError: received SIGINT: the run was cancelled
    """

    def __init__(self) -> None:
        self.signum: int | None = None
        self._closers: dict[int, Callable[[], None]] = {}

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask the flow to stop (the first request counts); shut down the streams registered with :meth:`closing`.

        It runs as a signal handler on the main thread between two bytecodes, maybe inside a
        lock's owner: it takes no lock, and each closer shuts a socket down, which takes none either.
        """
        if self.signum is None:
            self.signum = signum
        for close in list(self._closers.values()):
            try:
                close()
            except Exception:  # already closed: the read it was for has ended anyway
                pass

    def _handle(self, signum: int, frame: Any) -> None:
        self.request(signum)

    @property
    def requested(self) -> int | None:
        """The stop signal received, or None."""
        return self.signum

    def check(self) -> None:
        """Raise :class:`CancelledError` when a stop was requested; else nothing.

        Call it where stopping is safe: before a request that creates something, right after
        one returns, at each turn of a wait. Never on the way of a deletion.
        """
        if self.signum is not None:
            raise cancelled(self.signum)

    def sleep(self, seconds: float) -> None:
        """Sleep, looking at the token every :data:`TICK` seconds; raise :class:`CancelledError` on a stop."""
        deadline = time.monotonic() + seconds
        while True:
            self.check()
            left = deadline - time.monotonic()
            if left <= 0:
                return
            time.sleep(min(TICK, left))

    def join(self, thread: threading.Thread, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for ``thread``; return early on a stop (raising nothing)."""
        deadline = time.monotonic() + timeout
        while thread.is_alive() and self.signum is None:
            left = deadline - time.monotonic()
            if left <= 0:
                return
            thread.join(min(TICK, left))

    @contextlib.contextmanager
    def closing(self, close: Callable[[], None]) -> Iterator[None]:
        """Inside, a stop request also calls ``close`` (at once if one came already).

        For a blocking read the main thread makes that may be cut short (a watch waiting for an
        earlier try's job to go): ``close`` shuts its stream down, so the read ends at once instead
        of when the server ends the stream. Measured on the API server: a watch read went on for
        7.5 s after the signal without it, 0.00 s with it.
        """
        key = id(close)
        self._closers[key] = close
        try:
            if self.signum is not None:
                close()
            yield
        finally:
            self._closers.pop(key, None)


def _current() -> Stop | None:
    """The token whose handler is installed now (an enclosing :func:`stopping`), or None."""
    owner = getattr(signal.getsignal(signal.SIGTERM), "__self__", None)
    return owner if isinstance(owner, Stop) else None


@contextlib.contextmanager
def stopping() -> Iterator[Stop]:
    """A new :class:`Stop` that SIGTERM and SIGINT set while inside; the handlers before it restored on leaving.

    Leaving normally after a stop signal raises :class:`CancelledError`: a signal that came while
    the work finished still ends it cancelled, as it would have a moment earlier. Inside another
    ``stopping`` block it yields that block's token; outside the main thread, a token no signal sets
    (signals go to the main thread).
    """
    outer = _current()
    if outer is not None:
        yield outer
        return
    stop = Stop()
    previous: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        previous = {s: signal.signal(s, stop._handle) for s in SIGNALS}
    try:
        yield stop
        stop.check()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
