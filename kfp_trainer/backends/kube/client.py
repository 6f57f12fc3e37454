"""The one HTTP client of the Kubernetes backend: JSON in, JSON out, over one urllib3 pool.

:meth:`Client.request` sends one request with the credentials' address, TLS settings, proxy
and ``Authorization`` header, and returns the decoded answer -- JSON as plain data, any other
body as text -- or, with ``stream=True``, a :class:`Stream` of the body's bytes as they arrive
(watches, followed logs; :mod:`.bodylines` cuts them into lines). An answer outside 2xx raises the :mod:`.apierrors` error for it (status,
reason, details kept); no answer at all raises :class:`~.apierrors.TransportError`. The HTTP
library's exceptions never leave this module.

A client made for the command line (:class:`FirstContact`) fails fast until the server has
answered once: a request that gets no answer then raises the error the command line shows (one
line, not retried) within a short connect timeout; nothing is sent to find that out.

A 401 makes the client read its credentials again once (:meth:`Credentials.reload
<kfp_trainer.backends.kube.credentials.Credentials.reload>`: the kubeconfig loader or the
service account's token file) and send the request once more; several threads refused at
once read them once. Nothing else is retried here: :func:`kfp_trainer.backends.kube.api.call`
holds the retry policy.

Example:
    >>> with Client(credentials.load()) as api:                       # doctest: +SKIP
    ...     api.request("GET", "/apis/trainer.kubeflow.org/v1alpha1/clustertrainingruntimes")["items"]
    []
"""

from __future__ import annotations

import collections
import json
import logging
import os
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlencode

import urllib3

from ...errors import CredentialsError
from .apierrors import TransportError, api_error
from .credentials import Credentials

log = logging.getLogger(__name__)
USER_AGENT = "kfp-trainer"
DEFAULT_TIMEOUT = (10.0, 60.0)  # connect, read (seconds)
Timeout = float | tuple[float, float | None] | None
Query = Mapping[str, Any] | Sequence[tuple[str, Any]] | None
_HTTP_ERRORS = (urllib3.exceptions.HTTPError, OSError)


class Stream:
    """A streamed answer being read: a watch, or a followed log.

    :meth:`chunks` yields its body's bytes as they arrive (:mod:`.bodylines` cuts them into
    lines); :meth:`close` gives the connection back (or drops it when the body was not read to
    its end); :meth:`shutdown`, from another thread, makes a read in progress end at once.
    """

    def __init__(self, response: urllib3.BaseHTTPResponse, what: str) -> None:
        self.response = response
        self.what = what
        self.finished = False  # the body was read to its end

    def chunks(self) -> Iterator[bytes]:
        """The body as urllib3 reads it (an HTTP chunk of a chunked body at a time).

        Raises:
            TransportError: The connection broke (or was shut down) before the body ended.
        """
        try:
            yield from self.response.stream(amt=None, decode_content=True)
        except _HTTP_ERRORS as e:
            raise TransportError(f"{self.what}: the stream broke off: {e}") from e
        self.finished = True

    def close(self) -> None:
        """Give the connection back to the pool (read to its end), else drop it (a read in progress ended first)."""
        if self.finished:
            self.response.release_conn()
            return
        self.shutdown()  # a thread blocked reading it returns now, not when the server sends more
        self.response.close()

    def shutdown(self) -> None:
        """End a read in progress from another thread (the socket is shut down)."""
        try:
            self.response.shutdown()
        except Exception:  # noqa: BLE001 -- already closed
            try:
                self.response.close()
            except Exception:  # noqa: BLE001
                pass


@dataclass(frozen=True)
class FirstContact:
    """How a client treats a request that gets no answer before the API server has answered once.

    Attributes:
        timeout: The connect timeout (TCP and TLS) of the requests sent until then, in seconds.
        failed: The error to raise instead of the :class:`~.apierrors.TransportError` (it is its cause).
    """

    timeout: float
    failed: Callable[[TransportError], BaseException]


class ListStats:
    """How the watches on one client listed: whether its server refused a streaming list, and how often each way.

    ``counts``: ``streaming`` (a streaming list came to its end), ``list`` (a list request),
    ``refused`` (the server refused a streaming list). :mod:`.watch` keeps it; a caller reads it
    to tell how a server was listed (diagnostics, and what the tests check against a real server).
    """

    def __init__(self) -> None:
        self.streaming_refused = False
        self.counts: collections.Counter[str] = collections.Counter()
        self._lock = threading.Lock()

    def count(self, kind: str) -> None:
        """One more list of that ``kind``."""
        with self._lock:
            self.counts[kind] += 1


