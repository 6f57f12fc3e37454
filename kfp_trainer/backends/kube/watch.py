"""A continuous watch of Kubernetes objects: list, then watch from ``resourceVersion``.

Small layers, each with one job:

* :func:`watch` reconnects forever: lists when it has no version, re-opens the stream from
  the last version it saw after a server timeout or a dropped connection (with backoff),
  and relists on ``410 Gone``. Bookmarks advance the version. The failure count behind the
  backoff restarts at zero each time a stream opens, so hours of routine reconnects never
  add up to giving up; only failures in a row do. With ``initial_events`` the list is a
  streaming list (Kubernetes 1.32+: one watch request that starts with the current objects
  and marks their end with a bookmark) instead of a list request and a watch request; a
  server that refuses it is asked with a list from then on.
* :func:`open_stream` opens one watch request; :func:`decode` turns its lines into events.
* :func:`wait_gone` waits, bounded, until the objects a selector matches are gone.

Reconnects and relists wait as the backend's one :class:`~.api.RetryPolicy` says.

:func:`watch` yields ``("LIST", {"items": [...]})`` after each list, the server's
``ADDED``/``MODIFIED``/``DELETED`` events, and ``None`` each time a stream ends normally.
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from ...cancel import Stop
from ...errors import InfraError, KfpTrainerError, RejectedError, UserError
from ...kube_types import ObjectList, WatchEvent
from .api import Gone, NotFound, RetryPolicy, call, translate
from .apierrors import APIError, TransportError, from_status
from .bodylines import each_line

if TYPE_CHECKING:
    from .client import Client as ApiClient
    from .client import Stream

log = logging.getLogger(__name__)
Event = tuple[str, dict[str, Any]]
STREAM_ERRORS = (TransportError, ValueError)  # no answer, a cut stream, or a garbled line: reconnect
INITIAL_EVENTS = [("sendInitialEvents", "true"), ("resourceVersionMatch", "NotOlderThan")]
INITIAL_EVENTS_END = "k8s.io/initial-events-end"


def streaming_lists_refused(api: ApiClient) -> bool:
    """Whether the server of ``api`` refused a streaming list (its watches list instead)."""
    return bool(api.lists.streaming_refused)


class Handle:
    """Lets another thread end a watch: :meth:`close` shuts its open stream down."""

    def __init__(self) -> None:
        self.closed = False
        self.response: Any = None
        self._lock = threading.Lock()

    def attach(self, response: Any) -> None:
        """Remember the open stream (closing it at once if :meth:`close` came first)."""
        with self._lock:
            self.response = response
            closed = self.closed
        if closed:
            shutdown(response)

    def close(self) -> None:
        """End the watch: no more reconnects, the open stream is shut down."""
        with self._lock:
            self.closed = True
            response = self.response
        if response is not None:
            shutdown(response)


def shutdown(stream: Stream) -> None:
    """Unblock a read in progress on ``stream`` (from another thread)."""
    stream.shutdown()


def list_objects(api: ApiClient, path: str, selectors: list[tuple[str, str]], *, policy: RetryPolicy) -> tuple[list[dict[str, Any]], str]:
    """List objects at ``path``; return them and the list's resourceVersion."""
    body: ObjectList = call(api.request, "GET", path, query=list(selectors), timeout=30, what=f"list {path}", policy=policy)
    return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")


def open_stream(api: ApiClient, path: str, selectors: list[tuple[str, str]], resource_version: str, timeout_seconds: int) -> Stream:
    """Open one watch request from ``resource_version``; the stream of its lines."""
    query = [
        *selectors,
        ("watch", "true"),
        ("allowWatchBookmarks", "true"),
        ("resourceVersion", resource_version),
        ("timeoutSeconds", max(1, int(timeout_seconds))),
    ]
    stream: Stream = api.request("GET", path, query=query, timeout=(10, timeout_seconds + 15), stream=True)
    return stream


def decode(stream: Stream) -> Iterator[Event]:
    """Events of an open watch stream; gives the connection back at the end."""
    try:
        for raw in each_line(stream):
            event: WatchEvent = json.loads(raw)
            yield str(event.get("type", "")), event.get("object") or {}
    finally:
        stream.close()


