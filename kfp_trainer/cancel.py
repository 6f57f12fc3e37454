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

Inside :func:`stopping` the step's own output cannot end it either. A KFP cancel signals the
whole process group of the step, and KFP's launcher, which reads the step's stdout through a
pipe, dies of the same signal: the step's first write after it meets a closed pipe. So
``sys.stdout`` and ``sys.stderr`` are guarded (:class:`Guarded`) while inside: a write whose
reader went away is dropped (the stream goes to ``/dev/null`` from then on) and counts as a stop
request of its own (:data:`READER_GONE`), so the flow deletes what it made instead of dying on the
pipe -- whether that write came before the signal was seen, after it, or with no signal at all
(a launch nobody follows any more is cancelled, never left running unseen).

Before :func:`stopping` a stop signal keeps its default action (the process ends): harmless
as long as nothing was created, which is why the entry points make the token before anything is
created. A token nobody made with :func:`stopping` (``Stop()``, the default of everything that
takes one) is set only by :meth:`Stop.request`.

Example:
    >>> with stopping() as stop:                         # doctest: +SKIP
    ...     job = prepare(backend, inputs, stop=stop)
    ...     Launcher(backend, stop=stop).run(job)
"""

from __future__ import annotations

import contextlib
import errno
import os
import signal
import sys
import threading
import time
from collections.abc import Callable, Iterator
from typing import Any, TextIO

from .errors import EXIT_READER_GONE, CancelledError

SIGNALS = (signal.SIGTERM, signal.SIGINT)
READER_GONE = int(getattr(signal, "SIGPIPE", 13))  # the stop request a closed stdout or stderr makes
TICK = 0.1  # seconds: the longest the main flow waits between two looks at the token


def cancelled(signum: int) -> CancelledError:
    """The error a stop request becomes: exit code 130, or 141 when the reader of the output went away.

    Example:
        >>> str(cancelled(signal.SIGTERM))
        'received SIGTERM: the run was cancelled'
        >>> error = cancelled(READER_GONE)
        >>> str(error), error.exit_code
        ('the reader of the output went away: the run was cancelled', 141)
    """
    if signum == READER_GONE:
        error = CancelledError("the reader of the output went away: the run was cancelled")
        error.exit_code = EXIT_READER_GONE
        return error
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
        self._wakers: dict[int, threading.Event] = {}

    def request(self, signum: int = signal.SIGTERM) -> None:
        """Ask the flow to stop; shut down the streams registered with :meth:`closing`.

        The first request counts, except that a stop signal takes the place of a reader that
        went away (:data:`READER_GONE`): in a KFP cancel both come at once, in either order.
        The first request also wakes the threads waiting in :meth:`waking`.

        It runs as a signal handler on the main thread between two bytecodes, maybe inside a
        lock's owner: it takes no lock of the interrupted code (a waker is an Event of its own,
        set once: a second signal inside that ``set`` finds the token set and leaves it), and
        each closer shuts a socket down, which takes none either.
        """
        first = self.signum is None
        if first or (self.signum == READER_GONE and signum != READER_GONE):
            self.signum = signum
        if first:
            for event in list(self._wakers.values()):
                event.set()
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
    def waking(self, event: threading.Event) -> Iterator[None]:
        """Inside, the first stop request sets ``event`` (at once if one came already).

        For a thread that must act the moment a stop is requested, whatever the main thread is
        doing then: the launcher's early deletion (:class:`kfp_trainer.launcher.Launcher`).
        """
        key = id(event)
        self._wakers[key] = event
        try:
            if self.signum is not None:
                event.set()
            yield
        finally:
            self._wakers.pop(key, None)

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


def _reader_gone(error: BaseException) -> bool:
    return isinstance(error, BrokenPipeError) or (isinstance(error, OSError) and error.errno in (errno.EPIPE, errno.ECONNRESET))


def to_devnull(stream: Any) -> None:
    """Point ``stream``'s file descriptor at ``/dev/null``; nothing for a stream with no file (a test's capture).

    What is buffered, and every later write, then goes nowhere and succeeds (at the interpreter's exit too).
    """
    try:
        devnull = os.open(os.devnull, os.O_WRONLY)
        try:
            os.dup2(devnull, stream.fileno())
        finally:
            os.close(devnull)
    except (OSError, ValueError, AttributeError):
        pass


class Guarded:
    r"""A text stream whose writes never fail for a reader that went away (see the module docstring).

    The first write or flush that meets a closed pipe points the stream's file descriptor at
    ``/dev/null`` (what is buffered, and every later write, goes there: no write fails again,
    at exit neither) and asks ``stop`` to stop (:data:`READER_GONE`). Everything else is the
    stream's own.

    Example:
        >>> import io
        >>> class Closed(io.StringIO):
        ...     def write(self, text): raise BrokenPipeError(32, "Broken pipe")
        >>> stop = Stop()
        >>> out = Guarded(Closed(), stop)
        >>> out.write("line\n"), out.gone, stop.requested == READER_GONE
        (5, True, True)
    """

    def __init__(self, stream: TextIO, stop: Stop) -> None:
        self._stream = stream
        self._stop = stop
        self.gone = False

    def _lost(self) -> None:
        self.gone = True
        to_devnull(self._stream)  # not a real file (a test's capture): its errors are dropped here
        self._stop.request(READER_GONE)

    def write(self, text: str) -> int:
        """Write ``text``; when the reader went away, drop it (and ask the flow to stop)."""
        if not self.gone:
            try:
                return self._stream.write(text)
            except OSError as e:
                if not _reader_gone(e):
                    raise
                self._lost()
        try:
            return self._stream.write(text)
        except OSError:
            return len(text)

    def flush(self) -> None:
        """Flush; a reader that went away is handled as in :meth:`write`."""
        try:
            self._stream.flush()
        except OSError as e:
            if not _reader_gone(e):
                raise
            if not self.gone:
                self._lost()
            with contextlib.suppress(OSError):
                self._stream.flush()

    def __getattr__(self, name: str) -> Any:
        return getattr(self._stream, name)


@contextlib.contextmanager
def _guarded_output(stop: Stop) -> Iterator[None]:
    """``sys.stdout`` and ``sys.stderr`` guarded (:class:`Guarded`) while inside."""
    before = sys.stdout, sys.stderr
    sys.stdout = Guarded(before[0], stop)
    sys.stderr = Guarded(before[1], stop)
    try:
        yield
    finally:
        sys.stdout, sys.stderr = before


@contextlib.contextmanager
def stopping() -> Iterator[Stop]:
    """A new :class:`Stop` that SIGTERM and SIGINT set while inside; the handlers before it restored on leaving.

    Inside, ``sys.stdout`` and ``sys.stderr`` are :class:`Guarded`: a reader that went away
    stops the flow instead of ending the process (see the module docstring).

    Leaving normally after a stop request raises :class:`CancelledError`: a signal that came while
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
        with _guarded_output(stop):
            yield stop
        stop.check()
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
