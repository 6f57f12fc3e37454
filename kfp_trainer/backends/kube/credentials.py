"""Where the API server is and how to prove who we are: the pod's service account, or a kubeconfig.

* In a pod (``KUBERNETES_SERVICE_HOST`` set, no kubeconfig asked for): the service account's
  token and CA, read by hand -- the token again every minute (a projected token rotates) and
  after a 401. Nothing of the client library is imported.
* Else the kubeconfig, read by the ``kubernetes`` library's own loader: merged ``KUBECONFIG``
  files, exec plugins, auth providers, client certificates and keys (files or data), token
  files, ``tls-server-name``. Read by hand from the same merged document only what that loader
  (v30) lacks or gets wrong: ``proxy-url``, and ``insecure-skip-tls-verify``, which must be a
  boolean -- the loader takes the string ``"false"`` as true and turns verification off; here
  such a value is refused.
* The proxy as client-go picks it (:mod:`.proxy`): ``proxy-url``, else ``HTTPS_PROXY``/``HTTP_PROXY``
  and ``NO_PROXY``.

:meth:`Credentials.reload` reads them all again (the loader runs again: a new exec plugin
token, a rotated token file); the client calls it once after a 401.

Key material given as ``*-data`` is written by the library's loader to temporary files
(``mkstemp``: mode 0600, in ``$TMPDIR``), which its exit hook removes when the process ends.

Example:
    >>> creds = load("~/.kube/config")          # doctest: +SKIP
    >>> creds.host, creds.verify                # doctest: +SKIP
    ('https://127.0.0.1:6443', True)
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from ...errors import CredentialsError
from .proxy import proxy_for, proxy_headers, shown

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
TOKEN_PERIOD = 60.0  # seconds between reads of a token file, as client-go


class Token:
    """Where the ``Authorization`` header comes from; :meth:`authorization` is asked before every request."""

    def authorization(self) -> str | None:
        """The header's value (``Bearer ...``, ``Basic ...``), or None to send none."""
        return None


class TokenFile(Token):
    """A bearer token read from a file, again every ``period`` seconds (an empty file mid-rotation keeps the last one)."""

    def __init__(self, path: Path, period: float = TOKEN_PERIOD, clock: Callable[[], float] = time.monotonic) -> None:
        self.path = path
        self.period = period
        self.clock = clock
        self._value: str | None = None
        self._read_at = -period
        self._lock = threading.Lock()
        self.authorization()  # a missing or unreadable file is said now, not at the first request

    def authorization(self) -> str | None:
        """``Bearer <the file's content>``."""
        with self._lock:
            if self._value is None or self.clock() - self._read_at >= self.period:
                try:
                    content = self.path.read_text().strip()
                except OSError as e:
                    if self._value is None:
                        raise CredentialsError(f"cannot read the token file {self.path}: {e.strerror or e}") from None
                    content = ""  # keep the last token; the next read may find the file again
                if content:
                    self._value = "Bearer " + content
                self._read_at = self.clock()
            return self._value


class LibraryToken(Token):
    """The token the library's loader set on its ``Configuration``, refreshed by its hook (an expired exec credential)."""

    def __init__(self, configuration: Any) -> None:
        self.configuration = configuration
        self._lock = threading.Lock()

    def authorization(self) -> str | None:
        """The ``authorization`` API key, surrounding whitespace removed (a token file's last newline)."""
        with self._lock:
            hook = self.configuration.refresh_api_key_hook
            if hook is not None:
                hook(self.configuration)
            value = self.configuration.api_key.get("authorization")
        return str(value).strip() or None if value else None


