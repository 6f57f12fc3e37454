"""Which proxy a request to the API server goes through, as client-go decides it. Pure.

* a kubeconfig cluster's ``proxy-url`` applies to every address of that cluster;
* else ``HTTPS_PROXY`` (for an ``https://`` server) or ``HTTP_PROXY`` (``http://``), lower case
  first, unless ``NO_PROXY`` names the host; a loopback address never goes through a proxy.

``NO_PROXY`` is a comma-separated list of ``*``, IP addresses, CIDR ranges and domain names
(matching the name and its subdomains; a leading ``.`` or ``*.``: subdomains only), each
optionally with ``:port``.

Example:
    >>> proxy_for("https://api.example.com:6443", environ={"HTTPS_PROXY": "proxy:3128", "NO_PROXY": "10.0.0.0/8,.internal"})
    'http://proxy:3128'
    >>> proxy_for("https://10.1.2.3:6443", environ={"HTTPS_PROXY": "proxy:3128", "NO_PROXY": "10.0.0.0/8"}) is None
    True
"""

from __future__ import annotations

import ipaddress
from collections.abc import Mapping
from urllib.parse import unquote, urlsplit


def proxy_for(server: str, proxy_url: str | None = None, *, environ: Mapping[str, str]) -> str | None:
    """The proxy URL for requests to ``server``, or None to connect directly.

    Args:
        server: The API server's URL.
        proxy_url: The kubeconfig cluster's ``proxy-url``, when it has one (it wins).
        environ: The environment to read ``HTTPS_PROXY``, ``HTTP_PROXY`` and ``NO_PROXY`` from.
    """
    if proxy_url:
        return _with_scheme(proxy_url)
    parts = urlsplit(server)
    host = (parts.hostname or "").lower()
    if not host or _loopback(host):
        return None
    name = "https_proxy" if parts.scheme == "https" else "http_proxy"
    found = environ.get(name) or environ.get(name.upper())
    if not found:
        return None
    no_proxy = environ.get("no_proxy") or environ.get("NO_PROXY") or ""
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return None if bypassed(host, port, no_proxy) else _with_scheme(found)


def bypassed(host: str, port: int, no_proxy: str) -> bool:
    """Whether ``NO_PROXY`` says ``host``:``port`` is reached directly.

    Example:
        >>> [bypassed(h, 443, "example.com,.corp,192.168.0.0/16,10.0.0.1:443") for h in
        ...  ("example.com", "api.example.com", "corp", "a.corp", "192.168.4.4", "10.0.0.1", "10.0.0.2")]
        [True, True, False, True, True, True, False]
    """
    ip = _ip(host)
    for raw in no_proxy.lower().split(","):
        entry = raw.strip()
        if not entry:
            continue
        if entry == "*":
            return True
        if "/" in entry:
            try:
                if ip is not None and ip in ipaddress.ip_network(entry, strict=False):
                    return True
            except ValueError:
                pass
            continue
        name, wanted_port = _split_port(entry)
        if wanted_port is not None and wanted_port != port:
            continue
        if ip is not None or _ip(name) is not None:
            if ip is not None and _ip(name) == ip:
                return True
            continue
        if name.startswith("*."):
            name = name[1:]
        if name.startswith("."):
            if host.endswith(name):
                return True
        elif host == name or host.endswith("." + name):
            return True
    return False


def proxy_headers(proxy: str) -> dict[str, str]:
    """The ``Proxy-Authorization`` header for a proxy URL with ``user:password@`` in it (none without)."""
    parts = urlsplit(proxy)
    if parts.username is None:
        return {}
    import base64

    pair = f"{unquote(parts.username)}:{unquote(parts.password or '')}".encode()
    return {"Proxy-Authorization": "Basic " + base64.b64encode(pair).decode()}


def shown(proxy: str) -> str:
    """``proxy`` without its password, for messages."""
    parts = urlsplit(proxy)
    if parts.password is None:
        return proxy
    return proxy.replace(f":{parts.password}@", ":***@", 1)


def _with_scheme(url: str) -> str:
    return url if "://" in url else "http://" + url


def _loopback(host: str) -> bool:
    ip = _ip(host)
    return host == "localhost" or host.endswith(".localhost") or (ip is not None and ip.is_loopback)


def _ip(text: str) -> ipaddress.IPv4Address | ipaddress.IPv6Address | None:
    try:
        return ipaddress.ip_address(text.strip("[]"))
    except ValueError:
        return None


def _split_port(entry: str) -> tuple[str, int | None]:
    if entry.startswith("["):  # [v6]:port
        host, _, rest = entry[1:].partition("]")
        return host, int(rest[1:]) if rest.startswith(":") and rest[1:].isdigit() else None
    if entry.count(":") == 1:
        host, _, port = entry.partition(":")
        return host, int(port) if port.isdigit() else None
    return entry, None
