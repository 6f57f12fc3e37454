"""Follow one trainer node's log through the API server, without losing or repeating lines.

The log of node ``i`` is the ``node`` container of the pod with labels
``jobset.sigs.k8s.io/jobset-name=<job>``, ``jobset.sigs.k8s.io/replicatedjob-name=node``
and ``batch.kubernetes.io/job-completion-index=i``. That pod may not exist yet, may be
Pending for a long time, may restart its container, or may be replaced by a new pod.

:class:`NodeLogFollower` waits for a container instance that has started, streams its log
with ``follow=true&timestamps=true``, and remembers the timestamp of the last line (and how
many lines carried exactly that timestamp). When a stream ends it looks at the pod: a
dropped connection resumes from ``sinceTime`` and skips what was already shown; a
restarted container first drains the previous instance's log (``previous=true``) and then
follows the new one; a finished pod ends the follower.

When the launcher sets ``stop`` (the TrainJob finished, or the run is being cancelled),
:meth:`NodeLogFollower.interrupt` shuts the open stream down and the follower makes one last
non-following read from its cursor, so the final lines are shown even where a log server
keeps a finished container's stream open.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import urllib3
from kubernetes.client import ApiClient

from ..errors import KfpTrainerError
from .base import LogLine, LogSink
from .kube_api import RetryPolicy, call
from .kube_watch import _lines, request

log = logging.getLogger(__name__)
CONTAINER = "node"
Timestamp = tuple[int, int]  # (seconds since epoch, nanoseconds)


def parse_timestamp(text: str) -> Timestamp | None:
    """``2026-01-02T03:04:05.123Z`` -> (epoch seconds, nanoseconds); None if not a timestamp."""
    if len(text) < 20 or text[4] != "-" or text[10] != "T" or not text.endswith("Z"):
        return None
    whole, _, fraction = text[:-1].partition(".")
    try:
        seconds = int(time.mktime(time.strptime(whole, "%Y-%m-%dT%H:%M:%S")) - time.timezone)
        nanos = int((fraction or "0").ljust(9, "0")[:9])
    except ValueError:
        return None
    return seconds, nanos


def format_since(ts: Timestamp) -> str:
    """RFC 3339 (second precision, as the API's sinceTime takes it) for ``ts``."""
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(ts[0]))


@dataclass
class _Cursor:
    """Position in a container's log: the last timestamp shown and lines shown at it."""

    last: Timestamp | None = None
    at_last: int = 0

    def admit(self, ts: Timestamp | None, seen_at: dict[Timestamp, int]) -> bool:
        """Whether a line with ``ts`` is new; ``seen_at`` counts lines of this read per ts."""
        if ts is None:
            return True
        seen_at[ts] = seen_at.get(ts, 0) + 1
        if self.last is None or ts > self.last:
            self.last, self.at_last = ts, seen_at[ts]
            return True
        if ts == self.last and seen_at[ts] > self.at_last:
            self.at_last = seen_at[ts]
            return True
        return False


def _container_status(pod: dict[str, Any]) -> dict[str, Any]:
    for status in (pod.get("status") or {}).get("containerStatuses") or []:
        if status.get("name") == CONTAINER:
            return status
    return {}


def _started(pod: dict[str, Any]) -> bool:
    state = _container_status(pod).get("state") or {}
    return "running" in state or "terminated" in state


