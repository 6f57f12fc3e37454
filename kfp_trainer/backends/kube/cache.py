"""Watches that run in a thread of their own: an object cache, and an event queue.

* :class:`ObjectCache` keeps the objects a selector matches (the pods of a job, the warning
  events of a namespace) current with one watch (a streaming list where the server offers
  one: a single request), so readers look them up without a request.
* :class:`EventQueue` hands a watch's events to a consumer that also wants a heartbeat
  every few seconds; a quiet watch costs one request per server timeout, not per heartbeat.

Example:
    >>> pods = ObjectCache(api, "/api/v1/namespaces/ns/pods", [("labelSelector", "app=x")])  # doctest: +SKIP
    >>> pods.start().wait(lambda objs: objs or None, timeout=5)                              # doctest: +SKIP
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast

from ...errors import KfpTrainerError
from .api import RetryPolicy
from .watch import Event, Handle, watch

if TYPE_CHECKING:
    from .client import Client as ApiClient

log = logging.getLogger(__name__)
T = TypeVar("T")
#: The kind of object a cache holds (e.g. :class:`~kfp_trainer.kube_types.Pod`).
Obj = TypeVar("Obj", bound=Mapping[str, Any])


GONE_KEPT = 256  # deleted objects whose final state a cache keeps (ObjectCache.gone)


def key_of(obj: Mapping[str, Any]) -> str:
    """The key an object is kept under: its uid (its name when it has none)."""
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name"))


class ObjectCache(Generic[Obj]):
    """The objects at ``path`` matching ``selectors``, kept current by a watch in a thread."""

    def __init__(
        self,
        api: ApiClient,
        path: str,
        selectors: list[tuple[str, str]],
        *,
        keep: Callable[[Obj], bool] = lambda obj: True,
        timeout_seconds: int = 300,
        policy: RetryPolicy = RetryPolicy(),
        name: str = "cache",
    ) -> None:
        self.api = api
        self.path = path
        self.selectors = selectors
        self.keep = keep
        self.timeout_seconds = timeout_seconds
        self.policy = policy
        self.name = name
        self.error: KfpTrainerError | None = None  # why the watch stopped, when it did
        self.synced = threading.Event()  # the first list arrived (or the watch failed)
        self._objects: dict[str, Obj] = {}
        self._gone: dict[str, Obj] = {}  # the last state of the objects a DELETED event removed, the newest GONE_KEPT
        self._changed = threading.Condition()
        self._handle = Handle()
        self._thread: threading.Thread | None = None

    def start(self) -> ObjectCache[Obj]:
        """Start the watch thread (once)."""
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name=self.name, daemon=True)
            self._thread.start()
        return self

    @property
    def running(self) -> bool:
        """Whether the watch is alive (started, not closed, not failed)."""
        return self._thread is not None and not self._handle.closed and self.error is None

    @property
    def closed(self) -> bool:
        """Whether :meth:`close` was called."""
        return self._handle.closed

    def close(self) -> None:
        """Stop the watch; readers keep the last objects."""
        self._handle.close()
        with self._changed:
            self._changed.notify_all()

    def wake(self) -> None:
        """Make waiters look at their ``stop`` event now (call after setting it)."""
        with self._changed:
            self._changed.notify_all()

    def objects(self) -> list[Obj]:
        """A snapshot of the current objects."""
        with self._changed:
            return list(self._objects.values())

    def gone(self) -> list[Obj]:
        """The objects deleted since the watch began, each as its DELETED event had it (its final state), the newest kept."""
        with self._changed:
            return list(self._gone.values())

    def wait(
        self, predicate: Callable[[list[Obj]], T | None], *, timeout: float | None = None, stop: threading.Event | None = None
    ) -> T | None:
        """Wait until ``predicate(objects)`` returns something other than None; that value.

        Returns None when ``timeout`` passes, ``stop`` is set, or the watch has ended.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            while True:
                found = predicate(list(self._objects.values()))
                if found is not None:
                    return found
                if (stop is not None and stop.is_set()) or self._handle.closed or self.error is not None:
                    return None
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    return None
                # Whoever sets ``stop`` calls wake(); the timeout only bounds a missed wake-up.
                self._changed.wait(1.0 if left is None else min(1.0, left))

    def _apply(self, event: Event | None) -> None:
        if event is None:
            return
        kind, raw = event
        obj = cast(Obj, raw)  # the objects at this cache's path
        with self._changed:
            if kind == "LIST":
                self._objects = {key_of(o): o for o in raw.get("items") or [] if self.keep(o)}
                self.synced.set()
            elif kind == "DELETED":
                self._objects.pop(key_of(obj), None)
                if self.keep(obj):
                    self._gone[key_of(obj)] = obj
                    if len(self._gone) > GONE_KEPT:
                        del self._gone[next(iter(self._gone))]
            elif kind in ("ADDED", "MODIFIED") and self.keep(obj):
                self._objects[key_of(obj)] = obj
            self._changed.notify_all()

    def _run(self) -> None:
        try:
            for event in watch(
                self.api,
                self.path,
                self.selectors,
                timeout_seconds=self.timeout_seconds,
                policy=self.policy,
                handle=self._handle,
                initial_events=True,
            ):
                self._apply(event)
        except KfpTrainerError as e:
            self.error = e
            log.warning("%s: watching %s stopped: %s", self.name, self.path, e)
        except Exception as e:  # a cache must never take the launcher down
            self.error = KfpTrainerError(f"{type(e).__name__}: {e}")
            log.warning("%s: watching %s stopped: %s: %s", self.name, self.path, type(e).__name__, e)
        finally:
            self.synced.set()
            with self._changed:
                self._changed.notify_all()


class _Failure:
    def __init__(self, error: BaseException) -> None:
        self.error = error


class EventQueue:
    """A watch running in a thread, read as events plus a heartbeat (``None``)."""

    def __init__(
        self,
        api: ApiClient,
        path: str,
        selectors: list[tuple[str, str]],
        *,
        resource_version: str | None = None,
        timeout_seconds: int = 300,
        policy: RetryPolicy = RetryPolicy(),
        name: str = "watch",
    ) -> None:
        self._queue: queue.Queue[Event | _Failure | None] = queue.Queue()
        self._handle = Handle()
        self._args = (api, path, selectors)
        self._kwargs: dict[str, Any] = {
            "timeout_seconds": timeout_seconds,
            "policy": policy,
            "resource_version": resource_version,
            "initial_events": True,
        }
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)

    def _run(self) -> None:
        try:
            for event in watch(*self._args, handle=self._handle, **self._kwargs):
                if event is not None:
                    self._queue.put(event)
        except BaseException as e:  # handed to the consumer, which raises it
            self._queue.put(_Failure(e))

    def events(self, heartbeat: float) -> Iterator[Event | None]:
        """The watch's events, and ``None`` whenever ``heartbeat`` seconds pass without one.

        Raises:
            KfpTrainerError: The watch gave up (it stopped before raising).
        """
        if self._thread.ident is None and not self._handle.closed:  # not started yet
            self._thread.start()
        try:
            while True:
                try:
                    item = self._queue.get(timeout=heartbeat)
                except queue.Empty:
                    yield None
                    continue
                if isinstance(item, _Failure):
                    raise item.error
                yield item
        finally:
            self.close()

    def close(self) -> None:
        """Stop the watch thread."""
        self._handle.close()
