"""Calls to the Kubernetes API with one error mapping and one retry policy.

Every API call of the Kubernetes backend goes through :func:`call`, which turns the client
library's exceptions into this package's errors (the library's never leak out):

* 400/422 -> :class:`RejectedError` (the server's field causes in the message), 401/403 ->
  :class:`ForbiddenError`: user errors, never retried;
* 404 -> :class:`NotFound`, 409 -> :class:`Conflict`: answers the caller handles;
* 429, 5xx, timeouts, refused or reset connections -> :class:`InfraError`, retried with
  exponential backoff (capped) until the policy's attempts run out.

Example:
    >>> from kfp_trainer.backends.kube_api import RetryPolicy
    >>> RetryPolicy(attempts=3, base=0.5).delays()
    [0.5, 1.0]
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, TypeVar

import urllib3
from kubernetes.client.exceptions import ApiException

from ..errors import ForbiddenError, InfraError, KfpTrainerError, RejectedError

log = logging.getLogger(__name__)
T = TypeVar("T")


class NotFound(KfpTrainerError):
    """HTTP 404 from the API server."""


class Conflict(KfpTrainerError):
    """HTTP 409 from the API server (already exists, or a stale update)."""


class Gone(KfpTrainerError):
    """HTTP 410: the requested resourceVersion is too old; relist."""


@dataclass(frozen=True)
class RetryPolicy:
    """How often and how patiently transient failures are retried."""

    attempts: int = 8
    base: float = 0.5
    cap: float = 15.0

    def delays(self) -> list[float]:
        """Sleep before each retry (without jitter)."""
        return [min(self.cap, self.base * 2**i) for i in range(self.attempts - 1)]


def server_message(e: ApiException) -> str:
    """The API server's own explanation from an error body (with field causes when given)."""
    try:
        body = json.loads(e.body or "{}")
    except (TypeError, ValueError):
        return (str(e.body or e.reason or "")).strip()
    message = body.get("message") or e.reason or ""
    causes = (body.get("details") or {}).get("causes") or []
    extra = "; ".join(f"{c.get('field', '')}: {c.get('message', '')}".strip(": ") for c in causes)
    if extra and extra not in message:
        message = f"{message} ({extra})"
    return message


def translate(e: BaseException, what: str) -> KfpTrainerError:
    """Map a client-library exception to this package's error for ``what`` was attempted."""
    if isinstance(e, ApiException):
        status = e.status or 0
        message = f"{what}: {server_message(e)}"
        if status in (400, 422):
            return RejectedError(message)
        if status in (401, 403):
            return ForbiddenError(
                f"{message}. The pipeline's service account lacks a permission: apply "
                "deploy/rbac.yaml in this namespace (see the README's cluster setup)."
            )
        if status == 404:
            return NotFound(message)
        if status == 409:
            return Conflict(message)
        if status == 410:
            return Gone(message)
        return InfraError(f"{message} (HTTP {status})")
    return InfraError(f"{what}: {type(e).__name__}: {e}")


TRANSIENT = (ApiException, urllib3.exceptions.HTTPError, OSError, TimeoutError)


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
        fn: A client-library method.
        *args: Its positional arguments.
        what: Short description of the call for error messages ("create TrainJob ns/x").
        policy: Retry policy for transient errors.
        sleep: Injected for tests.
        **kwargs: Its keyword arguments.

    Raises:
        KfpTrainerError: The mapped error (InfraError once retries are exhausted).
    """
    delays = policy.delays()
    for attempt in range(len(delays) + 1):
        try:
            return fn(*args, **kwargs)
        except TRANSIENT as raw:
            error = translate(raw, what)
            if not isinstance(error, InfraError) or attempt == len(delays):
                raise error from raw
            delay = delays[attempt] * (0.5 + random.random())
            log.warning("%s; retrying in %.1fs (%d/%d)", error, delay, attempt + 1, len(delays))
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover
