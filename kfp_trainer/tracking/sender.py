"""MLflow writes off the caller's thread: in order, batched, bounded in memory, kept while the server does not answer.

A trainer logs a metrics line per step; a synchronous request per line would add the server's
answer time to every step (and, with DDP, every rank waits for rank 0). A :class:`Sender` takes
the writes of one run (metrics, tags, params, and any other call such as an upload or the final
status) and returns at once. One background thread sends them in the order they came: the
metrics and tags queued one after the other go out as one ``log-batch`` (up to the API's
limits), at most one a second unless a flush asks for them, so a server gets few, larger
requests instead of one per line, fast or slow.

* A server that does not answer (connection refused, a timeout, 429/5xx) loses nothing: the
  writes stay queued and are sent again, with a growing pause (at most ``retry_max`` seconds),
  until it answers. One line says so when it starts and one when it answers again.
* The queue is bounded (``max_points`` metric values): past that, the oldest metric values are
  dropped and counted, never the params, tags or calls, so memory stays flat under a server that
  is down for hours.
* A refusal (401, 403, a run that is gone) turns the sender off with one line: the same request
  would be refused again. A params conflict (an earlier try of the step logged other values)
  skips those params only.
* :meth:`Sender.flush` waits, up to a deadline, for everything queued to reach the server;
  :meth:`Sender.close` flushes and says what could not be delivered.

Standard library only: trainers import it inside the TrainJob.

Example:
    >>> class Client:
    ...     def __init__(self):
    ...         self.batches = []
    ...     def log_batch(self, run_id, *, metrics=(), params=None, tags=None):
    ...         self.batches.append((len(list(metrics)), sorted(tags or {})))
    >>> client = Client()
    >>> sender = Sender(client, "run-1", say=print, start=False)  # not started: the writes wait in the queue
    >>> for step in (1, 2, 3):
    ...     _ = sender.metrics([{"key": "loss", "value": 1.0 / step, "timestamp": 0, "step": step}])
    >>> _ = sender.tags({"phase": "done"})
    >>> sender.start().flush(5.0), client.batches  # three lines and a tag: one request
    (True, [(3, ['phase'])])
    >>> sender.close(1.0)
    True
"""

from __future__ import annotations

import collections
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from ..redaction import redact_text
from .client import MAX_METRICS as _MAX_METRICS
from .client import MAX_TAGS as _MAX_TAGS


@dataclass
class _Write:
    """One queued write: metric values and tags (batchable), params, or a call of its own."""

    metrics: list[dict[str, Any]] = field(default_factory=list)
    tags: dict[str, Any] = field(default_factory=dict)
    params: dict[str, Any] | None = None
    call: Callable[[], Any] | None = None
    label: str = ""

    @property
    def batchable(self) -> bool:
        return self.params is None and self.call is None


