"""Client settings from a pod's service account or a kubeconfig, without the client library where it is not needed.

:func:`load_settings` reads what most clusters use -- a bearer token (``token`` or
``tokenFile``), client certificates, the certificate authority, ``insecure-skip-tls-verify``,
``tls-server-name``, the pod's service account (its token re-read every minute, as it
rotates) -- into :class:`~kfp_trainer.backends.kube.rest.Settings`, the way the client
library's loader reads them. Anything else -- exec plugins, auth providers (gcp, oidc,
azure), user name and password, several merged kubeconfig files, a kubeconfig that does not
parse the way this reader expects -- goes to the client library's own loader, which then
gives the answer (and its error messages) exactly as before.

Example:
    >>> settings = load_settings("~/.kube/config")   # doctest: +SKIP
    >>> settings.host                                # doctest: +SKIP
    'https://127.0.0.1:6443'
"""

from __future__ import annotations

import atexit
import base64
import os
import tempfile
from pathlib import Path
from typing import Any

from .rest import Settings

SA_DIR = Path("/var/run/secrets/kubernetes.io/serviceaccount")
_LIBRARY_ONLY = ("exec", "auth-provider", "username", "password")
_temp_files: list[str] = []


def load_settings(kubeconfig: str | None = None, context: str | None = None) -> Any:
    """The pod's service account (``kubeconfig`` None inside a pod), else the kubeconfig's context.

    Returns :class:`Settings`, or the client library's ``Configuration`` when only its loader
    can read this configuration.

    Raises:
        kubernetes.config.ConfigException, yaml.YAMLError, OSError: From the client library's loader, as before.
    """
    if kubeconfig is None and os.environ.get("KUBERNETES_SERVICE_HOST"):
        return incluster_settings() or _library_incluster()
    return kubeconfig_settings(kubeconfig, context) or _library_kubeconfig(kubeconfig, context)


def incluster_settings(sa_dir: Path = SA_DIR) -> Settings | None:
    """The pod's service account: the API server's address from the environment, its token and CA files; None when incomplete."""
    host, port = os.environ.get("KUBERNETES_SERVICE_HOST"), os.environ.get("KUBERNETES_SERVICE_PORT")
    token, ca = sa_dir / "token", sa_dir / "ca.crt"
    if not host or not port or not token.is_file() or not ca.is_file():
        return None  # the library's loader says what is missing
    if ":" in host and not host.startswith("["):
        host = f"[{host}]"
    settings = Settings(f"https://{host}:{port}", token_file=str(token), ssl_ca_cert=str(ca))
    settings.auth_settings()  # read the token now (a failure is the loader's, not the first request's)
    if not settings.api_key:
        return None  # an empty token file: the library's loader says so
    return settings


def kubeconfig_settings(kubeconfig: str | None = None, context: str | None = None) -> Settings | None:
    """The kubeconfig context's settings, or None when they need the client library's loader."""
    path = _single_file(kubeconfig)
    if path is None:
        return None
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
    except (OSError, yaml.YAMLError, UnicodeDecodeError):
        return None
    try:
        return _from_doc(doc, path, context)
    except (KeyError, TypeError, ValueError, AttributeError, OSError):
        return None


def context_namespace(kubeconfig: str | None = None) -> str:
    """The namespace of the kubeconfig's current context (``default`` when it names none or cannot be read).

    Raises:
        OSError, yaml.YAMLError, kubernetes.config.ConfigException: Only from the client library's
            reader, which several merged files need.
    """
    path = _single_file(kubeconfig)
    if path is None:
        if kubeconfig is None and len([p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p]) > 1:
            from kubernetes import config

            _, active = config.list_kube_config_contexts()
            return ((active or {}).get("context") or {}).get("namespace") or "default"
        return "default"
    import yaml

    try:
        doc = yaml.safe_load(path.read_text())
        return _named(doc, "contexts", doc["current-context"]).get("namespace") or "default"
    except (OSError, yaml.YAMLError, UnicodeDecodeError, KeyError, TypeError, AttributeError):
        return "default"


def _single_file(kubeconfig: str | None) -> Path | None:
    if kubeconfig:
        listed = [kubeconfig]
    else:
        listed = [p for p in os.environ.get("KUBECONFIG", "").split(os.pathsep) if p] or ["~/.kube/config"]
    if len(listed) != 1:
        return None  # merged files: the library's merger
    path = Path(listed[0]).expanduser()
    return path if path.is_file() else None


def _named(doc: dict[str, Any], key: str, name: str) -> dict[str, Any]:
    found = [item for item in doc.get(key) or [] if isinstance(item, dict) and item.get("name") == name]
    if len(found) != 1:
        raise KeyError(name)
    return found[0][key[:-1]]


def _from_doc(doc: Any, path: Path, context: str | None) -> Settings | None:
    if not isinstance(doc, dict):
        return None
    ctx = _named(doc, "contexts", context or doc["current-context"])
    cluster = _named(doc, "clusters", ctx["cluster"])
    user = _named(doc, "users", ctx["user"]) if ctx.get("user") else {}
    user = user or {}
    if any(key in user for key in _LIBRARY_ONLY) or not isinstance(cluster.get("server"), str):
        return None
    base = Path(os.path.abspath(path)).parent  # relative paths as the client library resolves them (symlinks kept)
    host = cluster["server"].rstrip("/")
    token = _token(user, base)
    settings = Settings(host, token=f"Bearer {token}" if token else None)
    if host.startswith("https"):
        settings.ssl_ca_cert = _file(cluster, "certificate-authority", base)
        settings.cert_file = _file(user, "client-certificate", base)
        settings.key_file = _file(user, "client-key", base)
    if "insecure-skip-tls-verify" in cluster:
        settings.verify_ssl = not cluster["insecure-skip-tls-verify"]
    if "tls-server-name" in cluster:
        settings.tls_server_name = cluster["tls-server-name"]
    return settings


def _file(section: dict[str, Any], key: str, base: Path) -> str | None:
    """``key`` (a path, relative to the kubeconfig) or ``key-data`` (base64, written to a private temporary file)."""
    data = section.get(f"{key}-data")
    if data:
        return _temp_file(base64.standard_b64decode(data))
    name = section.get(key)
    if not name:
        return None
    found = base / Path(name).expanduser()
    if not found.is_file():
        raise ValueError(key)  # the library's loader names the missing file
    return str(found)


def _token(user: dict[str, Any], base: Path) -> str | None:
    """``token``, else the content of ``tokenFile`` (relative to the kubeconfig)."""
    if user.get("token"):
        return str(user["token"])
    name = user.get("tokenFile")
    if not name:
        return None
    return (base / Path(name).expanduser()).read_text().strip()  # a trailing newline is no part of a token


def _temp_file(content: bytes) -> str:
    fd, name = tempfile.mkstemp(prefix="kfp-trainer-")  # mode 0600: key material
    with os.fdopen(fd, "wb") as f:
        f.write(content)
    if not _temp_files:
        atexit.register(_remove_temp_files)
    _temp_files.append(name)
    return name


def _remove_temp_files() -> None:
    for name in _temp_files:
        try:
            os.remove(name)
        except OSError:
            pass


def _library_kubeconfig(kubeconfig: str | None, context: str | None) -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_kube_config(config_file=kubeconfig, context=context, client_configuration=configuration)
    return configuration


def _library_incluster() -> Any:
    from kubernetes import client, config

    configuration = client.Configuration()
    config.load_incluster_config(client_configuration=configuration)
    return configuration
