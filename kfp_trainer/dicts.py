"""Reading nested manifests (dicts and lists, as JSON gives them): the one path helper. Pure.

Example:
    >>> doc = {"spec": {"jobs": [{"name": "node"}]}}
    >>> dig(doc, "spec", "jobs", 0, "name"), dig(doc, "spec", "template", "spec")
    ('node', None)
"""

from __future__ import annotations

from typing import Any


def dig(obj: Any, *keys: Any, default: Any = None) -> Any:
    """``obj[k1][k2]...``, or ``default`` where a level is missing or not a container.

    A string key reads a mapping, an integer key a list (``0 <= key < len``).

    Example:
        >>> dig({"a": {"b": None}}, "a", "b", default="absent"), dig({"a": [1]}, "a", 5, default="absent")
        (None, 'absent')
    """
    for key in keys:
        if isinstance(obj, dict) and key in obj:
            obj = obj[key]
        elif isinstance(obj, list) and isinstance(key, int) and not isinstance(key, bool) and 0 <= key < len(obj):
            obj = obj[key]
        else:
            return default
    return obj
