"""Calls to the Kubernetes API with one error mapping and one retry policy.

Every API call of the Kubernetes backend goes through :func:`call`, which turns the client's
errors (:mod:`.apierrors`) into this package's, in one place (:func:`translate`); the mapped
error keeps the server's answer as ``answer`` (status, reason, message, details):

* 400/422 -> :class:`RejectedError` (the server's field causes in the message);
* a denial by an admission webhook, a ValidatingAdmissionPolicy or a ResourceQuota (403,
  400 or 422 with the server's words) -> :class:`RejectedError` carrying that message: the
  cluster's policy refused the object, no permission is missing;
* an object too large for the API server or etcd (413, or a 500 "request is too large")
  -> :class:`RejectedError`: the user's to fix, never retried;
* any other 401/403 -> :class:`ForbiddenError` (an RBAC permission is missing; a 401 comes
  after the client read its credentials again once);
* 404 -> :class:`NotFound`, 409 -> :class:`Conflict`, 410 -> :class:`Gone`: answers the
  caller handles;
* 429, other 5xx, and requests that got no answer (refused, reset, timed out) ->
  :class:`InfraError`, retried per :class:`RetryPolicy` until its attempts run out.

:class:`RetryPolicy` is the one backoff of the backend: :func:`call` between attempts, the
watch between reconnects, a bounded wait between relists.

Example:
    >>> policy = RetryPolicy(attempts=3, base=0.5, cap=15.0)
    >>> 0.25 <= policy.pause(0) <= 0.75, 0.5 <= policy.pause(1) <= 1.5, policy.pause(9, retry_after=20.0)
    (True, True, 15.0)
"""

from __future__ import annotations

import logging
import random
import re
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

from ...errors import ForbiddenError, InfraError, KfpTrainerError, RejectedError
from .apierrors import APIError, TransportError

log = logging.getLogger(__name__)
T = TypeVar("T")
RBAC_HINT = "apply deploy/rbac.yaml in this namespace (see the README's cluster setup)"
_RBAC_DENIAL = re.compile(r'cannot (\w+) resource "([^"]+)"(?: in API group "([^"]*)")?')
_POLICY_DENIAL = ("admission webhook", "denied the request", "ValidatingAdmissionPolicy", "exceeded quota", "denied request")
_TOO_LARGE = ("request is too large", "entity too large", "too large", "larger than max")


class ServerAnswer(KfpTrainerError):
    """An answer of the API server the caller handles itself; ``answer`` keeps its status, reason and details."""

    def __init__(self, message: str, answer: APIError | None = None) -> None:
        super().__init__(message)
        self.answer = answer

    @property
    def reason(self) -> str:
        """The server's reason (``NotFound``, ``AlreadyExists``, ``Conflict``, ``Expired`` ...), ``""`` when none."""
        return self.answer.reason if self.answer is not None else ""


class NotFound(ServerAnswer):
    """HTTP 404 from the API server."""


class Conflict(ServerAnswer):
    """HTTP 409 from the API server (``AlreadyExists``, or a failed precondition or stale update: ``Conflict``)."""


class Gone(ServerAnswer):
    """HTTP 410: the requested resourceVersion is too old; relist."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently transient failures are retried: exponential backoff, capped, with jitter."""

    attempts: int = 8
    base: float = 0.5
    cap: float = 15.0

    def pause(self, retry: int, *, retry_after: float | None = None) -> float:
        """Seconds to wait before retry number ``retry`` (0-based): its delay, jittered; at least what the server asked."""
        delay = min(self.cap, self.base * 2.0**retry) * (0.5 + random.random())
        return min(self.cap, max(delay, retry_after or 0.0))


def too_large(status: int, message: str) -> bool:
    """Whether an answer says the object is too large for the API server or etcd.

    Example:
        >>> too_large(500, "etcdserver: request is too large")
        True
        >>> too_large(500, "rpc error: code = ResourceExhausted desc = trying to send message larger than max (2098831 vs. 2097152)")
        True
        >>> too_large(500, "etcdserver: leader changed")
        False
    """
    lowered = message.lower()
    return status == 413 or (status in (400, 422, 500) and any(words in lowered for words in _TOO_LARGE))


