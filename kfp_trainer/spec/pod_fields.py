"""Checks of the typed pod fields a TrainJob patches onto its runtime's pods, and of ``managed_by``. Pure.

Scheduling gates, the pods' and the trainer container's security contexts, the termination
grace period and patches of the runtime's init containers reach the pods through
``runtimePatches`` (Trainer v2.2+; v2.1's ``podTemplateOverrides`` has only scheduling gates
and init container env and mounts). What the Trainer API cannot do is refused here with the
reason: it patches only **init containers its runtime defines** (env, volume mounts, security
context -- not image or command; the Trainer's webhook lets an unknown name through and the
JobSet's Jobs then cannot be created, so :func:`check_runtime_init_containers` checks it against
the runtime), and ``terminationGracePeriodSeconds`` needs Trainer v2.3.
Host access in a security context (:mod:`~kfp_trainer.spec.host_access`) is refused unless the
cluster admin allows it on the runtime.

Example:
    >>> from kfp_trainer.spec import TrainJobInputs
    >>> [str(e) for e in check_pod_fields(TrainJobInputs(scheduling_gates=["example.com/gate", "bad gate"]), "v2.2", False)]
    ["scheduling_gates[1]: got 'bad gate'; expected a scheduling gate name: [prefix/]name (a qualified name)"]
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

from ..errors import ValidationError
from ..numbers import int_in
from . import env_rules, rules
from .host_access import HOST_ADMIN, host_settings
from .inputs import INT64_MAX, MANAGERS, MULTIKUEUE, TrainJobInputs

MAX_SCHEDULING_GATES = 16  # the TrainJob CRD's limit
POD_SECURITY_KEYS = (
    "appArmorProfile", "fsGroup", "fsGroupChangePolicy", "runAsGroup", "runAsNonRoot", "runAsUser", "seLinuxChangePolicy",
    "seLinuxOptions", "seccompProfile", "supplementalGroups", "supplementalGroupsPolicy", "sysctls", "windowsOptions",
)  # fmt: skip
CONTAINER_SECURITY_KEYS = (
    "allowPrivilegeEscalation", "appArmorProfile", "capabilities", "privileged", "procMount", "readOnlyRootFilesystem",
    "runAsGroup", "runAsNonRoot", "runAsUser", "seLinuxOptions", "seccompProfile", "windowsOptions",
)  # fmt: skip
INIT_CONTAINER_KEYS = ("name", "env", "volumeMounts", "securityContext")
_CHOICES = {
    "fsGroupChangePolicy": ("OnRootMismatch", "Always"),
    "seLinuxChangePolicy": ("MountOption", "Recursive"),
    "supplementalGroupsPolicy": ("Merge", "Strict"),
    "procMount": ("Default", "Unmasked"),
}
_PROFILES = ("RuntimeDefault", "Localhost", "Unconfined")
_INIT_ONLY = (
    "a patch of an init container the runtime defines: {keys}{note} -- the Trainer API cannot add init containers or set "
    "their image or command; define those in a TrainingRuntime"
)


def check_security_context(field: str, value: Any, keys: Sequence[str], allow_host_access: bool | None) -> list[ValidationError]:
    """A (pod or container) security context: known keys, value types, no host access unless allowed."""
    if not isinstance(value, dict):
        return [ValidationError(field, value, "a map (a Kubernetes SecurityContext)")]
    errors = [ValidationError(f"{field}.{k}", value[k], f"a SecurityContext field: {', '.join(keys)}") for k in value if k not in keys]
    for key in ("runAsUser", "runAsGroup", "fsGroup"):
        if key in value and not int_in(value[key], 0, INT64_MAX):
            errors.append(ValidationError(f"{field}.{key}", value[key], "a user or group id >= 0"))
    for key in ("runAsNonRoot", "privileged", "allowPrivilegeEscalation", "readOnlyRootFilesystem"):
        if key in value and not isinstance(value[key], bool):
            errors.append(ValidationError(f"{field}.{key}", value[key], "true or false"))
    groups = value.get("supplementalGroups", [])
    if not isinstance(groups, list) or not all(int_in(g, 0, INT64_MAX) for g in groups):
        errors.append(ValidationError(f"{field}.supplementalGroups", groups, "a list of group ids >= 0"))
    for key, choices in _CHOICES.items():
        if key in value and value[key] not in choices:
            errors.append(ValidationError(f"{field}.{key}", value[key], " or ".join(choices)))
    for key in ("seccompProfile", "appArmorProfile"):
        if key in value and (not isinstance(value[key], dict) or value[key].get("type") not in _PROFILES):
            errors.append(ValidationError(f"{field}.{key}", value[key], f"{{type: {' | '.join(_PROFILES)}[, localhostProfile]}}"))
    sysctls = value.get("sysctls", [])
    if not isinstance(sysctls, list) or not all(isinstance(s, dict) and set(s) == {"name", "value"} for s in sysctls):
        errors.append(ValidationError(f"{field}.sysctls", sysctls, "a list of {name, value}"))
    errors += rules.check_structure(field, value) or [e for text in _strings(value) for e in rules.check_secret_text(field, text)][:1]
    if not errors and allow_host_access is False:
        for where, setting in host_settings(value):
            path = field + "".join(f"[{p}]" if isinstance(p, int) else f".{p}" for p in where)
            errors.append(ValidationError(path, setting, "unset: " + HOST_ADMIN))
    return errors


def _strings(value: Any) -> list[str]:
    if isinstance(value, dict):
        return [s for v in value.values() for s in _strings(v)]
    if isinstance(value, list):
        return [s for v in value for s in _strings(v)]
    return [value] if isinstance(value, str) else []


def check_init_containers(inputs: TrainJobInputs, api_version: str | None, allow_host_access: bool | None) -> list[ValidationError]:
    """Patches of the runtime's init containers: ``{name, env, volumeMounts, securityContext}``."""
    errors: list[ValidationError] = []
    keys = INIT_CONTAINER_KEYS[:-1] if api_version == "v2.1" else INIT_CONTAINER_KEYS
    names: set[str] = set()
    for i, item in enumerate(inputs.init_containers):
        where = f"init_containers[{i}]"
        if not isinstance(item, dict) or not rules.ok(rules.DNS_LABEL, item.get("name"), 63):
            allowed = _INIT_ONLY.format(keys="{name (a DNS label), " + ", ".join(keys[1:]) + "}", note="")
            errors.append(ValidationError(where, item, allowed))
            continue
        extra = sorted(set(item) - set(keys))
        if extra:
            note = " (Trainer v2.1 has no securityContext here)" if api_version == "v2.1" and "securityContext" in extra else ""
            errors.append(ValidationError(f"{where}.{extra[0]}", "...", _INIT_ONLY.format(keys=", ".join(keys), note=note)))
        if item["name"] in names:
            errors.append(ValidationError(f"{where}.name", item["name"], "each init container once"))
        names.add(item["name"])
        if "env" in item:
            errors += env_rules.check_env(f"{where}.env", item["env"])
        mounts = item.get("volumeMounts", [])
        if not isinstance(mounts, list):
            errors.append(ValidationError(f"{where}.volumeMounts", mounts, "a list of VolumeMounts"))
            mounts = []
        for j, mount in enumerate(mounts):
            at = f"{where}.volumeMounts[{j}]"
            if not isinstance(mount, dict) or not rules.ok(rules.DNS_LABEL, mount.get("name"), 63):
                errors.append(ValidationError(at, mount, "a VolumeMount {name, mountPath[, subPath, readOnly]}"))
                continue
            errors += rules.check_local_path(f"{at}.mountPath", mount.get("mountPath"), absolute=True)
            if "subPath" in mount:
                errors += rules.check_local_path(f"{at}.subPath", mount["subPath"], absolute=False)
            if mount.get("mountPropagation") == "Bidirectional" and allow_host_access is False:
                errors.append(ValidationError(f"{at}.mountPropagation", "Bidirectional", "unset: " + HOST_ADMIN))
        if "securityContext" in item and "securityContext" in keys:
            context = item["securityContext"]
            errors += check_security_context(f"{where}.securityContext", context, CONTAINER_SECURITY_KEYS, allow_host_access)
        errors += rules.check_structure(where, item)
    return errors


