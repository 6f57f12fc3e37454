"""Processes on this machine: identity that survives pid reuse, liveness, killing a whole tree, a free port.

A pid alone does not name a process: after it exits, the kernel hands the number to the next
one. ``(pid, start time)`` does: the start time (clock ticks after boot, field 22 of
``/proc/<pid>/stat``) of the process now holding the pid must equal the recorded one.

Example:
    >>> import os
    >>> me = ProcessId.of(os.getpid())
    >>> me.alive()
    True
    >>> ProcessId(me.pid, me.start + 1).alive()   # same pid, another process
    False
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

KILL_GRACE = 5.0


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/<pid>/stat after the command name (state is [0], start time is [19])."""
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None


def process_start(pid: int) -> int | None:
    """When ``pid`` started (clock ticks after boot); None when no such process (or no /proc)."""
    fields = _stat_fields(pid)
    try:
        return int(fields[19]) if fields else None
    except (IndexError, ValueError):
        return None


def free_port() -> int:
    """A free TCP port on 127.0.0.1 (for a local job's rendezvous, a test's server)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def pid_alive(pid: int) -> bool:
    """Whether a process with this pid runs (a zombie does not: it only waits to be reaped)."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        pass  # exists, owned by someone else
    fields = _stat_fields(pid)
    return fields is not None and fields[0] != "Z"


@dataclass(frozen=True)
class ProcessId:
    """A process on this machine, named so that a reused pid does not match."""

    pid: int
    start: int

    @classmethod
    def of(cls, pid: int) -> ProcessId:
        """The process holding ``pid`` now (start 0 when /proc cannot tell)."""
        return cls(pid, process_start(pid) or 0)

    def alive(self) -> bool:
        """The same process still runs (not a newer one that got its pid)."""
        if not pid_alive(self.pid):
            return False
        start = process_start(self.pid)
        return start is None or not self.start or start == self.start

    def to_json(self) -> list[int]:
        """``[pid, start]`` for state files and annotations."""
        return [self.pid, self.start]

    @classmethod
    def from_json(cls, value: object) -> ProcessId | None:
        """Read :meth:`to_json` (or a bare pid from older state files: start unknown)."""
        if isinstance(value, int) and not isinstance(value, bool):
            return cls(value, 0)
        if isinstance(value, (list, tuple)) and len(value) == 2 and all(isinstance(v, int) for v in value):
            return cls(int(value[0]), int(value[1]))
        return None


def descendants(pid: int) -> list[int]:
    """All live descendants of ``pid`` (from /proc), children before grandchildren.

    torchrun starts its workers in sessions of their own, so a process group is not
    enough to find them.
    """
    children: dict[int, list[int]] = {}
    for stat in Path("/proc").glob("[0-9]*/stat"):
        fields = _stat_fields(int(stat.parent.name))
        if fields:
            children.setdefault(int(fields[1]), []).append(int(stat.parent.name))
    found, queue = [], list(children.get(pid, []))
    while queue:
        child = queue.pop(0)
        found.append(child)
        queue.extend(children.get(child, []))
    return found


def signal_all(pids: list[int], sig: int) -> None:
    """Send ``sig`` to each pid that still exists."""
    for pid in pids:
        try:
            os.kill(pid, sig)
        except (ProcessLookupError, PermissionError):
            pass


def kill_tree(pid: int, *, grace: float = KILL_GRACE, reap: subprocess.Popen[bytes] | None = None) -> None:
    """SIGTERM ``pid`` (torchrun then stops its workers), then SIGKILL whatever of its tree is left."""
    tree = descendants(pid)
    signal_all([pid], signal.SIGTERM)
    deadline = time.monotonic() + grace
    while time.monotonic() < deadline:
        if reap is not None and reap.poll() is not None and not any(pid_alive(p) for p in tree):
            break
        if reap is None and not pid_alive(pid):
            break
        time.sleep(0.1)
    signal_all([pid, *tree, *descendants(pid)], signal.SIGKILL)
    if reap is not None:
        reap.wait()


def kill_process(process: ProcessId, *, grace: float = KILL_GRACE) -> None:
    """Kill ``process`` and its tree, only if it is still that process (never a pid's new owner)."""
    if process.alive():
        kill_tree(process.pid, grace=grace)
