"""The two shapes of ``resources_per_node``, and whole devices. Pure.

Every component takes either shape:

* the Kubernetes one, a ResourceRequirements dict: ``{"limits": {"nvidia.com/gpu": 2, "cpu": 4}}``;
* the kubeflow SDK's flat one: ``{"gpu": 2, "cpu": 4, "memory": "16Gi"}`` (aliases ``gpu``,
  ``storage`` and ``mig-<profile>``; the SDK sets requests equal to limits).

:func:`requirements` turns the flat shape into the Kubernetes one as the SDK does. GPUs, MIG
slices and every other extended resource count whole devices, which the API server refuses to
split: :func:`fractional_devices` names the ones asked for in fractions (``0.5``, ``"500m"``).

Example:
    >>> requirements({"GPU": 1, "cpu": 4})
    {'requests': {'nvidia.com/gpu': 1, 'cpu': 4}, 'limits': {'nvidia.com/gpu': 1, 'cpu': 4}}
    >>> requirements({"limits": {"cpu": 4}})
    {'limits': {'cpu': 4}}
    >>> fractional_devices({"limits": {"nvidia.com/gpu": 0.5, "cpu": 0.5}})
    [('limits', 'nvidia.com/gpu', 0.5)]
"""

from __future__ import annotations

from typing import Any

from ..quantity import parse_quantity

SECTIONS = ("limits", "requests", "claims")
STANDARD = ("cpu", "memory", "gpu", "storage", "ephemeral-storage")
ALIASES = {"gpu": "nvidia.com/gpu", "storage": "ephemeral-storage"}
MIG_PREFIX = "nvidia.com/mig-"
_DIVISIBLE = ("cpu", "memory", "ephemeral-storage")


def is_requirements(value: Any) -> bool:
    """True for a ResourceRequirements dict (keys among limits, requests, claims), the empty dict included."""
    return isinstance(value, dict) and all(key in SECTIONS for key in value)


def flat_names(resources: dict[str, Any]) -> dict[str, Any]:
    """The SDK's flat resources with its aliases resolved (``gpu`` -> ``nvidia.com/gpu``, ``mig-1g.5gb`` -> ``nvidia.com/mig-1g.5gb``)."""
    out: dict[str, Any] = {}
    for name, quantity in resources.items():
        low = name.lower() if isinstance(name, str) else name
        key = low if low in STANDARD or (isinstance(low, str) and low.startswith("mig-")) else name
        key = ALIASES.get(key, key)
        if isinstance(key, str) and key.startswith("mig-"):
            key = MIG_PREFIX + key[len("mig-") :]
        out[key] = quantity
    return out


def requirements(value: Any) -> Any:
    """``value`` as a ResourceRequirements dict: the flat shape mapped as the SDK maps it, anything else unchanged.

    Only a map of names to plain quantities is the flat shape: ``{"limit": {...}}`` is a
    misspelt ResourceRequirements, left for validation to name.
    """
    if not isinstance(value, dict) or is_requirements(value):
        return value
    if not all(isinstance(k, str) and isinstance(v, (str, int, float)) for k, v in value.items()):
        return value
    out = flat_names(value)
    return {"requests": dict(out), "limits": dict(out)}


def is_device(name: Any) -> bool:
    """True for a resource counted in whole devices: GPUs, MIG slices, any extended resource."""
    if not isinstance(name, str):
        return False
    low = name.lower()
    return not (low in _DIVISIBLE or low == "storage" or low.startswith("hugepages-") or "kubernetes.io/" in low)


def fractional_devices(resources: Any) -> list[tuple[str, str, Any]]:
    """``(section, name, quantity)`` of each device resource asked for in a fraction, once per name and quantity.

    Unreadable quantities are left out (other checks name them).
    """
    found: list[tuple[str, str, Any]] = []
    for section in ("limits", "requests"):
        amounts = resources.get(section) if isinstance(resources, dict) else None
        for name, quantity in (amounts.items() if isinstance(amounts, dict) else ()):
            if not is_device(name):
                continue
            try:
                amount = parse_quantity(quantity)
            except (TypeError, ValueError):
                continue
            if amount != amount.to_integral_value() and not any(n == name and q == quantity for _, n, q in found):
                found.append((section, name, quantity))
    return found


def whole_devices_text(name: str) -> str:
    """What a device quantity must be, for an error message."""
    return f"a whole number: {name} counts devices, which cannot be split (ask for 1, or for a MIG slice where the cluster offers one)"
