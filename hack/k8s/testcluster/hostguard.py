"""What the real node changes on the host, recorded before it starts and put back after.

The kubelet, containerd and the CNI plugins change host-wide state: sysctls
(``vm.overcommit_memory``, ``kernel.panic``, ...), mounts (the kubelet's root directory,
network namespaces, container root filesystems), cgroups (``/kubepods`` in every v1
hierarchy), network links (the pods' bridge and veths), iptables chains and a few
directories (``/var/lib/cni``, ``/run/containerd``). :func:`snapshot` records that state,
:func:`restore` undoes every difference it knows how to undo and :func:`leftovers` lists
what still differs, so that a teardown can fail loudly instead of leaving a changed host.
"""

from __future__ import annotations

import contextlib
import os
import shlex
import socket
import stat
import subprocess
from pathlib import Path

CGROUP_ROOT = Path("/sys/fs/cgroup")
SYSCTL_ROOT = Path("/proc/sys")
# Where the sysctls the kubelet and the CNI plugins may change live (walked whole).
SYSCTL_DIRS = ("vm", "kernel/keys", "net/ipv4/conf/all", "net/ipv4/conf/default", "net/ipv6/conf/all", "net/bridge")
SYSCTL_FILES = ("kernel/panic", "kernel/panic_on_oops", "net/ipv4/ip_forward")
# Counters and statistics, not settings.
VOLATILE_SYSCTLS = ("vm/stat_refresh", "vm/drop_caches", "vm/compact_memory", "vm/nr_", "vm/stat_interval")
# Directories the runtime creates outside its own tree (containerd's shims put their sockets
# in /run/containerd/s whatever the configuration says; the CNI library caches results in
# /var/lib/cni): when they were not there before, their empty directories are removed
# (never a file: another containerd on the machine may use them too).
HOST_DIRS = ("/var/lib/cni", "/run/containerd")
IPTABLES = ("iptables-save", "ip6tables-save")


def _read(path: Path) -> str | None:
    try:
        return path.read_text().strip()
    except OSError:
        return None


def sysctls() -> dict[str, str]:
    """The readable sysctls the node may change (``vm/overcommit_memory`` -> ``"0"``)."""
    out: dict[str, str] = {}
    for d in SYSCTL_DIRS:
        root = SYSCTL_ROOT / d
        for p in sorted(root.rglob("*")) if root.is_dir() else []:
            key = str(p.relative_to(SYSCTL_ROOT))
            if p.is_file() and os.access(p, os.R_OK) and not key.startswith(VOLATILE_SYSCTLS):
                value = _read(p)
                if value is not None:
                    out[key] = value
    for key in SYSCTL_FILES:
        value = _read(SYSCTL_ROOT / key)
        if value is not None:
            out[key] = value
    return out


def mounts() -> list[str]:
    """Mount points, in mount order (``/proc/self/mountinfo``)."""
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            points.append(line.split()[4].replace("\\040", " "))
    return points


def cgroups() -> list[str]:
    """Top-level cgroups of every v1 hierarchy (``cpu/kubepods``, ...)."""
    out = []
    for h in sorted(CGROUP_ROOT.iterdir()) if CGROUP_ROOT.is_dir() else []:
        if h.is_dir() and not h.is_symlink():
            out += [f"{h.name}/{c.name}" for c in sorted(h.iterdir()) if c.is_dir()]
    return out


def links() -> list[str]:
    return sorted(os.listdir("/sys/class/net"))


def iptables() -> dict[str, list[str]]:
    """Rules and chains of every table (``iptables-save`` without counters), per command."""
    out: dict[str, list[str]] = {}
    for cmd in IPTABLES:
        try:
            text = subprocess.run([cmd], capture_output=True, text=True, timeout=30).stdout
        except (OSError, subprocess.TimeoutExpired):
            continue
        lines = []
        for line in text.splitlines():
            if line.startswith("#") or line == "COMMIT":
                continue
            if line.startswith(":"):
                line = line.split()[0]  # the chain, without policy and counters
            lines.append(line)
        out[cmd] = lines
    return out


def snapshot() -> dict:
    """The host state the node may change (JSON-serialisable)."""
    return {
        "sysctls": sysctls(),
        "mounts": mounts(),
        "cgroups": cgroups(),
        "links": links(),
        "iptables": iptables(),
        "dirs": [d for d in HOST_DIRS if os.path.lexists(d)],
    }


def new_mounts(before: dict, roots: tuple[str, ...]) -> list[str]:
    """Mount points under ``roots`` that were not there before."""
    old = set(before["mounts"])
    prefixes = tuple(r.rstrip("/") + "/" for r in roots)
    return [m for m in mounts() if m not in old and (m + "/").startswith(prefixes)]


def unmount(points: list[str]) -> None:
    """Detach mounts, deepest (latest) first."""
    for m in reversed(points):
        subprocess.run(["umount", "-l", m], capture_output=True, timeout=30)


