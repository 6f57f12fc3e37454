"""The trainer's log relayed to the step's log: each line written, parsed for metrics, flushed in bursts.

Example:
    >>> import io
    >>> out = io.StringIO()
    >>> printer = Printer(out, MetricSeries(), prefix=True, on_first=lambda: None)
    >>> printer(LogLine("node-1", "step 1"))
    >>> printer.close()
    >>> out.getvalue().splitlines()
    ['[node-1] step 1']
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import TextIO

from .backends.base import LogLine
from .metrics import MetricSeries

FLUSH_DELAY = 0.02  # seconds a relayed line may wait in the buffer for others to join it


class Printer:
    """Thread-safe :data:`~kfp_trainer.backends.base.LogSink`: prints trainer lines (prefixed when several nodes), keeps metrics.

    Lines are written at once and flushed by a thread of their own at most ``FLUSH_DELAY``
    seconds later: one write to the pipe per burst, not per line, while a long log is
    relayed; ``close()`` flushes the rest at once.
    """

    def __init__(self, out: TextIO, metrics: MetricSeries, prefix: bool, on_first: Callable[[], None]) -> None:
        self.out = out
        self.metrics = metrics
        self.prefix = prefix
        self.on_first = on_first
        self.count = 0
        self.lock = threading.Lock()
        self._unflushed = threading.Event()
        self._closed = False
        self._flusher: threading.Thread | None = None

    def __call__(self, line: LogLine) -> None:
        """Write the ``line.count`` lines at once (each prefixed with its node when asked); keep them for the metric parser."""
        text, source = line.text, line.source
        with self.lock:
            if self.count == 0:
                self.on_first()
                self._flusher = threading.Thread(target=self._flush_soon, name="trainer-logs-flush", daemon=True)
                self._flusher.start()
            self.count += line.count
            if self.prefix:
                self.out.write(f"[{source}] " + text.replace("\n", f"\n[{source}] ") + "\n")
            else:
                self.out.write(text + "\n")
            if self._closed:  # a follower still draining after close(): no flushing thread any more
                self.out.flush()
            self.metrics.feed_text(text)
        if not self._unflushed.is_set():  # checked after the write: a flush that clears it comes later
            self._unflushed.set()

    def _flush_soon(self) -> None:
        while True:
            self._unflushed.wait()
            if self._closed:
                return
            time.sleep(FLUSH_DELAY)  # let a burst gather: one flush for all of it
            self._unflushed.clear()
            with self.lock:
                if self._closed:  # close() flushed
                    return
                self.out.flush()

    def close(self) -> None:
        """Flush what was printed and stop the flushing thread."""
        with self.lock:
            self._closed = True
            self.out.flush()
        self._unflushed.set()
        if self._flusher is not None:
            self._flusher.join(1.0)