class Sender:
    """Sends one run's writes from a background thread. See the module docstring.

    Args:
        client: A :class:`~kfp_trainer.tracking.client.MlflowClient` (or any object with its ``log_batch``).
        run_id: The run written to.
        say: Writes one line (a warning, or the server answering again).
        max_points: Metric values kept while the server does not answer; the oldest go first past that.
        retry_max: The longest pause between two tries of a server that does not answer.
        linger: Seconds a request waits after the previous one for more writes to go with it
            (unless 1000 metric values are waiting, or a flush): a fast server gets a request a
            second, not one per line, and spends its CPU (a core the trainer may share) accordingly.
        start: Start the thread now (else :meth:`start`).
    """

    def __init__(
        self, client: Any, run_id: str, *, say: Callable[[str], None], max_points: int = 200_000, retry_max: float = 15.0,
        linger: float = 1.0, start: bool = True,
    ) -> None:  # fmt: skip
        self.client, self.run_id = client, run_id
        self._say = say
        self.max_points = max_points
        self.retry_max = retry_max
        self.linger = linger
        self._last_sent = float("-inf")
        self._queue: collections.deque[_Write] = collections.deque()
        self._points = 0  # metric values queued
        self.dropped = 0  # metric values dropped for the bound
        self.delivered = 0  # writes the server took
        self._busy = 0  # writes at the head in the request that is out (0: none is)
        self._hurry = False  # a flush is waiting: end the pause between two tries now
        self._off = False
        self._stopping = False
        self._unanswered_since: float | None = None
        self._lock = threading.Condition()
        self._thread: threading.Thread | None = None
        if start:
            self.start()

    # ----------------------------------------------------------------- the caller's side (never blocks on the server)

    @property
    def enabled(self) -> bool:
        """False once a refusal turned the sender off (every write is then dropped at once)."""
        return not self._off

    @property
    def pending(self) -> int:
        """Writes not delivered yet (the one being sent included)."""
        with self._lock:
            return len(self._queue)

    def metrics(self, values: list[dict[str, Any]]) -> bool:
        """Queue metric values (``tracking.client.metric`` items); False when the sender is off."""
        return self._put(_Write(metrics=list(values))) if values else self.enabled

    def tags(self, tags: Mapping[str, Any]) -> bool:
        """Queue tags; False when the sender is off."""
        return self._put(_Write(tags=dict(tags))) if tags else self.enabled

    def params(self, params: Mapping[str, Any]) -> bool:
        """Queue params (sent on their own: a conflict skips only them); False when the sender is off."""
        return self._put(_Write(params=dict(params))) if params else self.enabled

    def call(self, what: Callable[[], Any], label: str) -> bool:
        """Queue another request (an upload, the run's status), sent in order with the rest; ``label`` names it in messages."""
        return self._put(_Write(call=what, label=label))

    def _put(self, write: _Write) -> bool:
        with self._lock:
            if self._off:
                return False
            self._queue.append(write)
            self._points += len(write.metrics)
            if self._points > self.max_points:
                self._shed()
            self._lock.notify_all()
        return True

    def _shed(self) -> None:
        """Drop the oldest metric values (not the one being sent) until the bound holds again."""
        kept: collections.deque[_Write] = collections.deque()
        for i, write in enumerate(self._queue):
            if self._points > self.max_points and write.metrics and i >= self._busy:
                self._points -= len(write.metrics)
                self.dropped += len(write.metrics)
                write.metrics = []
                if not write.tags and write.batchable:
                    continue
            kept.append(write)
        self._queue = kept

    def start(self) -> Sender:
        """Start the background thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=f"mlflow-sender-{self.run_id[:8]}", daemon=True)
            self._thread.start()
        return self

    def flush(self, timeout: float) -> bool:
        """Wait up to ``timeout`` seconds for every queued write to reach the server; True when none is left."""
        deadline = time.monotonic() + max(0.0, timeout)
        with self._lock:
            self._hurry = True  # a pause between two tries ends now: the caller is waiting
            self._lock.notify_all()
            while self._queue and not self._off:
                left = deadline - time.monotonic()
                if left <= 0:
                    return False
                self._lock.wait(left)
            return not self._queue

    def close(self, timeout: float) -> bool:
        """Flush (up to ``timeout`` seconds), then stop; says how many writes did not reach the server. True when all did."""
        done = self.flush(timeout)
        with self._lock:
            self._stopping = True
            left = [w for w in self._queue]
            self._lock.notify_all()
        if left and not self._off:
            points = sum(len(w.metrics) for w in left)
            others = sorted({w.label or ("params" if w.params is not None else "tags") for w in left if not w.metrics})
            what = ", ".join([f"{points} metric values"] * bool(points) + others)
            self._say(f"MLflow run {self.run_id}: not delivered after waiting {timeout:g} s for the server: {what}")
        if self.dropped:
            self._say(f"MLflow run {self.run_id}: {self.dropped} of the oldest metric values were dropped while the server did not "
                      f"answer (more than {self.max_points} waiting)")  # fmt: skip
        return done

    # ----------------------------------------------------------------- the thread

    def _take(self) -> tuple[int, _Write]:
        """How many writes at the head go out in the next request, and that request (the lock is held)."""
        head = self._queue[0]
        if not head.batchable:
            return 1, head
        merged, count = _Write(metrics=list(head.metrics), tags=dict(head.tags)), 1
        for write in list(self._queue)[1:]:
            if not write.batchable or len(merged.metrics) + len(write.metrics) > _MAX_METRICS:
                break
            if len(merged.tags.keys() | write.tags.keys()) > _MAX_TAGS:
                break
            merged.metrics += write.metrics
            merged.tags.update(write.tags)
            count += 1
        return count, merged

    def _send(self, write: _Write) -> None:
        if write.call is not None:
            write.call()
        elif write.params is not None:
            self.client.log_batch(self.run_id, params=write.params)
        else:
            self.client.log_batch(self.run_id, metrics=write.metrics, tags=write.tags)

    def _run(self) -> None:
        from .client import MlflowError, MlflowUnreachable

        pause = 0.5
        while True:
            with self._lock:
                while not self._queue and not self._stopping:
                    self._lock.wait()
                until = self._last_sent + self.linger  # gather what comes meanwhile into the same request
                while not (self._hurry or self._stopping) and self._points < _MAX_METRICS and until > time.monotonic():
                    self._lock.wait(until - time.monotonic())
                if not self._queue or self._stopping or self._off:
                    return
                count, write = self._take()
                self._busy = count
            try:
                self._last_sent = time.monotonic()
                self._send(write)
            except (MlflowUnreachable, OSError, TimeoutError) as e:  # not answering: keep everything, try again
                with self._lock:
                    self._busy = 0
                    if self._unanswered_since is None:
                        self._unanswered_since = time.monotonic()
                        self._say(f"MLflow is not answering ({redact_text(str(e))[:300]}); the writes are kept and sent again "
                                  "when it answers; training goes on")  # fmt: skip
                    self._hurry, until = False, time.monotonic() + pause
                    while not (self._hurry or self._stopping) and until > time.monotonic():  # new writes do not end the pause
                        self._lock.wait(until - time.monotonic())
                    pause = min(self.retry_max, pause * 2)
                continue
            except MlflowError as e:
                if write.params is not None and e.code == "INVALID_PARAMETER_VALUE":  # an earlier try logged other values
                    self._say(f"MLflow run {self.run_id}: params not logged ({redact_text(str(e))[:300]})")
                    self._done(count)
                    continue
                self._refused(e)
                return
            except (ValueError, TypeError, KeyError) as e:  # an answer that is not what the API says: as a refusal
                self._refused(e)
                return
            if self._unanswered_since is not None:
                self._say(f"MLflow answers again after {time.monotonic() - self._unanswered_since:.0f} s; sending what was kept")
                self._unanswered_since = None
            pause = 0.5
            self._done(count)

    def _done(self, count: int) -> None:
        with self._lock:
            for _ in range(count):
                self._points -= len(self._queue.popleft().metrics)
            self.delivered += count
            self._busy = 0
            if not self._queue:
                self._hurry = False  # the flush that asked is served: the next writes gather again
            self._lock.notify_all()

    def _refused(self, error: BaseException) -> None:
        with self._lock:
            self._off, self._busy = True, 0
            self._queue.clear()
            self._points = 0
            self._lock.notify_all()
        self._say(f"MLflow logging is off for run {self.run_id}: {redact_text(str(error))[:500]}; training goes on")