def _finished(pod: dict[str, Any]) -> bool:
    return (pod.get("status") or {}).get("phase") in ("Succeeded", "Failed")


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
        poll: float = 1.0,
        policy: RetryPolicy = RetryPolicy(),
        sleep: Callable[[float], None] | None = None,
    ) -> None:
        self.api = api
        self.namespace = namespace
        self.selector = ",".join(
            [
                f"jobset.sigs.k8s.io/jobset-name={job}",
                f"jobset.sigs.k8s.io/replicatedjob-name={replicated_job}",
                f"batch.kubernetes.io/job-completion-index={index}",
            ]
        )
        self.sink = sink
        self.stop = stop
        self.source = source
        self.poll = poll
        self.policy = policy
        self.sleep = sleep or stop.wait
        self.cursors: dict[str, _Cursor] = {}  # by pod uid
        self.lines = 0
        self._response: Any = None
        self._streamed: tuple[str, int] | None = None  # (pod uid, restartCount) last followed

    def interrupt(self) -> None:
        """Unblock a read in progress (called from another thread once ``stop`` is set)."""
        response = self._response
        if response is None:
            return
        try:
            response.shutdown()
        except Exception:  # older urllib3, or already closed
            try:
                response.close()
            except Exception:
                pass

    # -- pods
    def _pod(self) -> dict[str, Any] | None:
        body = call(
            request,
            self.api,
            f"/api/v1/namespaces/{self.namespace}/pods",
            [("labelSelector", self.selector)],
            timeout=30,
            what=f"list pods {self.selector}",
            policy=self.policy,
        )
        pods = body.get("items") or []
        if not pods:
            return None
        # The newest pod is the current one when the Job replaced a failed pod.
        return max(pods, key=lambda p: (p["metadata"].get("creationTimestamp") or "", p["metadata"]["name"]))

    # -- logs
    def _read(self, pod: str, cursor: _Cursor, *, follow: bool, previous: bool = False) -> None:
        query: list[tuple[str, Any]] = [("container", CONTAINER), ("timestamps", "true")]
        if follow:
            query.append(("follow", "true"))
        if previous:
            query.append(("previous", "true"))
        if cursor.last is not None:
            query.append(("sinceTime", format_since(cursor.last)))
        path = f"/api/v1/namespaces/{self.namespace}/pods/{pod}/log"
        response = call(
            request, self.api, path, query, timeout=(10, None if follow else 60), stream=True, what=f"logs of {pod}", policy=self.policy
        )
        seen_at: dict[Timestamp, int] = {}
        if follow:
            self._response = response
            if self.stop.is_set():  # stop came while connecting
                return
        try:
            for raw in _lines(response):
                if follow and self.stop.is_set():
                    return
                text = raw.decode("utf-8", errors="replace").rstrip("\r")
                stamp, _, rest = text.partition(" ")
                ts = parse_timestamp(stamp)
                line = rest if ts is not None else text
                if cursor.admit(ts, seen_at):
                    self.lines += 1
                    self.sink(LogLine(self.source, line))
        finally:
            self._response = None
            response.release_conn()

    def run(self) -> None:
        """Follow until the node's pod finishes or ``stop`` is set, then catch up. Never raises."""
        try:
            self._run()
            self._catch_up()
        except KfpTrainerError as e:
            log.warning("%s: log streaming stopped: %s", self.source, e)
        except Exception as e:  # a log follower must never take the launcher down
            log.warning("%s: log streaming stopped: %s: %s", self.source, type(e).__name__, e)

    def _instance(self, pod: dict[str, Any]) -> tuple[str, str, int]:
        return pod["metadata"]["uid"], pod["metadata"]["name"], int(_container_status(pod).get("restartCount") or 0)

    def _run(self) -> None:
        while not self.stop.is_set():
            pod = self._pod()
            if pod is None or not _started(pod):
                self.sleep(self.poll)
                continue
            uid, name, restarts = self._instance(pod)
            # One cursor per pod: log timestamps only grow across a container's restarts.
            cursor = self.cursors.setdefault(uid, _Cursor())
            if self._streamed is not None and self._streamed[0] == uid and restarts > self._streamed[1]:
                # The container restarted since we last read: catch up on its previous log first.
                self._safe_read(name, cursor, previous=True)
            if self._streamed == (uid, restarts) and _finished(pod):
                return
            self._safe_read(name, cursor, follow=True)
            self._streamed = (uid, restarts)
            pod = self._pod()
            if pod is not None and pod["metadata"]["uid"] == uid and _finished(pod):
                return

    def _catch_up(self) -> None:
        """One last non-following read of whatever the streams have not shown yet."""
        pod = self._pod()
        if pod is None or not _started(pod):
            return
        uid, name, restarts = self._instance(pod)
        cursor = self.cursors.setdefault(uid, _Cursor())
        followed = self._streamed[1] if self._streamed is not None and self._streamed[0] == uid else None
        if restarts > 0 and (followed is None or restarts > followed):
            self._safe_read(name, cursor, previous=True, final=True)
        self._safe_read(name, cursor, final=True)

    def _safe_read(self, pod: str, cursor: _Cursor, *, follow: bool = False, previous: bool = False, final: bool = False) -> None:
        try:
            self._read(pod, cursor, follow=follow, previous=previous)
        except (urllib3.exceptions.HTTPError, OSError, ValueError) as e:
            if self.stop.is_set() and not final:
                return
            log.info("%s: log stream of %s interrupted (%s); resuming", self.source, pod, e)
            self.sleep(self.poll)
        except KfpTrainerError as e:
            # 400 "container ... is waiting to start" and the like: try again shortly.
            log.info("%s: %s", self.source, e)
            if not final:
                self.sleep(self.poll)
