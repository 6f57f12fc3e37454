"""Follow one trainer node's log through the API server, without losing or repeating lines.

The log of node ``i`` is the ``node`` container of the pod with labels
``jobset.sigs.k8s.io/replicatedjob-name=node`` and ``batch.kubernetes.io/job-completion-index=i``
among the job's pods. That pod may not exist yet, may be Pending for a long time, may restart
its container, or may be replaced by a new pod.

:class:`NodeLogFollower` learns about the pod from a shared pod watch (no polling), streams
each container instance's log with ``follow=true&timestamps=true`` and remembers the timestamp
of the last line (and how many lines carried exactly that timestamp):

* the server ends a follow stream when the container instance stops: the follower then waits
  for the pod watch to show why (restart, finished) and moves on, with nothing to re-read;
* a dropped connection, or one quiet for ``read_timeout`` seconds, resumes from ``sinceTime``
  and skips what was already shown;
* a pod made after its TrainJob's deletion began (``deleted_at``: a JobSet the controllers
  re-created for a job held by a foreground-deletion finalizer) is never read: it runs the
  trainer anew, and its lines would repeat those already shown
  (:func:`~kfp_trainer.backends.deletion.made_before`);
* when the launcher sets ``stop`` (the TrainJob finished, or the run is being cancelled), a
  follower that has read its container to the end returns at once, without a request; one
  still streaming is interrupted (:meth:`NodeLogFollower.interrupt`) and reads the rest once
  from its cursor -- a finished job's containers have stopped, so that read is complete, while
  a server may take seconds to end the stream on its own.

A ``403`` on ``pods/log`` is reported once, naming the missing permission, and ends the follower.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from ...errors import ForbiddenError, KfpTrainerError
from ...kube_types import ContainerStatus, Pod
from ...timestamps import KNOWN_SECONDS, Timestamp, exact_second, parse_timestamp, rfc3339
from ..base import LogLine, LogSink
from ..deletion import made_before
from .api import NotFound, RetryPolicy, call
from .apierrors import TransportError
from .bodylines import GATHER, batches
from .cache import ObjectCache

if TYPE_CHECKING:
    from .client import Client as ApiClient

log = logging.getLogger(__name__)
CONTAINER = "node"
_STAMP = 30  # len("2026-01-02T03:04:05.123456789Z"): how a kubelet writes the time of each line


class _Cursor:
    """Position in a container's log: the last timestamp shown (:attr:`last`) and lines shown at it.

    While the lines carry the time as a kubelet writes it (``YYYY-MM-DDTHH:MM:SS.nnnnnnnnnZ``,
    a real instant: see :func:`~kfp_trainer.timestamps.exact_second`), ``stamp`` holds the last
    one and lines are compared to it as bytes, which orders them as their times do; any other
    form is parsed and compared as a :data:`~kfp_trainer.timestamps.Timestamp`. ``seen`` counts
    the lines of the current read at the last timestamp: a read from ``sinceTime`` (whole
    seconds) repeats lines already shown, and only those beyond ``at_last`` are new.
    """

    def __init__(self) -> None:
        self.stamp: bytes | None = b""  # b"": no line yet; None: the last one came in another form (``_last``)
        self._last: Timestamp | None = None
        self.at_last = 0
        self.seen = 0

    @property
    def last(self) -> Timestamp | None:
        """The timestamp of the last line shown; None before the first."""
        return _timestamp(self.stamp) if self.stamp else self._last

    def start_read(self) -> None:
        """A new read of the log begins: none of its lines counted yet."""
        self.seen = 0

    def take(self, lines: list[bytes]) -> list[bytes]:
        """The lines among ``lines`` (in order, as read) not shown yet, without their timestamps.

        Blank lines are dropped; a line without a timestamp is always new. A trailing carriage
        return is left on lines in the kubelet's form (see :func:`_text`).
        """
        kept: list[bytes] = []
        keep = kept.append
        known = KNOWN_SECONDS
        stamp, last, seen, at_last = self.stamp, self._last, self.seen, self.at_last
        for raw in lines:
            key: bytes | Timestamp
            current: bytes | Timestamp | None
            if (raw[_STAMP : _STAMP + 1] == b" " and raw[29:30] == b"Z" and raw[19:20] == b"." and raw[20:29].isdigit()
                    and (raw[:19] in known or exact_second(raw[:19]) is not None)):  # fmt: skip
                text, parsed = raw[_STAMP + 1 :], None
                if stamp is not None:  # the last one in this form too (or none): bytes order is time order
                    key, current = raw[:_STAMP], stamp
                else:
                    key, current = (known[raw[:19]], int(raw[20:29])), last
            else:
                if not raw.strip():
                    continue
                text = raw.rstrip(b"\r")
                head, _, rest = text.partition(b" ")
                parsed = parse_timestamp(head)
                if parsed is None:  # no timestamp: always new
                    keep(text)
                    continue
                text, key, current = rest, parsed, last if stamp is None else _timestamp(stamp) if stamp else None
            if current is None or key > current:  # type: ignore[operator]  # both bytes or both Timestamp
                seen = at_last = 1
                if parsed is None:
                    stamp = raw[:_STAMP]
                else:
                    stamp, last = None, parsed
            elif key == current:
                seen += 1
                if seen <= at_last:  # shown by the read before
                    continue
                at_last = seen
            else:
                continue
            keep(text)
        self.stamp, self._last, self.seen, self.at_last = stamp, last, seen, at_last
        return kept


def _timestamp(stamp: bytes) -> Timestamp:
    """A timestamp in the kubelet's form (already checked) as a :data:`~kfp_trainer.timestamps.Timestamp`."""
    seconds = KNOWN_SECONDS.get(stamp[:19])
    if seconds is None:
        seconds = exact_second(stamp[:19]) or 0
    return seconds, int(stamp[20:29])


