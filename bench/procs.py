"""Child processes whose output is timestamped as it arrives, chunk by chunk.

A :class:`Proc` notes the wall-clock time just before it spawns the child and the arrival time
of each chunk of its stdout (read by a thread as soon as the pipe has data), so the bench can
say when a given line came out: a launcher's summary line (it returned), the first and the last
line of a relayed log. With each chunk it also reads the child's CPU time so far (all its
threads, from ``/proc``), so the bench can say what the child spent between two lines.

Example:
    >>> import sys
    >>> p = Proc([sys.executable, "-c", "print('hello'); print('DONE')"])
    >>> p.wait(30)
    0
    >>> p.line_time(b"DONE") >= p.spawned
    True
"""

from __future__ import annotations

import bisect
import os
import signal
import subprocess
import threading
import time
from collections.abc import Mapping
from pathlib import Path


class Proc:
    """A child process with timestamped stdout (stderr goes to a file, or is discarded)."""

    def __init__(
        self, cmd: list[str], *, env: Mapping[str, str] | None = None, stderr: Path | None = None, cwd: Path | None = None
    ) -> None:
        self.cmd = cmd
        self._err = open(stderr, "wb") if stderr else subprocess.DEVNULL  # noqa: SIM115 - closed in wait()
        self.spawned = time.time()
        self.popen = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=self._err, env=dict(env) if env else None, cwd=cwd)
        self.ended = 0.0
        self.cpu_s: float | None = None  # user + system CPU seconds of the child, once it exited
        self._exited = threading.Event()
        self._waiter = threading.Thread(target=self._reap, daemon=True)
        self._waiter.start()
        self._times: list[float] = []
        self._cpu: list[float | None] = []  # the child's CPU seconds when each chunk arrived
        self._ends: list[int] = []  # byte offset where each chunk ends
        self._chunks: list[bytes] = []
        self._marker: bytes | None = None
        self._tail = b""
        self.seen = threading.Event()  # the marker of watch_for() came out
        self._reader = threading.Thread(target=self._read, daemon=True)
        self._reader.start()

    def _read(self) -> None:
        assert self.popen.stdout is not None
        fd = self.popen.stdout.fileno()
        size = 0
        while True:
            data = os.read(fd, 1 << 20)
            now = time.time()
            if not data:
                return
            size += len(data)
            self._chunks.append(data)
            self._cpu.append(cpu_seconds(self.popen.pid))
            self._times.append(now)
            self._ends.append(size)
            if self._marker:
                window = self._tail + data
                if self._marker in window:
                    self.seen.set()
                self._tail = window[-len(self._marker) :]

    def watch_for(self, marker: bytes) -> threading.Event:
        """An event set once ``marker`` comes out (call right after starting, before it can)."""
        self._marker = marker
        if marker in self.output:
            self.seen.set()
        return self.seen

    def _reap(self) -> None:
        _, status, usage = os.wait4(self.popen.pid, 0)
        self.ended = time.time()
        self.cpu_s = usage.ru_utime + usage.ru_stime
        self.popen.returncode = os.waitstatus_to_exitcode(status)
        self._exited.set()

    def wait(self, timeout: float | None = None) -> int:
        """Wait for the child to exit and its output to be read; its exit code.

        Raises:
            subprocess.TimeoutExpired: It ran longer than ``timeout`` (it is killed first).
        """
        if not self._exited.wait(timeout):
            self.kill()
            raise subprocess.TimeoutExpired(self.cmd, timeout or 0)
        code = self.popen.returncode
        self._reader.join(30)
        if self._err is not subprocess.DEVNULL:
            self._err.close()
        return code

    def kill(self) -> None:
        """Kill the child (and wait for it)."""
        if not self._exited.is_set():
            try:
                os.kill(self.popen.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._exited.wait(30)

    @property
    def output(self) -> bytes:
        """Everything the child printed so far."""
        return b"".join(self._chunks)

    def _chunk(self, offset: int) -> int:
        """The index of the chunk that brought the byte at ``offset`` of the output (the last one, past the end)."""
        return min(bisect.bisect_right(self._ends, offset), len(self._ends) - 1)

    def time_at(self, offset: int) -> float:
        """When the byte at ``offset`` of the output arrived."""
        return self._times[self._chunk(offset)]

    def cpu_at(self, offset: int) -> float | None:
        """The child's CPU seconds (user + system, all threads) when the byte at ``offset`` of the output arrived."""
        return self._cpu[self._chunk(offset)]

    def line_time(self, prefix: bytes) -> float | None:
        """When the first line starting with ``prefix`` arrived (complete); None if none did."""
        out = self.output
        if out.startswith(prefix):
            at = 0
        else:
            at = out.find(b"\n" + prefix) + 1
            if at == 0:
                return None
        end = out.find(b"\n", at)
        return self.time_at(end if end >= 0 else len(out) - 1)

    def lines(self) -> list[str]:
        """The output as text lines."""
        return self.output.decode("utf-8", errors="replace").splitlines()


_TICK = os.sysconf("SC_CLK_TCK")


def cpu_seconds(pid: int) -> float | None:
    """User + system CPU seconds of a running process so far (None once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat", "rb") as f:
            stat = f.read()
    except OSError:
        return None
    fields = stat[stat.rindex(b")") + 2 :].split()  # after the command name, which may hold spaces
    return (int(fields[11]) + int(fields[12])) / _TICK  # utime, stime: fields 14 and 15 of the line


def python_env(extra: Mapping[str, str] | None = None) -> dict[str, str]:
    """The environment for a Python child: UTF-8 output, no user site, no proxies, bytecode caches on.

    An installed package runs from its compiled bytecode; a ``PYTHONDONTWRITEBYTECODE`` in the
    caller's environment would make every launcher compile the package's sources anew.
    """
    env = {k: v for k, v in os.environ.items() if k.lower() not in ("http_proxy", "https_proxy", "all_proxy", "pythondontwritebytecode")}
    env.update({"PYTHONIOENCODING": "utf-8", "PYTHONNOUSERSITE": "1", "NO_PROXY": "127.0.0.1,localhost", "no_proxy": "127.0.0.1,localhost"})
    env.pop("KUBECONFIG", None)
    env.update(extra or {})
    return env
