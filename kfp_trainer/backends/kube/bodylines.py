r"""How a streamed answer becomes lines: the one place where the log relay's reading speed is made.

The client (:mod:`.client`) hands back a streamed body as bytes, as they arrive
(:meth:`Stream.chunks <kfp_trainer.backends.kube.client.Stream.chunks>`), and knows nothing
of lines. Here they are cut into lines, two ways:

* :func:`each_line`, in the caller's thread: a watch, one JSON event per line;
* :func:`batches`, for a followed log: a thread of its own reads the body and does nothing
  else, holding at most :data:`READ_AHEAD` bytes its caller has not taken (back-pressure); the
  caller gets the lines that arrived together, :data:`GATHER` seconds after the first of them,
  so what it does per batch (decode, write, flush, parse) is done once for many lines while a
  log comes fast, and a quiet log's line still arrives within milliseconds.

Example:
    >>> class Body:                       # what a Stream gives: chunks cut anywhere
    ...     def chunks(self):
    ...         yield from (b"step 1 lo", b"ss=0.5\nstep 2", b" loss=0.4\n\n")
    ...     def shutdown(self):
    ...         pass
    >>> list(each_line(Body()))
    [b'step 1 loss=0.5', b'step 2 loss=0.4']
    >>> [line for batch in batches(Body()) for line in batch]
    [b'step 1 loss=0.5', b'step 2 loss=0.4', b'']
"""

from __future__ import annotations

import threading
import time
from collections.abc import Generator, Iterator
from typing import Protocol

from .apierrors import TransportError

GATHER = 0.005  # seconds a followed log's piece waits for others to be handled with it (batches)
READ_AHEAD = 4 << 20  # bytes the reading thread holds for its caller at most (batches)


class Chunks(Protocol):
    """A body being read: its bytes as they arrive (:class:`~kfp_trainer.backends.kube.client.Stream`)."""

    def chunks(self) -> Iterator[bytes]:
        """The body's bytes, a piece at a time; raises TransportError when it breaks off."""
        ...

    def shutdown(self) -> None:
        """End a read in progress from another thread."""
        ...


def each_line(body: Chunks) -> Iterator[bytes]:
    """The non-empty lines of ``body``, as they arrive, read in this thread.

    Raises:
        TransportError: The connection broke (or was shut down) before the body ended.
    """
    buffer = b""
    for piece in body.chunks():
        parts, buffer = _complete(buffer, piece)
        yield from (line for line in parts if line.strip())
    if buffer.strip():
        yield buffer


def batches(body: Chunks, gather: float = 0.0, read_ahead: int = READ_AHEAD) -> Generator[list[bytes], None, None]:
    """The lines of ``body``, split at newlines only, blank ones kept: together, those completed since the last batch.

    A thread of its own reads the body piece by piece (an HTTP chunk at a time: an API server
    relaying a followed log sends each line as a chunk of its own) and does nothing else. A
    batch is handed on ``gather`` seconds after its first piece arrived, with every piece that
    arrived meanwhile or while the caller handled the last batch (:data:`GATHER`, for a
    followed log). A body the server has whole (a log read to its end) needs no wait. The
    thread holds at most ``read_ahead`` bytes not taken yet: beyond that it waits for the
    caller (a step's log that drains slowly slows the read down, as it would without the
    thread, instead of piling the log up in memory).

    Close the generator (or read it to its end) before the body's stream: that ends and joins
    the reading thread.

    Raises:
        TransportError: The connection broke (or was shut down) before the body ended.
    """
    reader = _Reader(body, read_ahead)
    buffer = b""
    try:
        while True:
            ended = reader.wait()  # read before the pieces are taken: no piece comes after the end
            if gather and not ended:
                time.sleep(gather)  # let the pieces that follow this one join it
                ended = reader.ended
            parts, buffer = _complete(buffer, b"".join(reader.take()))
            if parts:
                yield parts
            if ended and not reader.pieces:
                break
        if reader.failure is not None:
            raise reader.failure
    finally:
        reader.stop()  # at once when the read ended; when the caller stopped early, the read is ended first
    if buffer:
        yield [buffer]


def _complete(buffer: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """The lines ``data`` completes after ``buffer`` (the start of a line), and the start of the next line."""
    if b"\n" not in data:
        return [], buffer + data
    parts = (buffer + data if buffer else data).split(b"\n")
    return parts, parts.pop()


class _Reader:
    """The thread that reads a body for :func:`batches`: pieces appended as they arrive, at most ``limit`` bytes ahead."""

    def __init__(self, body: Chunks, limit: int) -> None:
        self.body = body
        self.limit = limit
        self.pieces: list[bytes] = []
        self.failure: TransportError | None = None
        self.ended = False
        self.taken = 0  # bytes taken by the caller (written by the caller only; the thread counts what it read)
        self._ready = threading.Event()
        self._room = threading.Event()
        self.thread = threading.Thread(target=self._read, name="stream-read", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        add, ready, room, limit, read = self.pieces.append, self._ready, self._room, self.limit, 0
        try:
            for chunk in self.body.chunks():
                add(chunk)
                read += len(chunk)
                if not ready.is_set():
                    ready.set()
                if read - self.taken > limit:
                    room.clear()
                    if read - self.taken > limit:  # checked again after the clear: a take before it is seen
                        room.wait()
        except TransportError as e:
            self.failure = e
        except BaseException as e:  # noqa: BLE001 -- handed to the caller's thread, never lost
            what = getattr(self.body, "what", "the body")
            self.failure = TransportError(f"{what}: the stream broke off: {type(e).__name__}: {e}")
            self.failure.__cause__ = e
        finally:
            self.ended = True
            ready.set()

    def wait(self) -> bool:
        """Wait for pieces (or the end); whether the read had ended then."""
        self._ready.wait()
        self._ready.clear()  # before the pieces are taken: a piece added after this sets it again
        return self.ended

    def take(self) -> list[bytes]:
        """The pieces that arrived and were not taken yet, in order."""
        pieces = self.pieces
        n = len(pieces)
        taken = pieces[:n]
        del pieces[:n]  # the thread only appends: what it adds meanwhile stays
        self.taken += sum(map(len, taken))
        self._room.set()
        return taken

    def stop(self) -> None:
        """Wait for the thread; end its read first (the body shut down) when it has not ended, also when it waits for room."""
        if not self.ended:
            self.body.shutdown()
            self._room.set()
        self.thread.join(5)