def _text(lines: list[bytes]) -> str:
    """``lines`` joined by newlines and decoded (bad UTF-8 replaced, as line by line), trailing carriage returns dropped."""
    data = b"\n".join(lines)
    if b"\r" in data:
        data = b"\n".join(line.rstrip(b"\r") for line in lines)
    return data.decode("utf-8", errors="replace")


def container_status(pod: Pod) -> ContainerStatus:
    """The trainer container's status in ``pod`` (empty when not reported yet)."""
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return status
    return {}


def _started(pod: Pod) -> bool:
    state = container_status(pod).get("state") or {}
    return "running" in state or "terminated" in state


def _instance(pod: Pod) -> tuple[str, int]:
    return pod["metadata"]["uid"], int(container_status(pod).get("restartCount") or 0)


def _terminated(pod: Pod | None, instance: tuple[str, int]) -> bool:
    """Whether that container instance has exited (its log is complete) or its pod is gone."""
    if pod is None or pod["metadata"]["uid"] != instance[0]:
        return True
    status = container_status(pod)
    return int(status.get("restartCount") or 0) == instance[1] and "terminated" in (status.get("state") or {})


def _instance_over(pod: Pod | None, instance: tuple[str, int]) -> bool:
    """Whether the pod watch shows that container instance ended (stopped, restarted, pod gone)."""
    if pod is None or pod["metadata"]["uid"] != instance[0]:
        return True
    status = container_status(pod)
    return int(status.get("restartCount") or 0) > instance[1] or "terminated" in (status.get("state") or {})


