"""Calls to the Kubernetes API with one error mapping and one retry policy.

Every API call of the Kubernetes backend goes through :func:`call`, which turns the client
library's exceptions into this package's errors (the library's never leak out):

* 400/422 -> :class:`RejectedError` (the server's field causes in the message);
* a denial by an admission webhook, a ValidatingAdmissionPolicy or a ResourceQuota (403,
  400 or 422 with the server's words) -> :class:`RejectedError` carrying that message: the
  cluster's policy refused the object, no permission is missing;
* an object too large for the API server or etcd (413, or a 500 "request is too large")
  -> :class:`RejectedError`: the user's to fix, never retried;
* any other 401/403 -> :class:`ForbiddenError` (an RBAC permission is missing);
* 404 -> :class:`NotFound`, 409 -> :class:`Conflict`, 410 -> :class:`Gone`: answers the
  caller handles;
* 429, other 5xx, timeouts, refused or reset connections -> :class:`InfraError`, retried with
  exponential backoff (capped) until the policy's attempts run out.

Example:
    >>> RetryPolicy(attempts=3, base=0.5).delays()
    [0.5, 1.0]
"""

from __future__ import annotations

import json
import logging
import random
import re
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, TypeVar

import urllib3

from ...errors import ForbiddenError, InfraError, KfpTrainerError, RejectedError
from .rest import ApiException

if TYPE_CHECKING:
    from .rest import Client as ApiClient

log = logging.getLogger(__name__)
T = TypeVar("T")
RBAC_HINT = "apply deploy/rbac.yaml in this namespace (see the README's cluster setup)"
_RBAC_DENIAL = re.compile(r'cannot (\w+) resource "([^"]+)"(?: in API group "([^"]*)")?')
_POLICY_DENIAL = ("admission webhook", "denied the request", "ValidatingAdmissionPolicy", "exceeded quota", "denied request")
_TOO_LARGE = ("request is too large", "entity too large", "too large", "larger than max")


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


def is_api_error(e: BaseException) -> bool:
    """Whether ``e`` is an answer of the API server outside 2xx: this package's client's, or the client library's."""
    if isinstance(e, ApiException):
        return True
    library = sys.modules.get("kubernetes.client.exceptions")  # not loaded: none of its errors can exist
    return library is not None and isinstance(e, library.ApiException)


def server_message(e: Any) -> str:
    """The API server's own explanation from an error body (with field causes when given)."""
    try:
        body = json.loads(e.body or "{}")
    except (TypeError, ValueError):
        return (str(e.body or e.reason or "")).strip()
    if not isinstance(body, dict):
        return str(body)
    message = body.get("message") or e.reason or ""
    causes = (body.get("details") or {}).get("causes") or []
    extra = "; ".join(f"{c.get('field', '')}: {c.get('message', '')}".strip(": ") for c in causes if isinstance(c, dict))
    if extra and extra not in message:
        message = f"{message} ({extra})"
    return message


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


def translate(e: BaseException, what: str) -> KfpTrainerError:
    """Map a client-library exception to this package's error for ``what`` was attempted.

    Example:
        >>> e = ApiException(status=403, reason="Forbidden")
        >>> e.body = json.dumps({"message": "admission webhook v.example.com denied the request: no GPUs on Sundays"})
        >>> print(translate(e, "create TrainJob ns/x"))
        create TrainJob ns/x: refused by the cluster's policy: admission webhook v.example.com denied the request: no GPUs on Sundays
    """
    if is_api_error(e):
        status = getattr(e, "status", None) or 0
        text = server_message(e)
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
            return NotFound(message)
        if status == 409:
            return Conflict(message)
        if status == 410:
            return Gone(message)
        return InfraError(f"{message} (HTTP {status})")
    return InfraError(f"{what}: {type(e).__name__}: {e}")


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


TRANSIENT = (ApiException, urllib3.exceptions.HTTPError, OSError, TimeoutError)


def transient(e: BaseException) -> bool:
    """Whether :func:`call` maps (and maybe retries) ``e``: an API answer or a connection error."""
    return isinstance(e, TRANSIENT) or is_api_error(e)


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
        except Exception as raw:
            if not transient(raw):
                raise
            error = translate(raw, what)
            if not isinstance(error, InfraError) or attempt == len(delays):
                raise error from raw
            delay = delays[attempt] * (0.5 + random.random())
            log.warning("%s; retrying in %.1fs (%d/%d)", error, delay, attempt + 1, len(delays))
            sleep(delay)
    raise AssertionError("unreachable")  # pragma: no cover


def request(
    api: ApiClient,
    path: str,
    query: list[tuple[str, Any]],
    *,
    timeout: float | tuple[float, float | None],
    stream: bool = False,
    method: str = "GET",
    body: Any = None,
    headers: dict[str, str] | None = None,
) -> Any:
    """One request to ``path`` through the client's auth and TLS settings; raw response when streaming.

    Raises:
        ApiException: An answer outside 2xx (the client library's own is converted, so ``except TRANSIENT`` sees it).
    """
    try:
        return _call_api(api, path, query, timeout=timeout, stream=stream, method=method, body=body, headers=headers)
    except ApiException:
        raise
    except Exception as e:
        if not is_api_error(e):
            raise
        converted = ApiException(status=getattr(e, "status", None), reason=getattr(e, "reason", None))
        converted.body, converted.headers = getattr(e, "body", None), getattr(e, "headers", None)
        raise converted from e


def _call_api(
    api: ApiClient,
    path: str,
    query: list[tuple[str, Any]],
    *,
    timeout: float | tuple[float, float | None],
    stream: bool,
    method: str,
    body: Any,
    headers: dict[str, str] | None,
) -> Any:
    return api.call_api(
        path,
        method,
        query_params=query,
        header_params={
            "Accept": "application/json",
            **({"Content-Type": "application/json"} if body is not None else {}),
            **(headers or {}),
        },
        body=body,
        auth_settings=["BearerToken"],
        response_type="object",
        _return_http_data_only=True,
        _preload_content=not stream,
        _request_timeout=timeout,
    )