class Client:
    """Requests to one API server with one set of credentials (read again once after a 401).

    Args:
        credentials: Where the server is and who we are.
        first_contact: Fail fast until the server has answered once (the command line); None: never.
    """

    def __init__(self, credentials: Credentials, *, first_contact: FirstContact | None = None) -> None:
        self._credentials = credentials
        self._pool = _pool(credentials)
        self._generation = 0
        self._lock = threading.Lock()
        self._first_contact = first_contact
        self.lists = ListStats()  # how its watches listed (kube.watch)

    @property
    def credentials(self) -> Credentials:
        """The credentials in use."""
        return self._credentials

    @property
    def host(self) -> str:
        """The API server's URL."""
        return self._credentials.host

    def close(self) -> None:
        """Close the pool's idle connections."""
        self._pool.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def request(
        self,
        method: str,
        path: str,
        *,
        query: Query = None,
        body: Any = None,
        headers: Mapping[str, str] | None = None,
        timeout: Timeout = DEFAULT_TIMEOUT,
        stream: bool = False,
    ) -> Any:
        """One request; the decoded answer, or an open :class:`Stream` when ``stream``.

        Args:
            method: ``GET``, ``POST``, ``PATCH``, ``DELETE`` ...
            path: The URL path (``/api/v1/namespaces/ns/pods``), its parts already quoted.
            query: Query parameters (booleans sent as ``true``/``false``).
            body: JSON-ready data (sent as JSON), or bytes/str sent as they are.
            headers: Extra headers (``Content-Type`` for a merge patch, ``Accept-Encoding`` ...).
            timeout: Seconds, or (connect, read); None waits for ever.
            stream: Return the answer unread, as a :class:`Stream`.

        Raises:
            APIError: The server answered outside 2xx (a leaf of :mod:`.apierrors` per status).
            TransportError: No answer: connection refused or reset, a timeout, a TLS failure.
        """
        data = body if body is None or isinstance(body, (bytes, str)) else json.dumps(body)
        what = f"{method} {path}"
        for attempt in (1, 2):
            credentials, pool, generation = self._credentials, self._pool, self._generation
            sent = {"User-Agent": USER_AGENT, "Accept": "application/json"}
            if data is not None:
                sent["Content-Type"] = "application/json"
            sent.update(headers or {})
            authorization = credentials.token.authorization()
            if authorization:
                sent["Authorization"] = authorization
            url = credentials.host + path + _query(query)
            first = self._first_contact
            limits = _timeout(timeout, first.timeout if first else None)
            try:
                response = pool.request(method, url, body=data, headers=sent, preload_content=not stream, timeout=limits,
                                        retries=False, redirect=False)  # fmt: skip
            except _HTTP_ERRORS as e:
                error = TransportError(f"{what}: {_reason(e)}")
                error.__cause__ = e
                if first is not None and self._first_contact is not None:
                    raise first.failed(error) from error
                raise error from e
            self._first_contact = None  # the server answered: from now on, failures are transient ones
            if 200 <= response.status < 300:
                return Stream(response, what) if stream else _decode(response)
            answer = _whole_body(response)
            if response.status == 401 and attempt == 1 and self._reload(generation):
                continue
            raise api_error(response.status, answer, response.headers.get("Retry-After"))
        raise AssertionError("unreachable")  # pragma: no cover

    def _reload(self, generation: int) -> bool:
        """Read the credentials again after a 401 (once for all the threads refused together); whether to try again."""
        with self._lock:
            if self._generation != generation:  # another thread read them since this request was sent
                return True
            old = self._credentials
            if old.loader is None:
                return False
            try:
                new = old.reload()
            except CredentialsError as e:
                log.warning("the API server refused the credentials, and reading them again failed: %s", e)
                return False
            if new.connection() != old.connection():
                self._pool = _pool(new)  # streams open on the old pool finish there
            self._credentials = new
            self._generation += 1
            log.info("the API server refused the credentials (401); read them again from %s", new.source)
            return True


def _pool(credentials: Credentials) -> urllib3.PoolManager:
    """One pool manager with the credentials' TLS settings, through their proxy when they name one."""
    options: dict[str, Any] = {"num_pools": 4, "maxsize": max(8, (os.cpu_count() or 1) * 5), "block": False}
    if credentials.host.startswith("https"):
        ca_file = credentials.ca_file
        if not ca_file and credentials.verify:
            import certifi  # public roots when no authority is named, as the client library does

            ca_file = certifi.where()
        options.update(cert_reqs="CERT_REQUIRED" if credentials.verify else "CERT_NONE", ca_certs=ca_file,
                       cert_file=credentials.cert_file, key_file=credentials.key_file)  # fmt: skip
        if credentials.tls_server_name:
            options["server_hostname"] = credentials.tls_server_name
        if not credentials.verify:
            options["assert_hostname"] = False
    if credentials.proxy:
        return urllib3.ProxyManager(credentials.proxy, proxy_headers=credentials.proxy_headers or None, **options)
    return urllib3.PoolManager(**options)


def _query(query: Query) -> str:
    if not query:
        return ""
    pairs = query.items() if isinstance(query, Mapping) else query
    encoded = [(k, "true" if v is True else "false" if v is False else str(v)) for k, v in pairs if v is not None]
    return "?" + urlencode(encoded) if encoded else ""


def _timeout(value: Timeout, connect_at_most: float | None = None) -> urllib3.Timeout:
    """``value`` as urllib3's: seconds in all, or (connect, read); the connect part at most ``connect_at_most``."""
    if isinstance(value, (int, float)):
        if connect_at_most is None:
            return urllib3.Timeout(total=value)
        return urllib3.Timeout(total=value, connect=min(value, connect_at_most))
    connect, read = value if value is not None else (DEFAULT_TIMEOUT[0], None)
    if connect_at_most is not None:
        connect = min(connect, connect_at_most) if connect is not None else connect_at_most
    return urllib3.Timeout(connect=connect, read=read)


def _decode(response: urllib3.BaseHTTPResponse) -> Any:
    """JSON as data; any other body (a log) as text; nothing as None."""
    data = response.data
    if not data:
        return None
    if "json" in (response.headers.get("Content-Type") or "application/json").lower():
        try:
            return json.loads(data)
        except ValueError:
            pass
    return data.decode("utf-8", "replace")


def _whole_body(response: urllib3.BaseHTTPResponse) -> bytes:
    """An error answer's body (small), read whole even from a streamed response; its connection given back."""
    try:
        return response.data or b""
    except _HTTP_ERRORS:
        return b""
    finally:
        response.release_conn()


def _reason(error: BaseException) -> str:
    """What an urllib3 error says, without its wrapping (``NewConnectionError(<conn>: ...)``)."""
    reason = getattr(error, "reason", None) or error
    return " ".join(str(reason).split()) or type(error).__name__
