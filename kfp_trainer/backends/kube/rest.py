"""A small REST client for the API server: JSON in, JSON out, over one urllib3 pool.

The backend handles plain dicts, so it needs none of the client library's generated models;
importing them (and the auth libraries its configuration loader pulls in) is most of a
launcher's start-up time. :class:`Client` speaks the client library's calling convention
(``call_api``, ``select_header_accept``, ``select_header_content_type``,
``sanitize_for_serialization``, ``rest_client.pool_manager``, ``configuration.host``), so
the library's generated API classes still run on it where a typed answer is wanted; only then
are the models imported.

The settings it reads are those of the client library's ``Configuration`` (``host``,
``ssl_ca_cert``, ``cert_file``, ``key_file``, ``verify_ssl``, ``assert_hostname``,
``tls_server_name``, ``proxy``, ``auth_settings()`` ...): either :class:`Settings` (filled by
:mod:`kfp_trainer.backends.kube.kubeconfig`) or the library's own object when its loader had
to be used (exec plugins, auth providers).

Example:
    >>> Client(Settings(host="https://127.0.0.1:6443")).configuration.host
    'https://127.0.0.1:6443'
"""

from __future__ import annotations

import json
import os
import ssl
import threading
from collections.abc import Callable
from typing import Any
from urllib.parse import quote, urlencode

import urllib3

USER_AGENT = "kfp-trainer"


class ApiException(Exception):  # noqa: N818 -- the client library's name, which callers and tests know
    """A non-2xx answer of the API server: ``status``, ``reason``, ``body`` and ``headers``, as the client library has them."""

    def __init__(self, status: int | None = None, reason: str | None = None, http_resp: Any = None) -> None:
        if http_resp is not None:
            status, reason = http_resp.status, http_resp.reason
            body = http_resp.data
            self.body: Any = body.decode("utf-8", "replace") if isinstance(body, bytes) else body
            self.headers: Any = http_resp.headers
        else:
            self.body, self.headers = None, None
        self.status = status
        self.reason = reason
        super().__init__(status, reason)

    def __str__(self) -> str:
        return f"({self.status})\nReason: {self.reason}\n" + (f"HTTP response body: {self.body}\n" if self.body else "")


class Settings:
    """Where the API server is and how to authenticate: the fields of the client library's ``Configuration`` the client reads.

    ``token`` is the whole ``Authorization`` value (``Bearer ...``); ``token_file`` is re-read
    every ``token_refresh`` seconds when set (a projected service-account token rotates).
    """

    def __init__(
        self,
        host: str,
        *,
        token: str | None = None,
        token_file: str | None = None,
        token_refresh: float = 60.0,
        ssl_ca_cert: str | None = None,
        cert_file: str | None = None,
        key_file: str | None = None,
        verify_ssl: bool = True,
        tls_server_name: str | None = None,
    ) -> None:
        self.host = host
        self.ssl_ca_cert = ssl_ca_cert
        self.cert_file = cert_file
        self.key_file = key_file
        self.verify_ssl = verify_ssl
        self.tls_server_name = tls_server_name
        self.assert_hostname: str | None = None
        self.proxy: str | None = None
        self.no_proxy: str | None = None
        self.proxy_headers: dict[str, str] | None = None
        self.retries: Any = None
        self.connection_pool_maxsize = (os.cpu_count() or 1) * 5
        self.api_key: dict[str, str] = {"authorization": token} if token else {}
        self.api_key_prefix: dict[str, str] = {}
        self._token_file = token_file
        self._token_refresh = token_refresh
        self._token_read = 0.0
        self._lock = threading.Lock()
        self.refresh_api_key_hook: Callable[[Settings], None] | None = self._reread_token if token_file else None

    def _reread_token(self, _: Settings) -> None:
        import time

        with self._lock:
            if self._token_file and time.monotonic() - self._token_read >= self._token_refresh:
                with open(self._token_file) as f:
                    content = f.read().strip()
                if content:  # an empty file mid-rotation keeps the last token
                    self.api_key["authorization"] = "Bearer " + content
                self._token_read = time.monotonic()

    def auth_settings(self) -> dict[str, dict[str, str]]:
        """The ``Authorization`` header to send, refreshed first when a token file is read (the client library's shape)."""
        if self.refresh_api_key_hook is not None:
            self.refresh_api_key_hook(self)
        value = self.api_key.get("authorization")
        if not value:
            return {}
        return {"BearerToken": {"type": "api_key", "in": "header", "key": "authorization", "value": value}}