def _version(obj: dict[str, Any], default: str) -> str:
    return str((obj.get("metadata") or {}).get("resourceVersion") or default)


def _raise_error_event(path: str, obj: dict[str, Any]) -> None:
    """An ``ERROR`` event: the Status it carries, mapped (410: :class:`Gone`)."""
    raise translate(from_status(obj), f"watch {path}")


def watch(
    api: ApiClient,
    path: str,
    selectors: list[tuple[str, str]],
    *,
    timeout_seconds: int = 300,
    policy: RetryPolicy = RetryPolicy(),
    sleep: Callable[[float], None] = time.sleep,
    resource_version: str | None = None,
    handle: Handle | None = None,
    initial_events: bool = False,
) -> Iterator[Event | None]:
    """Watch objects at ``path`` until ``handle`` is closed; see the module docstring.

    Args:
        api: The API client.
        path: Collection path, e.g. ``/api/v1/namespaces/ns/pods``.
        selectors: ``fieldSelector``/``labelSelector`` query pairs.
        timeout_seconds: Server-side watch timeout (one request per period when quiet).
        policy: Backoff for reconnects; ``InfraError`` after that many failures in a row.
        sleep: Injected for tests.
        resource_version: Start from this version instead of listing first (a resumed
            watch); a version that is too old makes the server answer 410, and the watch
            relists.
        handle: Ends the watch from another thread.
        initial_events: List with a streaming list where the server offers one (one request
            instead of two); the ``LIST`` event comes once the current objects are in.
    """
    handle = handle or Handle()
    at = _Position(resource_version)
    failures = 0
    while not handle.closed:
        try:
            if at.version is None and (not initial_events or api.lists.streaming_refused):
                items, at.version = list_objects(api, path, selectors, policy=policy)
                api.lists.count("list")
                yield "LIST", {"items": items}
                continue
            response = _open(api, path, selectors, at, timeout_seconds)
            if response is None:  # the server refused a streaming list: a list request next
                continue
            failures = 0  # the server answered: whatever came before was not a lasting failure
            handle.attach(response)
            yield from _stream(api, path, response, at)
            if not handle.closed:
                yield None
        except Gone as e:
            log.info("watch %s: %s; relisting", path, e)
            at.version = None
        except KfpTrainerError:  # mapped already (e.g. 403 on the list): not a dropped stream
            raise
        except STREAM_ERRORS as e:
            if handle.closed:
                return
            failures = _backoff(path, e, failures, policy, sleep)
        except APIError as e:  # the server refused to open the stream
            error = translate(e, f"watch {path}")
            if isinstance(error, Gone):
                log.info("watch %s: %s; relisting", path, error)
                at.version = None
                continue
            if not isinstance(error, InfraError):
                raise error from e
            failures = _backoff(path, e, failures, policy, sleep)


@dataclass
class _Position:
    """Where a watch stands: the version to resume from, and a streaming list's objects until its end."""

    version: str | None
    initial: list[dict[str, Any]] | None = None


def _open(api: ApiClient, path: str, selectors: list[tuple[str, str]], at: _Position, timeout_seconds: int) -> Any:
    """Open the next stream: from ``at.version``, or a streaming list; None when the server refuses the latter."""
    if at.version is not None:
        at.initial = None
        return open_stream(api, path, selectors, at.version, timeout_seconds)
    at.initial = []
    try:
        return open_stream(api, path, [*selectors, *INITIAL_EVENTS], "", timeout_seconds)
    except APIError as e:
        if not isinstance(translate(e, f"watch {path}"), RejectedError):
            raise
        log.info("watch %s: the server refused a streaming list; listing", path)
        api.lists.streaming_refused = True
        api.lists.count("refused")
        return None


