"""The API server's refusals as exceptions that keep what it said; a failed connection as one more.

An answer outside 2xx becomes an :class:`APIError` carrying the HTTP ``status``, and from the
server's ``Status`` object its ``reason`` (``NotFound``, ``AlreadyExists``, ``Conflict``,
``Expired``, ``Invalid``, ``Forbidden``, ``BadRequest`` ...), ``message`` and ``details``
(``kind``, ``name``, ``causes``). :func:`api_error` picks the class, in one place:
:class:`APIClientError` for 4xx with a leaf for each answer a caller branches on (400, 401,
403, 404, 409, 410, 422, 429), :class:`APIServerError` for 5xx. Callers branch on these fields,
never on the text of a message.

A request that got no answer (refused, reset, timed out, a TLS failure, a stream cut short) is
a :class:`TransportError`; the HTTP library's own exceptions never leave the client.

Example:
    >>> e = api_error(404, b'{"kind": "Status", "reason": "NotFound", "message": "trainjobs x not found",'
    ...                    b' "details": {"name": "x", "kind": "trainjobs"}}')
    >>> type(e).__name__, e.status, e.reason, e.details["name"]
    ('APINotFoundError', 404, 'NotFound', 'x')
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


class APIClientError(APIError):
    """A 4xx answer: the request was refused."""


class APIServerError(APIError):
    """A 5xx answer: the server (or something behind it) failed."""


class APIBadRequestError(APIClientError):
    """400: the body did not decode (a strict decoding error names the unknown fields)."""


class APIUnauthorizedError(APIClientError):
    """401: the credentials were not accepted."""


class APIForbiddenError(APIClientError):
    """403: not allowed (RBAC), or refused by an admission webhook, a policy or a quota."""


class APINotFoundError(APIClientError):
    """404: no such object, or no such kind served."""


class APIConflictError(APIClientError):
    """409: the object already exists, or a precondition or an update's resourceVersion did not hold."""


class APIGoneError(APIClientError):
    """410: the resourceVersion asked for is too old (``Expired``): list again."""


class APIUnprocessableEntityError(APIClientError):
    """422: the object is invalid (``Invalid``; ``causes`` name the fields)."""


class APITooManyRequestsError(APIClientError):
    """429: the server is throttling; ``retry_after`` says for how long."""


_LEAVES: dict[int, type[APIError]] = {
    400: APIBadRequestError,
    401: APIUnauthorizedError,
    403: APIForbiddenError,
    404: APINotFoundError,
    409: APIConflictError,
    410: APIGoneError,
    422: APIUnprocessableEntityError,
    429: APITooManyRequestsError,
}


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
    cls = _LEAVES.get(status) or (APIClientError if 400 <= status < 500 else APIServerError if status >= 500 else APIError)
    return cls(status, reason=reason, message=message, details=details if isinstance(details, Mapping) else None,
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