class _Pool:
    """The connection pool, as ``rest_client.pool_manager`` (where :mod:`.connect` opens the first connection)."""

    def __init__(self, configuration: Any) -> None:
        cert_reqs = ssl.CERT_REQUIRED if configuration.verify_ssl else ssl.CERT_NONE
        ca_certs = configuration.ssl_ca_cert
        if not ca_certs and configuration.verify_ssl and str(configuration.host).startswith("https"):
            import certifi  # public roots only when the kubeconfig names no authority (as the client library does)

            ca_certs = certifi.where()
        extra: dict[str, Any] = {}
        if getattr(configuration, "assert_hostname", None) is not None:
            extra["assert_hostname"] = configuration.assert_hostname
        if getattr(configuration, "retries", None) is not None:
            extra["retries"] = configuration.retries
        if getattr(configuration, "tls_server_name", None):
            extra["server_hostname"] = configuration.tls_server_name
        maxsize = getattr(configuration, "connection_pool_maxsize", None) or 4
        common = dict(num_pools=4, maxsize=maxsize, cert_reqs=cert_reqs, ca_certs=ca_certs, cert_file=configuration.cert_file,
                      key_file=configuration.key_file, **extra)  # fmt: skip
        proxy = getattr(configuration, "proxy", None)
        if proxy and not _bypass_proxy(configuration.host, getattr(configuration, "no_proxy", None) or ""):
            self.pool_manager: urllib3.PoolManager = urllib3.ProxyManager(
                proxy_url=proxy, proxy_headers=getattr(configuration, "proxy_headers", None), **common
            )
        else:
            self.pool_manager = urllib3.PoolManager(**common)


def _bypass_proxy(host: str, no_proxy: str) -> bool:
    from requests.utils import should_bypass_proxies  # only with a proxy configured

    return bool(should_bypass_proxies(host, no_proxy=no_proxy))