@dataclass(frozen=True)
class Credentials:
    """Everything a connection to the API server needs.

    Attributes:
        host: The API server's URL (``https://host:port``).
        ca_file: The certificate authority to trust (None: the system's).
        cert_file: Client certificate (PEM file).
        key_file: Its key (PEM file).
        verify: Whether the server's certificate is verified.
        tls_server_name: The name to verify the server's certificate against (and send as SNI), when not the host's.
        proxy: The proxy URL requests go through, or None.
        token: Where the ``Authorization`` header comes from.
        source: Where these came from, for messages (``kubeconfig /path``, ``the pod's service account``).
        loader: Reads them again (None: they cannot change).
    """

    host: str
    ca_file: str | None = None
    cert_file: str | None = None
    key_file: str | None = None
    verify: bool = True
    tls_server_name: str | None = None
    proxy: str | None = None
    token: Token = field(default_factory=Token, compare=False)
    source: str = ""
    loader: Callable[[], Credentials] | None = field(default=None, compare=False)

    @property
    def proxy_headers(self) -> dict[str, str]:
        """Headers for the proxy (its credentials, when its URL has them)."""
        return proxy_headers(self.proxy) if self.proxy else {}

    def connection(self) -> tuple[Any, ...]:
        """The settings that shape a connection: when they change, new connections are needed."""
        return (self.host, self.ca_file, self.cert_file, self.key_file, self.verify, self.tls_server_name, self.proxy)

    def reload(self) -> Credentials:
        """The same source read again (the loader runs anew); these when they cannot change."""
        return self.loader() if self.loader is not None else self

    def __repr__(self) -> str:  # no token, no proxy password
        return f"Credentials(host={self.host!r}, source={self.source!r}, proxy={shown(self.proxy) if self.proxy else None!r})"


def load(kubeconfig: str | None = None, context: str | None = None) -> Credentials:
    """The pod's service account (inside a pod, when no kubeconfig is named), else the kubeconfig.

    Raises:
        CredentialsError: They cannot be read or used; the message names the source and why.
    """
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return in_cluster()
    return from_kubeconfig(kubeconfig, context)


def in_cluster(sa_dir: Path | None = None, environ: Mapping[str, str] = os.environ) -> Credentials:
    """The pod's service account: the API server's address from the environment, its token and CA files (in :data:`SA_DIR`).

    Raises:
        CredentialsError: The environment or the service account's files are incomplete.
    """
    sa_dir = sa_dir or SA_DIR
    host, port = environ.get("KUBERNETES_SERVICE_HOST"), environ.get("KUBERNETES_SERVICE_PORT")
    source = "the pod's service account"
    if not host or not port:
        raise CredentialsError(f"{source}: KUBERNETES_SERVICE_HOST and KUBERNETES_SERVICE_PORT must both be set")
    for needed in (sa_dir / "token", sa_dir / "ca.crt"):
        if not needed.is_file():
            raise CredentialsError(f"{source}: {needed} does not exist (is a service account token mounted in this pod?)")
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    server = f"https://{host}:{port}"
    return Credentials(
        server, ca_file=str(sa_dir / "ca.crt"), proxy=proxy_for(server, environ=environ), token=TokenFile(sa_dir / "token"),
        source=source, loader=lambda: in_cluster(sa_dir, environ),
    )  # fmt: skip


def kubeconfig_files(kubeconfig: str | None = None) -> list[Path]:
    """The kubeconfig files to read: ``kubeconfig``, else ``$KUBECONFIG``'s, else ``~/.kube/config``."""
    if kubeconfig:
        return [Path(kubeconfig).expanduser()]
    listed = [Path(p).expanduser() for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]
    return listed or [Path("~/.kube/config").expanduser()]


