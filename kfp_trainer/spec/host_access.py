"""What counts as host access in a pod spec: what the PodSecurity *baseline* level forbids. Pure.

:func:`host_settings` looks at one mapping of a TrainJob (a pod spec, a container, a security
context, a volume, ...) and names every setting in it that reaches into the host: host
namespaces and ports, ``hostPath`` volumes, privileged containers and privilege escalation,
added capabilities, bidirectional mount propagation, an unmasked ``/proc``, ``Unconfined``
seccomp or AppArmor profiles, Windows host processes, SELinux users, roles or types other
than the container ones, and sysctls outside the safe set. :mod:`kfp_trainer.spec.policy`
refuses them unless the cluster admin allows host access on the runtime.

Example:
    >>> host_settings({"privileged": True, "seLinuxOptions": {"type": "spc_t"}})
    [(('privileged',), True), (('seLinuxOptions', 'type'), 'spc_t')]
"""

from __future__ import annotations

from typing import Any

from ..dicts import dig
from .inputs import ALLOW_HOST_ACCESS_ANNOTATION

HOST_FLAGS = ("hostNetwork", "hostPID", "hostIPC", "privileged", "allowPrivilegeEscalation")
# The sysctls and SELinux types the baseline level allows (k8s.io/pod-security-admission v0.36).
SAFE_SYSCTLS = frozenset({
    "kernel.shm_rmid_forced", "net.ipv4.ip_local_port_range", "net.ipv4.tcp_syncookies", "net.ipv4.ping_group_range",
    "net.ipv4.ip_unprivileged_port_start", "net.ipv4.ip_local_reserved_ports", "net.ipv4.tcp_keepalive_time",
    "net.ipv4.tcp_fin_timeout", "net.ipv4.tcp_keepalive_intvl", "net.ipv4.tcp_keepalive_probes", "net.ipv4.tcp_rmem",
    "net.ipv4.tcp_wmem",
})  # fmt: skip
SELINUX_TYPES = frozenset({"", "container_t", "container_init_t", "container_kvm_t", "container_engine_t"})

Setting = tuple[tuple[Any, ...], Any]
#: What a host-access setting needs (the end of each such error).
HOST_ADMIN = (
    "host access is refused unless the cluster admin allows it on the ClusterTrainingRuntime "
    f'(annotation {ALLOW_HOST_ACCESS_ANNOTATION}: "true")'
)


def host_settings(obj: dict[str, Any]) -> list[Setting]:
    """``(path within obj, value)`` of every host-access setting set directly in ``obj``."""
    found: list[Setting] = [((key,), True) for key in HOST_FLAGS if obj.get(key) is True]
    if obj.get("hostPath") is not None:
        found.append((("hostPath",), obj["hostPath"]))
    if obj.get("hostPort") not in (None, 0):
        found.append((("hostPort",), obj["hostPort"]))
    if dig(obj, "capabilities", "add") not in (None, []):
        found.append((("capabilities", "add"), obj["capabilities"]["add"]))
    if obj.get("mountPropagation") == "Bidirectional":
        found.append((("mountPropagation",), "Bidirectional"))
    if obj.get("procMount") not in (None, "Default"):
        found.append((("procMount",), obj["procMount"]))
    for profile in ("seccompProfile", "appArmorProfile"):
        if dig(obj, profile, "type") == "Unconfined":
            found.append(((profile, "type"), "Unconfined"))
    if dig(obj, "windowsOptions", "hostProcess") is True:
        found.append((("windowsOptions", "hostProcess"), True))
    selinux = obj.get("seLinuxOptions")
    if isinstance(selinux, dict):
        if selinux.get("type", "") not in SELINUX_TYPES:
            found.append((("seLinuxOptions", "type"), selinux.get("type")))
        found += [(("seLinuxOptions", key), selinux[key]) for key in ("user", "role") if selinux.get(key)]
    sysctls = obj.get("sysctls")
    if isinstance(sysctls, list):
        for i, item in enumerate(sysctls):
            name = item.get("name") if isinstance(item, dict) else item
            if name not in SAFE_SYSCTLS:
                found.append((("sysctls", i, "name"), name))
    return found
