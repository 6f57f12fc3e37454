r"""A chunked HTTP body read as it comes: at each read, all of it the connection has delivered.

urllib3 hands a chunked body on one HTTP chunk at a time, at a cost per chunk; a followed log
comes in small chunks (a kubelet flushes each line), so that cost is paid per line. Here each
read takes whatever has arrived (up to :data:`READ_SIZE` bytes, across chunk boundaries), waits
only when nothing has, and the chunk framing is undone in one pass over it.

:func:`body_pieces` reads the body of a response whose head urllib3 has read, when it is
chunked and not compressed; it answers None for any other response, which urllib3 then reads.
A body that breaks off, or framing that is not HTTP's, raises :class:`BrokenBody` (an
``OSError``, as the connection's own errors are); at the body's end the response is closed so
its connection can serve the next request.

Example:
    >>> import io
    >>> list(dechunk(io.BufferedReader(io.BytesIO(b"3\r\nab\n\r\n2;x=y\r\nc\n\r\n0\r\n\r\n"))))
    [b'ab\nc\n']
"""

from __future__ import annotations

import http.client
from collections.abc import Iterator
from typing import Any, Protocol

READ_SIZE = 1 << 16
_MAX_LINE = 4096  # a chunk-size line or a trailer longer than this is not HTTP


class BrokenBody(OSError):
    """The body ended before its last chunk, or its framing is not HTTP's chunked encoding."""


class _Reader(Protocol):
    def read1(self, size: int = ..., /) -> bytes: ...


def body_pieces(response: Any) -> Iterator[bytes] | None:
    """The body of urllib3's ``response`` as it arrives, when chunked and not compressed; else None.

    Args:
        response: A urllib3 response returned unread (``preload_content=False``).
    """
    original = getattr(response, "_original_response", None)
    if not (isinstance(original, http.client.HTTPResponse) and getattr(response, "chunked", False)):
        return None
    reader = original.fp
    encoding = (response.headers.get("Content-Encoding") or "identity").strip().lower()
    if encoding != "identity" or not hasattr(reader, "read1") or response.chunk_left is not None or original.chunk_left is not None:
        return None
    return _pieces(original, reader)


def _pieces(original: http.client.HTTPResponse, reader: _Reader) -> Iterator[bytes]:
    yield from dechunk(reader)
    original.close()  # the body was read to its end: the connection may serve another request


def dechunk(reader: _Reader) -> Iterator[bytes]:
    """The data of the chunked body ``reader`` holds, a piece per read of what has arrived (empty pieces left out).

    Raises:
        BrokenBody: The body broke off, or is not in chunked encoding.
    """
    buffer = b""  # framing not consumed yet
    left = 0  # data bytes of the current chunk still to come
    crlf = False  # the CRLF after a chunk's data is still to come
    while True:
        more = reader.read1(READ_SIZE)
        if not more:
            raise BrokenBody("the body ended before its last chunk")
        buffer = buffer + more if buffer else more
        pos, size, data = 0, len(buffer), []
        while True:
            if left:
                if pos == size:
                    break
                piece = buffer[pos : pos + left]
                data.append(piece)
                pos += len(piece)
                left -= len(piece)
                if left:
                    break
                crlf = True
            if crlf:
                if size - pos < 2:
                    break
                if buffer[pos : pos + 2] != b"\r\n":
                    raise BrokenBody("a chunk is longer than its size says")
                pos += 2
                crlf = False
            end = buffer.find(b"\n", pos, pos + _MAX_LINE)
            if end == -1:
                if size - pos >= _MAX_LINE:
                    raise BrokenBody("a chunk size line is too long")
                break
            try:
                left = int(buffer[pos:end].split(b";", 1)[0], 16)  # int() drops the \r and spaces
            except ValueError:
                raise BrokenBody(f"not a chunk size: {buffer[pos:end][:40]!r}") from None
            if left < 0:
                raise BrokenBody(f"not a chunk size: {buffer[pos:end][:40]!r}")
            pos = end + 1
            if left == 0:
                if data:
                    yield b"".join(data)
                _trailers(reader, buffer[pos:])
                return
        if data:
            yield b"".join(data)
        buffer = buffer[pos:]


def _trailers(reader: _Reader, buffer: bytes) -> None:
    """Read the trailer section after the last chunk, up to its empty line."""
    while True:
        end = buffer.find(b"\n")
        if end == -1:
            if len(buffer) >= _MAX_LINE:
                raise BrokenBody("a trailer line is too long")
            more = reader.read1(READ_SIZE)
            if not more:
                raise BrokenBody("the body ended within its trailers")
            buffer += more
            continue
        if not buffer[:end].strip():
            return
        buffer = buffer[end + 1 :]