def check_pod_fields(inputs: TrainJobInputs, api_version: str | None, allow_host_access: bool | None) -> list[ValidationError]:
    """Every problem of the scheduling gates, security contexts, grace period, init containers and managed_by."""
    e: list[ValidationError] = []
    gates = inputs.scheduling_gates
    if len(gates) > MAX_SCHEDULING_GATES:
        e.append(ValidationError("scheduling_gates", f"{len(gates)} gates", f"at most {MAX_SCHEDULING_GATES}"))
    for i, gate in enumerate(gates):
        prefix, _, name = gate.rpartition("/")
        if not rules.ok(rules.QUALIFIED_NAME, name, 63) or (prefix and not rules.ok(rules.DNS_SUBDOMAIN, prefix, 253)):
            e.append(ValidationError(f"scheduling_gates[{i}]", gate, "a scheduling gate name: [prefix/]name (a qualified name)"))
        elif gate in gates[:i]:
            e.append(ValidationError(f"scheduling_gates[{i}]", gate, "each gate once"))
    for field, keys in (("security_context", POD_SECURITY_KEYS), ("container_security_context", CONTAINER_SECURITY_KEYS)):
        value = getattr(inputs, field)
        if value and api_version == "v2.1":
            e.append(ValidationError(field, "...", "unset: Trainer v2.1 cannot patch security contexts (v2.2+)"))
        elif value:
            e += check_security_context(field, value, keys, allow_host_access)
    grace = inputs.termination_grace_period_seconds
    if grace is not None and not 0 <= grace <= INT64_MAX:
        e.append(ValidationError("termination_grace_period_seconds", grace, "a whole number of seconds >= 0"))
    elif grace is not None and api_version == "v2.1":
        e.append(ValidationError("termination_grace_period_seconds", grace, "unset: Trainer v2.1 cannot patch it (v2.3+)"))
    e += check_init_containers(inputs, api_version, allow_host_access)
    if inputs.managed_by and inputs.managed_by not in MANAGERS:
        e.append(ValidationError("managed_by", inputs.managed_by, f"unset, {' or '.join(MANAGERS)} (what the TrainJob API allows)"))
    elif inputs.managed_by == MULTIKUEUE and not inputs.queue_name:
        e.append(ValidationError("queue_name", "", f"a Kueue LocalQueue when managed_by is {MULTIKUEUE} (only Kueue dispatches such jobs)"))
    return e


def check_runtime_init_containers(
    inputs: TrainJobInputs, targets: Sequence[str], runtime: Mapping[str, Sequence[str]]
) -> list[ValidationError]:
    """Each patched init container must exist in one of the targeted replicated jobs of the runtime."""
    known = sorted({name for job in targets for name in runtime.get(job, ())})
    errors = []
    for i, item in enumerate(inputs.init_containers):
        if item.get("name") not in known:
            where = ", ".join(targets)
            errors.append(
                ValidationError(
                    f"init_containers[{i}].name", item.get("name"),
                    f"an init container the runtime defines in {where} ({', '.join(known) or 'it defines none'}): "
                    "the Trainer API patches only those; add init containers to a TrainingRuntime",
                )
            )  # fmt: skip
    return errors
