"""Custom objects and pods as plain dicts: the client library's method names, none of its generated models.

:class:`CustomObjects` has the methods of the library's ``CustomObjectsApi`` that the backend
calls, with the same arguments (keyword options are its snake_case query parameters); a patch
is a JSON merge patch, as there. :class:`Pods` reads one pod as a dict.

Example:
    >>> _query({"label_selector": "a=b", "field_validation": "Strict", "_request_timeout": 5})
    [('labelSelector', 'a=b'), ('fieldValidation', 'Strict')]
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any
from urllib.parse import quote

from .api import request

if TYPE_CHECKING:
    from .rest import Client as ApiClient

MERGE_PATCH = "application/merge-patch+json"


def _query(options: dict[str, Any]) -> list[tuple[str, Any]]:
    """Keyword options as query parameters (``label_selector`` -> ``labelSelector``); ``_``-prefixed ones are not sent."""
    out = []
    for key, value in options.items():
        if key.startswith("_") or value is None:
            continue
        head, *rest = key.split("_")
        out.append((head + "".join(word.capitalize() for word in rest), "true" if value is True else "false" if value is False else value))
    return out


def _path(*parts: str) -> str:
    return "/".join(quote(str(p), safe="") for p in parts)


class CustomObjects:
    """Custom resources through :func:`~kfp_trainer.backends.kube.api.request`."""

    def __init__(self, api: ApiClient, timeout: float | tuple[float, float] = (10, 60)) -> None:
        self.api = api
        self.timeout = timeout

    def _send(self, path: str, options: dict[str, Any], **kwargs: Any) -> Any:
        timeout = options.get("_request_timeout") or self.timeout
        return request(self.api, path, _query(options), timeout=timeout, **kwargs)

    def get_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str, **options: Any) -> Any:
        """GET one namespaced object."""
        return self._send(f"/apis/{_path(group, version)}/namespaces/{_path(namespace, plural, name)}", options)

    def get_cluster_custom_object(self, group: str, version: str, plural: str, name: str, **options: Any) -> Any:
        """GET one cluster-scoped object."""
        return self._send(f"/apis/{_path(group, version, plural, name)}", options)

    def list_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, **options: Any) -> Any:
        """LIST the objects of a namespace (``label_selector`` ...)."""
        return self._send(f"/apis/{_path(group, version)}/namespaces/{_path(namespace, plural)}", options)

    def list_cluster_custom_object(self, group: str, version: str, plural: str, **options: Any) -> Any:
        """LIST cluster-scoped objects."""
        return self._send(f"/apis/{_path(group, version, plural)}", options)

    def create_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, body: Any, **options: Any) -> Any:
        """POST a new object (``field_validation``, ``dry_run`` ...)."""
        return self._send(f"/apis/{_path(group, version)}/namespaces/{_path(namespace, plural)}", options, method="POST", body=body)

    def patch_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str, body: Any,
                                       **options: Any) -> Any:  # fmt: skip
        """PATCH an object with a JSON merge patch."""
        path = f"/apis/{_path(group, version)}/namespaces/{_path(namespace, plural, name)}"
        return self._send(path, options, method="PATCH", body=body, headers={"Content-Type": MERGE_PATCH})

    def delete_namespaced_custom_object(self, group: str, version: str, namespace: str, plural: str, name: str, *,
                                        body: Any = None, **options: Any) -> Any:  # fmt: skip
        """DELETE an object (``propagation_policy``; ``body``: DeleteOptions such as preconditions)."""
        path = f"/apis/{_path(group, version)}/namespaces/{_path(namespace, plural, name)}"
        return self._send(path, options, method="DELETE", body=body)


class Pods:
    """Pods as dicts."""

    def __init__(self, api: ApiClient, timeout: float | tuple[float, float] = (10, 60)) -> None:
        self.api = api
        self.timeout = timeout

    def read_namespaced_pod(self, name: str, namespace: str, **options: Any) -> dict[str, Any]:
        """GET one pod."""
        timeout = options.get("_request_timeout") or self.timeout
        return request(self.api, f"/api/v1/namespaces/{_path(namespace)}/pods/{_path(name)}", _query(options), timeout=timeout)
