"""Merge a KFP task's ``dsl.TaskConfig`` into TrainJob inputs. Pure: no I/O.

A pipeline author sets resources, env, node selectors, tolerations, affinity and volumes
on the ``train_job`` task the usual way (``set_cpu_limit``, ``set_env_variable``,
``kfp.kubernetes.add_toleration``, ``kfp.kubernetes.mount_pvc``, ...). The component
declares those fields as passthroughs, so KFP hands them to the launcher as Kubernetes
JSON instead of (or, for env and volumes, as well as) applying them to the launcher's own
pod. :func:`merge_task_config` folds them into the TrainJob inputs; inputs given
explicitly to the component win.

Example:
    >>> merged = merge_task_config(
    ...     {"env": {"EPOCHS": "3"}, "node_selector": {"pool": "a"}},
    ...     {"env": [{"name": "EPOCHS", "value": "1"}, {"name": "HF_HOME", "value": "/cache"}],
    ...      "node_selector": {"pool": "b", "zone": "z1"},
    ...      "resources": {"limits": {"nvidia.com/gpu": "1"}}})
    >>> merged["env"]
    [{'name': 'HF_HOME', 'value': '/cache'}, {'name': 'EPOCHS', 'value': '3'}]
    >>> merged["node_selector"]
    {'pool': 'a', 'zone': 'z1'}
    >>> merged["resources_per_node"]
    {'limits': {'nvidia.com/gpu': '1'}}
"""

from __future__ import annotations

import copy
import json
from collections.abc import Mapping
from typing import Any

FIELDS = ("resources", "env", "node_selector", "tolerations", "affinity", "volumes", "volume_mounts")
_CAMEL = {"nodeSelector": "node_selector", "volumeMounts": "volume_mounts"}


def task_config_dict(task_config: Any) -> dict[str, Any]:
    """The set fields of a ``dsl.TaskConfig`` (or a dict in KFP's JSON shape), snake_case.

    Example:
        >>> task_config_dict({"nodeSelector": {"a": "b"}, "env": None})
        {'node_selector': {'a': 'b'}}
    """
    if task_config is None:
        return {}
    if isinstance(task_config, Mapping):
        raw = {_CAMEL.get(k, k): v for k, v in task_config.items()}
    else:
        raw = {f: getattr(task_config, f, None) for f in FIELDS}
    return {k: copy.deepcopy(v) for k, v in raw.items() if k in FIELDS and v}


def _env_items(env: Any) -> list[dict[str, Any]] | None:
    """Env as a list of EnvVar dicts; ``None`` when it has neither accepted shape (left for validation)."""
    if not env:
        return []
    if isinstance(env, Mapping):
        return [{"name": k, "value": v} for k, v in env.items()]
    if isinstance(env, list) and all(isinstance(e, Mapping) for e in env):
        return [dict(e) for e in env]
    return None


def _dicts(value: Any) -> list[dict[str, Any]] | None:
    """``value`` when it is a list of dicts (or empty), else ``None``."""
    if not value:
        return []
    return list(value) if isinstance(value, list) and all(isinstance(v, Mapping) for v in value) else None


def _by_name(base: list[dict[str, Any]], wins: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Items of ``base`` whose name is not in ``wins``, then ``wins`` (order kept)."""
    names = {item.get("name") for item in wins if isinstance(item.get("name"), str)}
    return [item for item in base if item.get("name") not in names] + wins


def _unique(items: list[Any]) -> list[Any]:
    seen: set[str] = set()
    out = []
    for item in items:
        key = json.dumps(item, sort_keys=True, default=str)
        if key not in seen:
            seen.add(key)
            out.append(item)
    return out


def merge_task_config(inputs: Mapping[str, Any], task_config: Any) -> dict[str, Any]:
    """Fold the task's TaskConfig into TrainJob inputs; explicit inputs win.

    * ``resources`` becomes ``resources_per_node`` unless that is given;
    * ``env``: one list, an explicitly given variable replaces the task's of the same name;
    * ``volumes`` and ``volume_mounts``: the task's plus the given ones (a given volume
      replaces the task's of the same name; mounts are matched by ``mountPath``);
    * ``node_selector``: keys merged, given keys win;
    * ``tolerations``: the task's plus the given ones, duplicates dropped;
    * ``affinity``: the given one if any, else the task's.

    Args:
        inputs: TrainJob inputs as the component received them (``None`` = not set).
        task_config: The component's ``dsl.TaskConfig`` (or its JSON dict), possibly empty.

    Returns:
        A new dict of inputs. A given input of the wrong type is kept as it is, for the
        validation that follows to name it.
    """
    out = {k: copy.deepcopy(v) for k, v in inputs.items()}
    tc = task_config_dict(task_config)
    if tc.get("resources") and not out.get("resources_per_node"):
        out["resources_per_node"] = tc["resources"]
    given_env, task_env = _env_items(out.get("env")), _env_items(tc.get("env"))
    if given_env is not None and task_env:
        out["env"] = _by_name(task_env, given_env)
    given_volumes, given_mounts = _dicts(out.get("volumes")), _dicts(out.get("volume_mounts"))
    if tc.get("volumes") and given_volumes is not None:
        out["volumes"] = _by_name(list(tc["volumes"]), given_volumes)
    if tc.get("volume_mounts") and given_mounts is not None:
        paths = {m.get("mountPath") for m in given_mounts if isinstance(m.get("mountPath"), str)}
        out["volume_mounts"] = [m for m in tc["volume_mounts"] if m.get("mountPath") not in paths] + given_mounts
    if tc.get("node_selector") and isinstance(out.get("node_selector") or {}, Mapping):
        out["node_selector"] = {**tc["node_selector"], **(out.get("node_selector") or {})}
    if tc.get("tolerations") and isinstance(out.get("tolerations") or [], list):
        out["tolerations"] = _unique(list(tc["tolerations"]) + list(out.get("tolerations") or []))
    if tc.get("affinity") and not out.get("affinity"):
        out["affinity"] = tc["affinity"]
    return out


def mount_covering(path: str, volume_mounts: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The volume mount (longest ``mountPath``) under which ``path`` lies, if any.

    Example:
        >>> mount_covering("/kfp-workspace/x", [{"name": "kfp-workspace", "mountPath": "/kfp-workspace"}])["name"]
        'kfp-workspace'
        >>> mount_covering("/data", [{"name": "w", "mountPath": "/kfp-workspace"}]) is None
        True
    """
    best = None
    for mount in volume_mounts or []:
        if not isinstance(mount, Mapping) or not isinstance(mount.get("mountPath"), str) or ".." in mount["mountPath"].split("/"):
            continue
        root = mount["mountPath"].rstrip("/")
        if root and (path == root or path.startswith(root + "/")):
            if best is None or len(root) > len(str(best.get("mountPath", "")).rstrip("/")):
                best = mount
    return best
