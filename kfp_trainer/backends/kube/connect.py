"""Reaching the API server from the command line: the credentials, then the first answer, each failure one line.

The launcher retries transient API errors patiently (an API server that restarts mid-run is
routine). A command typed at a terminal must not: when the cluster cannot be reached at all it
should say so in seconds. :func:`connect` reads the credentials and gives a client that fails
fast until the API server has answered once (:class:`~.client.FirstContact`): the command's
first request -- nothing is added to find out -- opens the connection the next requests reuse,
within a short connect timeout; when it gets no answer it raises one
:class:`~kfp_trainer.errors.ClusterUnreachableError` (exit code 3), not retried. Credentials that
cannot be used are one :class:`~kfp_trainer.errors.UserError` (exit code 2). Each message names
the server and what to check.

Example:
    >>> api = connect("~/.kube/config")                  # doctest: +SKIP
    >>> connect("/tmp/refused.kubeconfig").request("GET", "/version")  # doctest: +SKIP
    Traceback (most recent call last):
    ...
    kfp_trainer.errors.ClusterUnreachableError: cannot reach the API server https://127.0.0.1:1 (...): connection refused ...
"""

from __future__ import annotations

import errno
import os
import ssl
from collections.abc import Callable
from pathlib import Path
from urllib.parse import urlsplit

from ...errors import ClusterUnreachableError, CredentialsError, UserError
from .apierrors import TransportError
from .client import Client, FirstContact
from .credentials import Credentials, context_namespace, in_cluster, kubeconfig_files
from .credentials import from_kubeconfig as kubeconfig_credentials

CONNECT_TIMEOUT = 10.0
_LOCAL_HINT = "(`--local` runs on this machine without a cluster)"

__all__ = ["connect", "kubeconfig_files", "kubeconfig_namespace", "load_credentials", "why_unreachable"]


def load_credentials(kubeconfig: str | None = None, *, hint: str = _LOCAL_HINT) -> Credentials:
    """The pod's service account, else a kubeconfig, for the command line (its errors in one line).

    ``hint`` ends the no-cluster message: how to do without one, in the flags of the command
    that asked (``""``: no way without one).

    Raises:
        UserError: ``--kubeconfig`` names a file that does not exist, or a kubeconfig that cannot be used.
        ClusterUnreachableError: No cluster is configured at all, or the pod's service account cannot be used.
    """
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            return in_cluster()
        except CredentialsError as e:
            raise ClusterUnreachableError(f"cannot use this pod's service account to reach the cluster: {e}") from None
    files = kubeconfig_files(kubeconfig)
    if kubeconfig and not files[0].is_file():
        raise UserError(f"--kubeconfig {kubeconfig}: no such file")
    if not any(p.is_file() for p in files):
        where = "$KUBECONFIG (" + os.environ["KUBECONFIG"] + ")" if os.environ.get("KUBECONFIG") else "~/.kube/config"
        raise ClusterUnreachableError(
            f"no cluster configured: no kubeconfig at {where}; give --kubeconfig PATH or set KUBECONFIG" + (f" {hint}" if hint else "")
        )
    return kubeconfig_credentials(kubeconfig)  # a CredentialsError (a UserError) says what is wrong, in one line


def kubeconfig_namespace(kubeconfig: str | None) -> str | None:
    """The namespace of ``--kubeconfig``'s current context (``default`` when it names none); ``None`` without the flag.

    Without ``--kubeconfig`` the backend's own default applies (the pod's namespace, else
    ``$KUBECONFIG``'s or ``~/.kube/config``'s context).
    """
    if not kubeconfig:
        return None
    return context_namespace(str(Path(kubeconfig).expanduser()))


def connect(
    kubeconfig: str | None = None,
    *,
    timeout: float = CONNECT_TIMEOUT,
    hint: str = _LOCAL_HINT,
    stopped: Callable[[], None] | None = None,
) -> Client:
    """An API client for the command line: until the API server has answered once, no answer is a one-line error.

    Args:
        kubeconfig: ``--kubeconfig``, else the pod's service account or ``$KUBECONFIG``.
        timeout: The connect timeout (TCP and TLS) until the first answer.
        hint: See :func:`load_credentials`.
        stopped: Called before an unreachable server is reported; raises when the command was
            stopped meanwhile (a stop signal while connecting is a cancel, not an unreachable cluster).

    Raises:
        UserError: Credentials that cannot be used.
        ClusterUnreachableError: No cluster configured (now), or, from the first request, its API
            server cannot be reached within ``timeout``.
    """
    credentials = load_credentials(kubeconfig, hint=hint)
    host, source = credentials.host, credentials.source

    def unreachable(error: TransportError) -> BaseException:
        if stopped is not None:
            stopped()
        return ClusterUnreachableError(f"cannot reach the API server {host} ({source}): {why_unreachable(error, host, timeout)}")

    return Client(credentials, first_contact=FirstContact(timeout, unreachable))


def why_unreachable(error: BaseException, host: str, timeout: float) -> str:
    """What a connection failure means for a user, and what to check.

    Example:
        >>> why_unreachable(ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused"), "https://127.0.0.1:1", 10)
        'connection refused: nothing listens there (is the cluster running? is the server address right?)'
    """
    hostname = urlsplit(host).hostname or host
    cause = _root(error)
    code = getattr(cause, "errno", None)
    if isinstance(cause, ssl.SSLCertVerificationError):
        reason = getattr(cause, "verify_message", "") or getattr(cause, "reason", "") or str(cause)
        return (
            f"TLS certificate not trusted ({reason}): the kubeconfig's certificate-authority(-data) is not the one "
            "that signed the server's certificate, or the address is not the cluster's"
        )
    if isinstance(cause, ssl.SSLError):
        return f"TLS handshake failed ({getattr(cause, 'reason', None) or _one_line(str(cause))}): is the address an API server?"
    if isinstance(cause, (TimeoutError, OSError)) and "timed out" in str(cause).lower() or code == errno.ETIMEDOUT:
        return f"no answer within {timeout:g} s (is the address reachable from here: VPN, firewall, proxy?)"
    if code == errno.ECONNREFUSED or isinstance(cause, ConnectionRefusedError):
        return "connection refused: nothing listens there (is the cluster running? is the server address right?)"
    if "resolve" in str(error).lower() or (isinstance(cause, OSError) and code is not None and code < 0):
        return f"the host name {hostname!r} does not resolve (is the server address right? a VPN or DNS problem?)"
    if code in (errno.ENETUNREACH, errno.EHOSTUNREACH):
        return "no route to the host (is the address reachable from here: VPN, firewall?)"
    if isinstance(cause, OSError) and cause.strerror:
        return _one_line(cause.strerror)
    return _one_line(f"{type(cause).__name__}: {cause}")


def _root(error: BaseException) -> BaseException:
    """The innermost cause urllib3 wrapped (a socket or ssl error)."""
    seen = 0
    while seen < 10:
        inner = error.__cause__ or error.__context__
        if inner is None:
            return error
        error, seen = inner, seen + 1
    return error


def _one_line(text: str, limit: int = 300) -> str:
    flat = " ".join(text.split())
    return flat if len(flat) <= limit else flat[: limit - 3] + "..."