def _stream(api: ApiClient, path: str, response: Any, at: _Position) -> Iterator[Event]:
    """The events of one open stream, ``at`` kept current; a streaming list becomes one ``LIST``."""
    for kind, obj in decode(response):
        if kind == "ERROR":
            _raise_error_event(path, obj)
        if at.initial is not None:  # the objects' own versions are no point to resume from
            if kind == "ADDED":
                at.initial.append(obj)
            elif kind == "BOOKMARK" and ((obj.get("metadata") or {}).get("annotations") or {}).get(INITIAL_EVENTS_END) == "true":
                at.version = _version(obj, "") or None
                items, at.initial = at.initial, None
                api.lists.count("streaming")
                yield "LIST", {"items": items}
            continue
        at.version = _version(obj, at.version or "")
        if kind != "BOOKMARK":
            yield kind, obj


def _backoff(path: str, error: BaseException, failures: int, policy: RetryPolicy, sleep: Callable[[float], None]) -> int:
    if failures + 1 >= policy.attempts:
        raise InfraError(f"watch {path}: gave up after {failures} failed reconnects in a row: {error}") from error
    delay = policy.pause(failures, retry_after=getattr(error, "retry_after", None))
    log.warning("watch %s interrupted (%s); reconnecting in %.1fs", path, error, delay)
    sleep(delay)
    return failures + 1


def _key(obj: dict[str, Any]) -> str:
    meta = obj.get("metadata") or {}
    return str(meta.get("uid") or meta.get("name"))


def wait_gone(
    api: ApiClient,
    path: str,
    selectors: list[tuple[str, str]],
    *,
    timeout: float,
    keep: Callable[[dict[str, Any]], bool] = lambda obj: True,
    policy: RetryPolicy = RetryPolicy(attempts=3),
    clock: Callable[[], float] = time.monotonic,
    sleep: Callable[[float], None] = time.sleep,
    stop: Stop | None = None,
) -> list[dict[str, Any]]:
    """Wait (at most ``timeout`` seconds, with one watch) until no object at ``path`` matches.

    Args:
        api: The API client.
        path: Collection path.
        selectors: ``fieldSelector``/``labelSelector`` query pairs.
        timeout: The bound, in seconds.
        keep: Which of the listed objects to wait for (e.g. the one with a given uid).
        policy: Retries of the list.
        clock: Injected for tests.
        sleep: Injected for tests.
        stop: A stop token whose request ends the wait at once (:class:`CancelledError`); a
            deletion's own wait has none, it runs to its end.

    Returns:
        The objects still there when the time ran out (empty when all are gone).

    Raises:
        KfpTrainerError: The list itself failed (e.g. ForbiddenError).
        CancelledError: A stop was requested on ``stop``.
    """
    deadline = clock() + timeout
    present: dict[str, dict[str, Any]] = {}
    version: str | None = None
    failures = 0  # in a row: the pause before the next try grows with them (policy), bounded by the deadline
    while True:
        if stop is not None:
            stop.check()
        try:
            if version is None:
                try:
                    items, version = list_objects(api, path, selectors, policy=policy)
                except NotFound:  # the kind is not served here: nothing of it can be left
                    return []
                present = {_key(o): o for o in items if keep(o)}
            if not present:
                return []
            left = deadline - clock()
            if left <= 0:
                return list(present.values())
            stream = open_stream(api, path, selectors, version, math.ceil(left))
            failures = 0
            with stop.closing(stream.shutdown) if stop is not None else contextlib.nullcontext():
                for kind, obj in decode(stream):
                    if kind == "ERROR":
                        _raise_error_event(path, obj)
                    version = _version(obj, version)
                    if kind == "DELETED":
                        present.pop(_key(obj), None)
                    elif kind in ("ADDED", "MODIFIED") and keep(obj):
                        present[_key(obj)] = obj
                    if not present:
                        return []
        except Gone:
            version = None
        except UserError:
            raise
        except (*STREAM_ERRORS, APIError, InfraError) as e:
            if isinstance(e, APIError):
                error = translate(e, f"watch {path}")
                if not isinstance(error, (Gone, InfraError)):
                    raise error from e
            version = None
            if clock() >= deadline:
                return list(present.values())
            sleep(min(policy.pause(min(failures, policy.attempts)), max(0.0, deadline - clock())))
            failures += 1