def from_kubeconfig(kubeconfig: str | None = None, context: str | None = None) -> Credentials:
    """The kubeconfig's context (its current one unless ``context`` names another), read by the client library's loader.

    Raises:
        CredentialsError: The files cannot be read or used.
    """
    present = [p for p in kubeconfig_files(kubeconfig) if p.is_file()]
    if not present:
        named = os.pathsep.join(map(str, kubeconfig_files(kubeconfig)))
        raise CredentialsError(f"no kubeconfig at {named}: give one (--kubeconfig, KUBECONFIG), or run in a pod with a service account")
    source = "kubeconfig " + os.pathsep.join(map(str, present))
    try:
        configuration, cluster = _library_load(present, context)
    except CredentialsError:
        raise
    except Exception as e:  # noqa: BLE001 -- the loader's ConfigException, YAML, file and shape errors alike
        raise CredentialsError(f"{source}: cannot be used: {_why(e)}") from None
    host = str(configuration.host)
    proxy = proxy_for(host, _proxy_url(cluster, source), environ=os.environ)
    has_token = bool(configuration.api_key.get("authorization")) or configuration.refresh_api_key_hook is not None
    return Credentials(
        host,
        ca_file=configuration.ssl_ca_cert,
        cert_file=configuration.cert_file,
        key_file=configuration.key_file,
        verify=_verify(cluster, source),
        tls_server_name=configuration.tls_server_name,
        proxy=proxy,
        token=LibraryToken(configuration) if has_token else Token(),
        source=source,
        loader=lambda: from_kubeconfig(kubeconfig, context),
    )


def context_namespace(kubeconfig: str | None = None) -> str:
    """The namespace of the kubeconfig's current context (``default`` when it names none or cannot be read)."""
    present = [p for p in kubeconfig_files(kubeconfig) if p.is_file()]
    if not present:
        return "default"
    try:
        from kubernetes.config.kube_config import KubeConfigMerger

        merged = KubeConfigMerger(os.pathsep.join(map(str, present))).config
        current = merged.value["current-context"]
        found = merged["contexts"].get_with_name(current)["context"].value
        return str(found.get("namespace") or "default")
    except Exception:  # noqa: BLE001 -- an unreadable kubeconfig: its credentials say why, where they are read
        return "default"


def _library_load(files: list[Path], context: str | None) -> tuple[Any, dict[str, Any]]:
    """The library's ``Configuration`` for the context, and the raw ``cluster`` entry it was read from."""
    from kubernetes.client import Configuration
    from kubernetes.config.config_exception import ConfigException
    from kubernetes.config.kube_config import KubeConfigLoader, KubeConfigMerger

    merger = KubeConfigMerger(os.pathsep.join(map(str, files)))
    if merger.config is None:
        raise ConfigException("no configuration found (an empty file?)")
    loader = KubeConfigLoader(config_dict=merger.config, active_context=context, config_base_path=None,
                              config_persister=merger.save_changes)  # fmt: skip
    configuration = Configuration()
    loader.load_and_set(configuration)
    name = loader.current_context["context"]["cluster"]
    cluster = merger.config["clusters"].get_with_name(name)["cluster"].value
    return configuration, cluster if isinstance(cluster, dict) else {}


def _verify(cluster: dict[str, Any], source: str) -> bool:
    """Whether to verify the server's certificate: ``insecure-skip-tls-verify`` must be a boolean when given."""
    raw = cluster.get("insecure-skip-tls-verify")
    if raw is None:
        return True
    if not isinstance(raw, bool):
        raise CredentialsError(
            f"{source}: insecure-skip-tls-verify is {raw!r} ({type(raw).__name__}), not a boolean; "
            "write true or false without quotes (a quoted value is refused rather than guessed at)"
        )
    return not raw


def _proxy_url(cluster: dict[str, Any], source: str) -> str | None:
    raw = cluster.get("proxy-url")
    if raw is None or raw == "":
        return None
    scheme = str(raw).split("://", 1)[0].lower() if "://" in str(raw) else ""
    if not isinstance(raw, str) or scheme not in ("http", "https"):
        raise CredentialsError(f"{source}: proxy-url {shown(str(raw))!r} is not supported: give an http:// or https:// proxy")
    return raw


def _why(error: BaseException) -> str:
    mark = getattr(error, "problem_mark", None)
    if mark is not None:
        return f"not valid YAML (line {mark.line + 1})"
    text = " ".join(str(error).split()) or type(error).__name__
    return text if len(text) <= 300 else text[:297] + "..."
