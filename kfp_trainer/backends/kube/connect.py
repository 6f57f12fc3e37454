"""Reaching the API server from the command line: the credentials, then one request, each failure one line.

The launcher retries transient API errors patiently (an API server that restarts mid-run is
routine). A command typed at a terminal must not: when the cluster cannot be reached at all it
should say so in seconds. :func:`connect` reads the credentials and asks the API server for its
version (``GET /version``) once, with a short timeout and no retry; the connection it opened
stays in the client's pool for the requests that follow. Any answer means the server is
reachable (a refusal of the credentials is the later requests' to report). Each failure is one
:class:`~kfp_trainer.errors.ClusterUnreachableError` (exit code 3) or, for credentials that
cannot be used, one :class:`~kfp_trainer.errors.UserError` (exit code 2), naming the server and
what to check.

Example:
    >>> api = connect("~/.kube/config")   # doctest: +SKIP
    >>> connect("/tmp/refused.kubeconfig")  # doctest: +SKIP
    Traceback (most recent call last):
    ...
    kfp_trainer.errors.ClusterUnreachableError: cannot reach the API server https://127.0.0.1:1 (...): connection refused ...
"""

from __future__ import annotations

import errno
import os
import ssl
from pathlib import Path
from urllib.parse import urlsplit

from ...errors import ClusterUnreachableError, CredentialsError, UserError
from .apierrors import APIError, TransportError
from .client import Client
from .credentials import context_namespace, in_cluster, kubeconfig_files
from .credentials import from_kubeconfig as kubeconfig_credentials

CONNECT_TIMEOUT = 10.0
_LOCAL_HINT = "(`--local` runs on this machine without a cluster)"

__all__ = ["connect", "kubeconfig_files", "kubeconfig_namespace", "load_client", "open_connection", "why_unreachable"]


def load_client(kubeconfig: str | None = None, *, hint: str = _LOCAL_HINT) -> tuple[Client, str]:
    """An API client (the pod's service account, else a kubeconfig) and where its credentials came from.

    ``hint`` ends the no-cluster message: how to do without one, in the flags of the command
    that asked (``""``: no way without one).

    Raises:
        UserError: ``--kubeconfig`` names a file that does not exist, or a kubeconfig that cannot be used.
        ClusterUnreachableError: No cluster is configured at all, or the pod's service account cannot be used.
    """
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        try:
            credentials = in_cluster()
        except CredentialsError as e:
            raise ClusterUnreachableError(f"cannot use this pod's service account to reach the cluster: {e}") from None
        return Client(credentials), credentials.source
    files = kubeconfig_files(kubeconfig)
    if kubeconfig and not files[0].is_file():
        raise UserError(f"--kubeconfig {kubeconfig}: no such file")
    if not any(p.is_file() for p in files):
        where = "$KUBECONFIG (" + os.environ["KUBECONFIG"] + ")" if os.environ.get("KUBECONFIG") else "~/.kube/config"
        raise ClusterUnreachableError(
            f"no cluster configured: no kubeconfig at {where}; give --kubeconfig PATH or set KUBECONFIG" + (f" {hint}" if hint else "")
        )
    credentials = kubeconfig_credentials(kubeconfig)  # a CredentialsError (a UserError) says what is wrong, in one line
    return Client(credentials), credentials.source


def kubeconfig_namespace(kubeconfig: str | None) -> str | None:
    """The namespace of ``--kubeconfig``'s current context (``default`` when it names none); ``None`` without the flag.

    Without ``--kubeconfig`` the backend's own default applies (the pod's namespace, else
    ``$KUBECONFIG``'s or ``~/.kube/config``'s context).
    """
    if not kubeconfig:
        return None
    return context_namespace(str(Path(kubeconfig).expanduser()))


def connect(kubeconfig: str | None = None, *, timeout: float = CONNECT_TIMEOUT, hint: str = _LOCAL_HINT) -> Client:
    """An API client whose API server has answered once (its connection kept for the next requests).

    ``hint``: see :func:`load_client`.

    Raises:
        UserError: Credentials that cannot be used.
        ClusterUnreachableError: No cluster configured, or its API server cannot be reached within ``timeout``.
    """
    api, source = load_client(kubeconfig, hint=hint)
    open_connection(api, source=source, timeout=timeout)
    return api


def open_connection(api: Client, *, source: str, timeout: float = CONNECT_TIMEOUT) -> None:
    """Ask the API server for its version once (DNS, TCP, TLS and one request); its connection stays in the pool.

    Raises:
        ClusterUnreachableError: What failed, in one line.
    """
    host = api.host
    try:
        api.request("GET", "/version", timeout=(timeout, timeout))
    except APIError:
        return  # it answered: reachable (what it thinks of the credentials, the next requests say)
    except TransportError as e:
        raise ClusterUnreachableError(f"cannot reach the API server {host} ({source}): {why_unreachable(e, host, timeout)}") from None
    except ValueError as e:  # an address urllib3 cannot even parse
        raise ClusterUnreachableError(f"cannot reach the API server {host!r} ({source}): {_one_line(str(e))}") from None


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