def remove_cgroup(path: Path) -> None:
    """Remove a cgroup directory tree, leaves first (the processes in it must be gone)."""
    for d in sorted((p for p in path.rglob("*") if p.is_dir()), key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        path.rmdir()


def cgroup_pids(path_in_hierarchy: str) -> set[int]:
    """Every process in ``/<path>`` of any v1 hierarchy, sub-cgroups included."""
    pids: set[int] = set()
    for h in CGROUP_ROOT.iterdir() if CGROUP_ROOT.is_dir() else []:
        root = h / path_in_hierarchy.strip("/")
        if not root.is_dir():
            continue
        # os.walk, not Path.rglob: a pod's cgroup removed while it is read is skipped, not an error.
        for folder, _, files in os.walk(root):
            if "cgroup.procs" in files:
                with contextlib.suppress(OSError, ValueError):
                    pids |= {int(x) for x in (Path(folder) / "cgroup.procs").read_text().split()}
    return pids


def _iptables_undo(cmd: str, before: list[str], after: list[str]) -> None:
    binary = cmd.replace("-save", "")
    old = set(before)
    table = ""
    new_chains: list[tuple[str, str]] = []
    for line in after:
        if line.startswith("*"):
            table = line[1:]
        elif line.startswith("-A ") and line not in old:
            args = shlex.split(line)
            args[0] = "-D"
            subprocess.run([binary, "-w", "-t", table, *args], capture_output=True, timeout=30)
        elif line.startswith(":") and line not in old:
            new_chains.append((table, line[1:]))
    for table, chain in new_chains:
        subprocess.run([binary, "-w", "-t", table, "-F", chain], capture_output=True, timeout=30)
    for table, chain in new_chains:
        subprocess.run([binary, "-w", "-t", table, "-X", chain], capture_output=True, timeout=30)


def dead_socket(path: Path) -> bool:
    """Whether ``path`` is a Unix socket nobody listens on (its server died: a shim killed with
    the machine's processes leaves its socket file behind). A socket in use is not dead."""
    try:
        if not stat.S_ISSOCK(path.lstat().st_mode):
            return False
    except OSError:
        return False
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(2)
    try:
        sock.connect(str(path))
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    finally:
        sock.close()
    return False


def remove_dead_sockets(path: str) -> None:
    """Remove the dead Unix sockets under ``path`` (never another file, nor a socket in use)."""
    for p in Path(path).rglob("*"):
        if dead_socket(p):
            with contextlib.suppress(OSError):
                p.unlink()


def remove_empty_dirs(path: str) -> None:
    """Remove ``path`` and the directories under it, bottom-up, as far as they are empty."""
    subdirs = [p for p in Path(path).rglob("*") if p.is_dir() and not p.is_symlink()]
    for d in sorted(subdirs, key=lambda p: len(p.parts), reverse=True):
        with contextlib.suppress(OSError):
            d.rmdir()
    with contextlib.suppress(OSError):
        os.rmdir(path)


def restore(before: dict, roots: tuple[str, ...], links_ours: tuple[str, ...] = (), cgroups_ours: tuple[str, ...] = ("kubepods",)) -> None:
    """Undo what changed since ``before``: mounts under ``roots``, the cgroups named
    ``cgroups_ours``, the new links named in ``links_ours`` (a bridge; its veths go with the
    pods' network namespaces), new iptables rules and chains, sysctls, the runtime's empty
    host directories. Processes must be gone first."""
    unmount(new_mounts(before, roots))
    old_cgroups = set(before["cgroups"])
    for c in cgroups():
        if c not in old_cgroups and c.split("/", 1)[1].startswith(cgroups_ours):
            remove_cgroup(CGROUP_ROOT / c)
    old_links = set(before["links"])
    for name in links():
        if name not in old_links and name in links_ours:
            subprocess.run(["ip", "link", "delete", name], capture_output=True, timeout=30)
    now = iptables()
    for cmd, rules in before["iptables"].items():
        if now.get(cmd, rules) != rules:
            _iptables_undo(cmd, rules, now[cmd])
    current = sysctls()
    for key, value in before["sysctls"].items():
        if current.get(key, value) != value:
            with contextlib.suppress(OSError):
                (SYSCTL_ROOT / key).write_text(value)
    for d in HOST_DIRS:
        if d not in before["dirs"] and os.path.isdir(d) and not os.path.islink(d):
            remove_dead_sockets(d)
            remove_empty_dirs(d)


def leftovers(before: dict, roots: tuple[str, ...]) -> list[str]:
    """What still differs from ``before`` (empty when the host is as it was)."""
    left = [f"mount {m}" for m in new_mounts(before, roots)]
    left += [f"cgroup {c}" for c in sorted(set(cgroups()) - set(before["cgroups"]))]
    left += [f"link {n}" for n in sorted(set(links()) - set(before["links"]))]
    now = iptables()
    for cmd, rules in before["iptables"].items():
        old = set(rules)
        left += [f"{cmd}: {r}" for r in now.get(cmd, []) if r not in old and not r.startswith("*")]
    current = sysctls()
    left += [f"sysctl {k}={current[k]} (was {v})" for k, v in before["sysctls"].items() if current.get(k, v) != v]
    for d in HOST_DIRS:
        if d not in before["dirs"] and os.path.lexists(d):
            held = sorted(str(p) for p in Path(d).rglob("*") if not p.is_dir())[:3] if os.path.isdir(d) else []
            left.append(f"directory {d}" + (f" (holding {', '.join(held)})" if held else ""))
    return left
