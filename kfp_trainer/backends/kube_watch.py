"""A continuous watch of Kubernetes objects: list, then watch from ``resourceVersion``.

Three small layers, each with one job:

* :func:`watch` reconnects forever: lists when it has no version, re-opens the stream
  from the last version it saw after a server timeout or a dropped connection (with
  backoff), and relists on ``410 Gone``. Bookmarks advance the version.
* :func:`_stream` opens one watch request and yields decoded events until it ends.
* :func:`_lines` splits the HTTP body into lines as chunks arrive.

The watch yields ``("SYNC", obj)`` for each object found by a list, ``("ABSENT", None)``
when a list finds nothing, the server's ``ADDED``/``MODIFIED``/``DELETED`` events, and
``None`` each time a stream ends normally, so the caller gets a heartbeat at least every
``timeout_seconds`` to check its own deadlines.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Iterator
from typing import Any

import urllib3
from kubernetes.client import ApiClient

from ..errors import InfraError
from .kube_api import TRANSIENT, Gone, RetryPolicy, call, translate

log = logging.getLogger(__name__)
Event = tuple[str, dict[str, Any] | None]


def request(
    api: ApiClient,
    path: str,
    query: list[tuple[str, Any]],
    *,
    timeout: float | tuple[float, float],
    stream: bool = False,
) -> Any:
    """GET ``path`` through the client's auth and TLS settings; raw response when streaming."""
    return api.call_api(
        path,
        "GET",
        query_params=query,
        header_params={"Accept": "application/json"},
        auth_settings=["BearerToken"],
        response_type="object",
        _return_http_data_only=True,
        _preload_content=not stream,
        _request_timeout=timeout,
    )


def list_objects(api: ApiClient, path: str, selectors: list[tuple[str, str]], *, policy: RetryPolicy) -> tuple[list[dict[str, Any]], str]:
    """List objects at ``path``; return them and the list's resourceVersion."""
    body = call(request, api, path, list(selectors), timeout=30, what=f"list {path}", policy=policy)
    return list(body.get("items") or []), str((body.get("metadata") or {}).get("resourceVersion") or "")


def _lines(response: Any) -> Iterator[bytes]:
    buffer = b""
    for chunk in response.stream(amt=None, decode_content=True):
        buffer += chunk
        while b"\n" in buffer:
            line, buffer = buffer.split(b"\n", 1)
            if line.strip():
                yield line
    if buffer.strip():
        yield buffer


def _stream(
    api: ApiClient,
    path: str,
    selectors: list[tuple[str, str]],
    resource_version: str,
    timeout_seconds: int,
) -> Iterator[Event]:
    query = [
        *selectors,
        ("watch", "true"),
        ("allowWatchBookmarks", "true"),
        ("resourceVersion", resource_version),
        ("timeoutSeconds", timeout_seconds),
    ]
    response = request(api, path, query, timeout=(10, timeout_seconds + 15), stream=True)
    try:
        for raw in _lines(response):
            event = json.loads(raw)
            yield event.get("type", ""), event.get("object")
    finally:
        response.release_conn()


def watch(
    api: ApiClient,
    path: str,
    selectors: list[tuple[str, str]],
    *,
    timeout_seconds: int = 15,
    policy: RetryPolicy = RetryPolicy(),
    sleep: Callable[[float], None] = time.sleep,
    resource_version: str | None = None,
) -> Iterator[Event | None]:
    """Watch objects at ``path`` forever; see the module docstring for what it yields.

    Args:
        api: The API client.
        path: Collection path, e.g. ``/api/v1/namespaces/ns/pods``.
        selectors: ``fieldSelector``/``labelSelector`` query pairs.
        timeout_seconds: Server-side watch timeout; also the heartbeat period.
        policy: Backoff for reconnects; ``InfraError`` after that many failures in a row.
        sleep: Injected for tests.
        resource_version: Start from this version instead of listing first (a resumed
            watch); a version that is too old makes the server answer 410, and the watch
            relists.
    """
    version = resource_version
    failures = 0
    delays = policy.delays()
    while True:
        if version is None:
            items, version = list_objects(api, path, selectors, policy=policy)
            for item in items:
                yield "SYNC", item
            if not items:
                yield "ABSENT", None
        try:
            for kind, obj in _stream(api, path, selectors, version, timeout_seconds):
                failures = 0
                if kind == "ERROR":
                    error = obj or {}
                    if error.get("code") == 410:
                        raise Gone(str(error.get("message", "resourceVersion too old")))
                    raise InfraError(f"watch {path}: {error.get('message', error)}")
                version = str(((obj or {}).get("metadata") or {}).get("resourceVersion") or version)
                if kind != "BOOKMARK":
                    yield kind, obj
            yield None
        except Gone as e:
            log.info("watch %s: %s; relisting", path, e)
            version = None
        except (urllib3.exceptions.HTTPError, OSError, TimeoutError, ValueError) as e:
            failures = _backoff(path, e, failures, delays, sleep)
        except TRANSIENT as e:  # ApiException while opening the stream
            error = translate(e, f"watch {path}")
            if isinstance(error, Gone):
                version = None
                continue
            if not isinstance(error, InfraError):
                raise error from e
            failures = _backoff(path, e, failures, delays, sleep)


def _backoff(path: str, error: BaseException, failures: int, delays: list[float], sleep: Callable[[float], None]) -> int:
    if failures >= len(delays):
        raise InfraError(f"watch {path}: gave up after {failures} reconnects: {error}") from error
    log.warning("watch %s interrupted (%s); reconnecting in %.1fs", path, error, delays[failures])
    sleep(delays[failures])
    return failures + 1