def policy_denial(status: int, message: str) -> bool:
    """Whether a 4xx is a policy's refusal (webhook, admission policy, quota), not RBAC."""
    return 400 <= status < 500 and any(words in message for words in _POLICY_DENIAL)


def translate(e: APIError | TransportError, what: str) -> KfpTrainerError:
    """This package's error for the client's error ``e`` while doing ``what``; it keeps the server's answer.

    Example:
        >>> from .apierrors import api_error
        >>> e = api_error(403, {"message": "admission webhook v.example.com denied the request: no GPUs on Sundays"})
        >>> print(translate(e, "create TrainJob ns/x"))
        create TrainJob ns/x: refused by the cluster's policy: admission webhook v.example.com denied the request: no GPUs on Sundays
    """
    if isinstance(e, TransportError):
        return InfraError(f"{what}: {e}")
    error = _mapped(e, what)
    error.answer = e
    return error


def _mapped(e: APIError, what: str) -> KfpTrainerError:
    status, text = e.status, e.explanation()
    message = f"{what}: {text}"
    if too_large(status, text):
        return RejectedError(
            f"{what}: the API server refused the object as too large ({text}). Keep the TrainJob small: pass "
            "large values (data, configuration files) through a volume or the pipeline workspace, not env values, args or the patch."
        )
    if policy_denial(status, text):
        return RejectedError(f"{what}: refused by the cluster's policy: {text}")
    if status in (400, 422):
        return RejectedError(message)
    if status == 401:
        return ForbiddenError(f"{message}. The API server did not accept the credentials (an expired or revoked token?).")
    if status == 403:
        return ForbiddenError(f"{message}. {missing_permission(text)}")
    if status == 404:
        return NotFound(message, e)
    if status == 409:
        return Conflict(message, e)
    if status == 410:
        return Gone(message, e)
    return InfraError(f"{message} (HTTP {status})")


def missing_permission(text: str) -> str:
    """Name the permission an RBAC denial says is missing, and where it is granted.

    Example:
        >>> print(missing_permission('User "u" cannot get resource "pods/log" in API group "" in the namespace "ns"'))
        The service account lacks the permission get on pods/log: apply deploy/rbac.yaml in this namespace (see the README's cluster setup).
    """
    found = _RBAC_DENIAL.search(text)
    if found:
        verb, resource, group = found.group(1), found.group(2), found.group(3) or ""
        where = f"{resource}.{group}" if group else resource
        return f"The service account lacks the permission {verb} on {where}: {RBAC_HINT}."
    return f"The pipeline's service account lacks a permission: {RBAC_HINT}."


def call(
    fn: Callable[..., T],
    *args: Any,
    what: str,
    policy: RetryPolicy = RetryPolicy(),
    sleep: Callable[[float], None] = time.sleep,
    **kwargs: Any,
) -> T:
    """Call ``fn`` and map its errors; retry the transient ones per ``policy``.

    Args:
        fn: A request (``api.request``), or a function that makes one.
        *args: Its positional arguments.
        what: Short description of the call for error messages ("create TrainJob ns/x").
        policy: Retry policy for transient errors.
        sleep: Injected for tests.
        **kwargs: Its keyword arguments.

    Raises:
        KfpTrainerError: The mapped error (InfraError once retries are exhausted).
    """
    for attempt in range(max(1, policy.attempts)):
        try:
            return fn(*args, **kwargs)
        except (APIError, TransportError) as raw:
            error = translate(raw, what)
            if not isinstance(error, InfraError) or attempt + 1 >= policy.attempts:
                raise error from raw
            delay = policy.pause(attempt, retry_after=getattr(raw, "retry_after", None))
            log.warning("%s; retrying in %.1fs (%d/%d)", error, delay, attempt + 1, policy.attempts - 1)
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
