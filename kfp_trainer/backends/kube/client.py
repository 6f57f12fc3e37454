"""The one HTTP client of the Kubernetes backend: JSON in, JSON out, over one urllib3 pool.

:meth:`Client.request` sends one request with the credentials' address, TLS settings, proxy
and ``Authorization`` header, and returns the decoded answer -- JSON as plain data, any other
body as text -- or, with ``stream=True``, a :class:`Stream` to read line by line (watches,
followed logs). An answer outside 2xx raises the :mod:`.apierrors` error for it (status,
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
import time
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
GATHER = 0.005  # seconds a followed log's piece waits for others to be handled with it (Stream.batches)
READ_AHEAD = 4 << 20  # bytes a stream's reading thread holds for its caller at most (Stream.batches)


class Stream:
    """A streamed answer being read: a watch, or a followed log.

    :meth:`lines` yields its lines as they arrive (:meth:`batches`: the lines of each piece
    received together); :meth:`close` gives the connection back (or drops it when the body was
    not read to its end); :meth:`shutdown`, from another thread, makes a read in progress end
    at once.
    """

    def __init__(self, response: urllib3.BaseHTTPResponse, what: str) -> None:
        self.response = response
        self.what = what
        self.finished = False
        self._reader: _Reader | None = None  # the thread reading for batches(), once started

    def _pieces(self) -> Iterator[bytes]:
        """The body as urllib3 reads it (an HTTP chunk of a chunked body at a time).

        Raises:
            TransportError: The connection broke (or was shut down) before the body ended.
        """
        try:
            yield from self.response.stream(amt=None, decode_content=True)
        except _HTTP_ERRORS as e:
            raise TransportError(f"{self.what}: the stream broke off: {e}") from e

    def lines(self) -> Iterator[bytes]:
        """The non-empty lines of the body, as they arrive, read in this thread.

        Raises:
            TransportError: The connection broke (or was shut down) before the body ended.
        """
        buffer = b""
        for piece in self._pieces():
            parts, buffer = _complete(buffer, piece)
            yield from (line for line in parts if line.strip())
        self.finished = True
        if buffer.strip():
            yield buffer

    def batches(self, gather: float = 0.0) -> Iterator[list[bytes]]:
        """The lines of the body, split at newlines only, blank ones kept: together, those completed since the last batch.

        A thread of its own reads the body piece by piece (an HTTP chunk at a time: an API
        server relaying a followed log sends each line as a chunk of its own) and does nothing
        else. A batch is handed on ``gather`` seconds after its first piece arrived, with every
        piece that arrived meanwhile or while the caller handled the last batch: what the caller
        does per batch is done once for many lines, not once per line, when a log comes fast
        (:data:`GATHER`, for a followed log: a quiet log's line still reaches the caller within
        milliseconds). A body the server has whole (a log read to its end) needs no wait.

        Raises:
            TransportError: The connection broke (or was shut down) before the body ended.
        """
        reader = self._reader = _Reader(self)
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
        self.finished = True
        if buffer:
            yield [buffer]

    def close(self) -> None:
        """Give the connection back to the pool (read to its end), else drop it (ending a read of :meth:`batches` first)."""
        if self.finished:
            self.response.release_conn()
            return
        if self._reader is not None:  # a close waits for a blocked read to return: end the read first
            self._reader.stop()
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


def _complete(buffer: bytes, data: bytes) -> tuple[list[bytes], bytes]:
    """The lines ``data`` completes after ``buffer`` (the start of a line), and the start of the next line."""
    if b"\n" not in data:
        return [], buffer + data
    parts = (buffer + data if buffer else data).split(b"\n")
    return parts, parts.pop()


class _Reader:
    """The thread that reads a streamed body for :meth:`Stream.batches`: pieces appended as they arrive.

    It holds at most :data:`READ_AHEAD` bytes not taken yet: beyond that it waits for the caller to take
    them (a step's log that drains slowly slows the read down, as it would without the thread,
    instead of the log piling up in memory).
    """

    def __init__(self, stream: Stream) -> None:
        self.stream = stream
        self.pieces: list[bytes] = []
        self.failure: TransportError | None = None
        self.ended = False
        self.taken = 0  # bytes taken by the caller (written by the caller only; the thread counts what it read)
        self._ready = threading.Event()
        self._room = threading.Event()
        self.thread = threading.Thread(target=self._read, name="stream-read", daemon=True)
        self.thread.start()

    def _read(self) -> None:
        add, ready, room, limit, read = self.pieces.append, self._ready, self._room, READ_AHEAD, 0
        try:
            for chunk in self.stream._pieces():
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
            self.failure = TransportError(f"{self.stream.what}: the stream broke off: {type(e).__name__}: {e}")
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
        """Wait for the thread; end its read first (the socket shut down) when it has not ended, also when it waits for room."""
        if not self.ended:
            self.stream.shutdown()
            self._room.set()
        self.thread.join(5)


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
