"""The API server's refusals as exceptions that keep what it said; a failed connection as one more.

An answer outside 2xx becomes an :class:`APIError` carrying the HTTP ``status``, and from the
server's ``Status`` object its ``reason`` (``NotFound``, ``AlreadyExists``, ``Conflict``,
``Expired``, ``Invalid``, ``Forbidden``, ``BadRequest`` ...), ``message`` and ``details``
(``kind``, ``name``, ``causes``), and ``retry_after``. It is the client's report of the answer,
one type for every status: what a caller catches is what :func:`.api.translate` makes of it
(:mod:`.api`: ``NotFound``, ``Conflict``, ``Gone``, and the package's ``RejectedError``,
``ForbiddenError``, ``InfraError``), typed by what the caller does about it; the answer rides
along as their ``answer``.

A request that got no answer (refused, reset, timed out, a TLS failure, a stream cut short) is
a :class:`TransportError`; the HTTP library's own exceptions never leave the client.

Example:
    >>> e = api_error(404, b'{"kind": "Status", "reason": "NotFound", "message": "trainjobs x not found",'
    ...                    b' "details": {"name": "x", "kind": "trainjobs"}}')
    >>> type(e).__name__, e.status, e.reason, e.details["name"]
    ('APIError', 404, 'NotFound', 'x')
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any


class TransportError(Exception):
    """A request that got no answer: connection refused or reset, a timeout, a TLS failure, a stream cut short."""


class APIError(Exception):
    """An answer of the API server outside 2xx.

    Attributes:
        status: The HTTP status code.
        reason: The ``Status`` object's machine-readable reason (``NotFound``, ``AlreadyExists`` ...); ``""`` when none.
        message: What the server said, for people.
        details: The ``Status`` object's details: ``name``, ``kind``, ``causes`` (``[{"reason", "message", "field"}]``).
        retry_after: Seconds the server asked to wait before trying again (``Retry-After``), when it did.
    """

    def __init__(
        self, status: int, *, reason: str = "", message: str = "", details: Mapping[str, Any] | None = None,
        retry_after: float | None = None,
    ) -> None:  # fmt: skip
        self.status = status
        self.reason = reason
        self.message = message
        self.details: Mapping[str, Any] = details or {}
        self.retry_after = retry_after
        super().__init__(status, reason, message)

    @property
    def causes(self) -> list[dict[str, str]]:
        """The field-level causes of the refusal (``field``, ``reason``, ``message``), when the server gave any."""
        return [c for c in self.details.get("causes") or [] if isinstance(c, dict)]

    def explanation(self) -> str:
        """The server's message, with the field causes it lists that the message does not already say."""
        extra = "; ".join(f"{c.get('field', '')}: {c.get('message', '')}".strip(": ") for c in self.causes)
        text = self.message or self.reason or f"HTTP {self.status}"
        return f"{text} ({extra})" if extra and extra not in text else text

    def __str__(self) -> str:
        return f"({self.status}{' ' + self.reason if self.reason else ''}) {self.explanation()}"


def api_error(status: int, body: bytes | str | Mapping[str, Any] | None, retry_after: str | None = None) -> APIError:
    """The error for an answer with ``status`` and ``body`` (a ``Status`` object, or any text).

    Example:
        >>> str(api_error(503, b"upstream connect error"))
        '(503) upstream connect error'
    """
    found = _status_object(body)
    if found is not None:
        reason, message, details = str(found.get("reason") or ""), str(found.get("message") or ""), found.get("details")
    else:
        text = body.decode("utf-8", "replace") if isinstance(body, bytes) else str(body or "")
        reason, message, details = "", " ".join(text.split())[:2000], None
    return APIError(status, reason=reason, message=message, details=details if isinstance(details, Mapping) else None,
                    retry_after=_seconds(retry_after))  # fmt: skip


def from_status(obj: Mapping[str, Any]) -> APIError:
    """The error a watch stream's ``ERROR`` event carries (a ``Status`` object with its ``code``)."""
    code = obj.get("code")
    return api_error(int(code) if isinstance(code, int) else 500, obj)


def _status_object(body: bytes | str | Mapping[str, Any] | None) -> Mapping[str, Any] | None:
    if isinstance(body, Mapping):
        return body
    if not body:
        return None
    try:
        parsed = json.loads(body)
    except ValueError:
        return None
    return parsed if isinstance(parsed, dict) and ("message" in parsed or "reason" in parsed) else None


def _seconds(value: str | None) -> float | None:
    try:
        return max(0.0, float(value)) if value else None
    except ValueError:  # an HTTP date: not what the API server sends
        return None