class NodeLogFollower:
    """Streams the log of one trainer node to a sink. Run :meth:`run` in a thread."""

    def __init__(
        self,
        api: ApiClient,
        *,
        namespace: str,
        job: str,
        replicated_job: str,
        index: int,
        sink: LogSink,
        stop: threading.Event,
        source: str,
        pods: ObjectCache[Pod] | None = None,
        deleted_at: Callable[[], str] = lambda: "",
        poll: float = 1.0,
        read_timeout: float = 300.0,
        settle: float = 2.0,
        policy: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.labels = {
            "jobset.sigs.k8s.io/jobset-name": job,
            "jobset.sigs.k8s.io/replicatedjob-name": replicated_job,
            "batch.kubernetes.io/job-completion-index": str(index),
        }
        path = f"/api/v1/namespaces/{namespace}/pods"
        self.pods = pods or ObjectCache(api, path, [("labelSelector", f"jobset.sigs.k8s.io/jobset-name={job}")], policy=policy)
        self.sink = sink
        self.deleted_at = deleted_at
        self.stop = stop
        self.source = source
        self.poll = poll
        self.read_timeout = read_timeout
        self.settle = settle
        self.policy = policy
        self.sleep = sleep or stop.wait
        self.cursors: dict[str, _Cursor] = {}  # by pod uid
        self.done: set[tuple[str, int]] = set()  # container instances read to their end
        self.lines = 0
        self._response: Any = None
        self._cut = threading.Event()  # the follow stream was cut: its container terminated

    def interrupt(self) -> None:
        """Unblock a follow read in progress (called from another thread once ``stop`` is set)."""
        response = self._response
        if response is not None:
            response.shutdown()

    # -- pods
    def _mine(self, pods: list[Pod]) -> Pod | None:
        deleted_at = self.deleted_at()  # pods made since the TrainJob's deletion began are re-created ones: never read
        matching = [
            p
            for p in pods
            if all(((p["metadata"].get("labels") or {}).get(k) == v) for k, v in self.labels.items()) and made_before(p, deleted_at)
        ]
        if not matching:
            return None
        # The newest pod is the current one when the Job replaced a failed pod.
        return max(matching, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))

    def _next(self) -> Pod | None:
        """The pod whose current container instance is still to be read; None when all is read."""

        def unread(pods: list[Pod]) -> Pod | None:
            pod = self._mine(pods)
            return pod if pod is not None and _started(pod) and _instance(pod) not in self.done else None

        pod = self.pods.wait(unread, stop=self.stop)
        if pod is not None or self.done:
            return pod
        # Stopped before any container of this node was seen running: the pod watch may trail
        # the TrainJob's by a moment, so give it a short look before concluding there is no log.
        return self.pods.wait(unread, timeout=min(self.settle, 2.0))

    # -- logs
    def _read(self, pod: str, cursor: _Cursor, *, follow: bool, previous: bool = False) -> bool:
        """Read (or follow) one log; True when the server ended it normally."""
        query: list[tuple[str, Any]] = [("container", CONTAINER), ("timestamps", "true")]
        if follow:
            query.append(("follow", "true"))
        if previous:
            query.append(("previous", "true"))
        if cursor.last is not None:
            query.append(("sinceTime", rfc3339(cursor.last[0])))
        path = f"/api/v1/namespaces/{self.namespace}/pods/{pod}/log"
        timeout = (10, self.read_timeout if follow else 60)
        response = call(self.api.request, "GET", path, query=query, timeout=timeout, stream=True, what=f"read the log of pod {pod}",
                        policy=self.policy)  # fmt: skip
        cursor.start_read()
        if follow:
            self._response = response
            if self._cut.is_set():  # cut while the request was on its way
                response.shutdown()
        arrived = batches(response, GATHER if follow else 0.0)  # the lines that arrived together
        try:
            for batch in arrived:
                lines = cursor.take(batch)
                if lines:
                    self.lines += len(lines)
                    self.sink(LogLine(self.source, _text(lines), len(lines)))
            return True
        finally:
            arrived.close()  # its reading thread ended before the connection goes
            self._response = None
            response.close()

    def run(self) -> None:
        """Follow until the node's pod finishes or ``stop`` is set. Never raises."""
        try:
            self.pods.start()
            self._run()
        except ForbiddenError as e:
            log.warning("%s: no training log: %s", self.source, e)
        except KfpTrainerError as e:
            log.warning("%s: log streaming stopped: %s", self.source, e)
        except Exception as e:  # a log follower must never take the launcher down
            log.warning("%s: log streaming stopped: %s: %s", self.source, type(e).__name__, e)

    def _run(self) -> None:
        while True:
            pod = self._next()
            if pod is None:
                return
            self._read_instance(pod)

    def _read_instance(self, pod: Pod) -> None:
        instance = _instance(pod)
        uid, restarts = instance
        name = pod["metadata"]["name"]
        cursor = self.cursors.setdefault(uid, _Cursor())
        if restarts > 0 and (uid, restarts - 1) not in self.done:
            # The instance before this one was not read to its end (or not seen at all): its log first.
            self._safe_read(name, cursor, previous=True)
            self.done.add((uid, restarts - 1))
        running = "running" in (container_status(pod).get("state") or {})
        if self.stop.is_set() or not running:
            if self._safe_read(name, cursor, follow=False):
                self.done.add(instance)
            return
        if self._follow(name, cursor, instance):
            # The server ends a follow stream when the instance stops: wait for the pod watch to say so.
            over = self.pods.wait(
                lambda pods: True if _instance_over(self._mine(pods), instance) else None, timeout=self.settle, stop=self.stop
            )
            if over or self.stop.is_set():
                self.done.add(instance)
        elif self.stop.is_set() or self._cut.is_set():
            if self._safe_read(name, cursor, follow=False):  # cut or interrupted: the rest from the cursor
                self.done.add(instance)

    def _follow(self, name: str, cursor: _Cursor, instance: tuple[str, int]) -> bool:
        """Follow the instance's log; cut the stream once the pod watch shows the container terminated.

        A server may keep a follow stream open for seconds after its container exited (a
        kubelet checks the container's state every few seconds); the terminated state means
        the log is complete, so one read from the cursor gets the rest at once -- before the
        TrainJob reports its end, which then costs no wait for the log.
        """
        self._cut.clear()
        following = threading.Event()

        def cut_when_terminated() -> None:
            if self.pods.wait(lambda pods: True if _terminated(self._mine(pods), instance) else None, stop=following):
                self._cut.set()
                self.interrupt()

        watcher = threading.Thread(target=cut_when_terminated, name=f"logs-cut-{self.source}", daemon=True)
        watcher.start()
        try:
            return self._safe_read(name, cursor, follow=True)
        finally:
            following.set()
            self.pods.wake()
            watcher.join(2.0)

    def _safe_read(self, pod: str, cursor: _Cursor, *, follow: bool = False, previous: bool = False) -> bool:
        """:meth:`_read`, with interruptions answered by a pause (False); 403 ends the follower."""
        try:
            return self._read(pod, cursor, follow=follow, previous=previous)
        except ForbiddenError:  # (our errors first: a UserError is also a ValueError)
            raise
        except NotFound:  # the pod is gone; the pod watch tells what replaced it
            return True
        except KfpTrainerError as e:  # 400 "container ... is waiting to start" and the like
            log.info("%s: %s", self.source, e)
            if not self.stop.is_set():
                self.sleep(self.poll)
            return False
        except (TransportError, ValueError) as e:
            if not (self.stop.is_set() or self._cut.is_set()):
                log.info("%s: log stream of %s interrupted (%s); resuming", self.source, pod, e)
                self.sleep(min(self.poll, 1.0))
            return False