class Client:
    """JSON requests to the API server with ``configuration``'s address, TLS settings and credentials."""

    def __init__(self, configuration: Any) -> None:
        self.configuration = configuration
        self.rest_client = _Pool(configuration)
        self.default_headers = {"User-Agent": USER_AGENT}
        self.client_side_validation = True  # read by the generated API classes
        self._typed: Any = None

    def close(self) -> None:
        """Close the pool's connections."""
        self.rest_client.pool_manager.clear()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # ------------------------------------------------------------------ the client library's convention
    def select_header_accept(self, accepts: list[str]) -> str | None:
        """``application/json`` when offered, else all of ``accepts``."""
        if not accepts:
            return None
        lowered = [a.lower() for a in accepts]
        return "application/json" if "application/json" in lowered else ", ".join(lowered)

    def select_header_content_type(self, content_types: list[str], *_: Any) -> str:
        """``application/json`` when offered (or nothing is), else the first one (``merge-patch``, ``apply-patch`` ...)."""
        lowered = [c.lower() for c in content_types or []]
        if not lowered or "application/json" in lowered or "*/*" in lowered:
            return "application/json"
        return lowered[0]

    def sanitize_for_serialization(self, obj: Any) -> Any:
        """``obj`` as JSON-ready data (a generated model object through the client library's own serializer)."""
        if obj is None or isinstance(obj, (str, int, float, bool)):
            return obj
        if isinstance(obj, dict):
            return {k: self.sanitize_for_serialization(v) for k, v in obj.items()}
        if isinstance(obj, (list, tuple)):
            return [self.sanitize_for_serialization(v) for v in obj]
        if hasattr(obj, "isoformat"):
            return obj.isoformat()
        return self._library().sanitize_for_serialization(obj)

    def call_api(
        self,
        resource_path: str,
        method: str,
        path_params: dict[str, Any] | None = None,
        query_params: Any = None,
        header_params: dict[str, str] | None = None,
        body: Any = None,
        post_params: Any = None,
        files: Any = None,
        response_type: str | None = None,
        auth_settings: list[str] | None = None,
        async_req: bool | None = None,
        _return_http_data_only: bool | None = None,
        collection_formats: dict[str, str] | None = None,
        _preload_content: bool = True,
        _request_timeout: Any = None,
        _host: str | None = None,
    ) -> Any:
        """One request; the decoded JSON answer (a typed one for a model ``response_type``), or the raw response when not preloaded.

        Raises:
            ApiException: The server answered outside 2xx.
        """
        if async_req or post_params or files:
            raise NotImplementedError("async requests, forms and file uploads are not used by kfp-trainer")
        path = resource_path
        for key, value in (path_params or {}).items():
            path = path.replace("{" + key + "}", quote(str(value), safe=""))
        query = _query(query_params, collection_formats or {})
        url = (_host or self.configuration.host) + path + (("?" + urlencode(query)) if query else "")
        headers = {**self.default_headers, **(header_params or {})}
        if auth_settings:
            for name in auth_settings:
                setting = self.configuration.auth_settings().get(name)
                if setting and setting.get("value") and setting.get("in") == "header":
                    headers[setting["key"]] = setting["value"]
        data = None
        if body is not None:
            headers.setdefault("Content-Type", "application/json")
            data = json.dumps(self.sanitize_for_serialization(body)) if "json" in headers["Content-Type"].lower() else body
        response = self.rest_client.pool_manager.request(
            method.upper(), url, body=data, headers=headers, preload_content=_preload_content, timeout=_timeout(_request_timeout)
        )
        if not 200 <= response.status <= 299:
            raise ApiException(http_resp=response)
        if not _preload_content:
            return response
        result = self._decode(response, response_type)
        return result if _return_http_data_only else (result, response.status, response.headers)

    def _decode(self, response: Any, response_type: str | None) -> Any:
        if response_type is None:
            return None
        if response_type == "str":
            return response.data.decode("utf-8", "replace")
        try:
            data = json.loads(response.data) if response.data else None
        except ValueError:
            data = response.data.decode("utf-8", "replace")
        if response_type == "object" or response_type.startswith("dict("):
            return data
        return self._library().deserialize(_Raw(json.dumps(data)), response_type)  # a generated model: the library's

    def _library(self) -> Any:
        """The client library's ApiClient on the same settings, made on first need (it imports the generated models)."""
        if self._typed is None:
            from kubernetes.client import ApiClient

            self._typed = ApiClient()
        return self._typed


class _Raw:
    def __init__(self, data: str) -> None:
        self.data = data


def _query(params: Any, formats: dict[str, str]) -> list[tuple[str, str]]:
    items = params.items() if isinstance(params, dict) else params or []
    out = []
    for key, value in items:
        if isinstance(value, (list, tuple)):
            style = formats.get(key, "csv")
            if style == "multi":
                out += [(key, _text(v)) for v in value]
                continue
            value = {"ssv": " ", "tsv": "\t", "pipes": "|"}.get(style, ",").join(_text(v) for v in value)
        out.append((key, _text(value)))
    return out


def _text(value: Any) -> str:
    return value if isinstance(value, str) else str(value)


def _timeout(value: Any) -> Any:
    if value is None:
        return None
    if isinstance(value, (int, float)):
        return urllib3.Timeout(total=value)
    connect, read = value
    return urllib3.Timeout(connect=connect, read=read)
