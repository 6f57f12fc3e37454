"""Processes of the test cluster: free ports, starting daemons, finding and ending them.

``free_port`` and ``pid_alive`` are the launcher's own (:mod:`kfp_trainer.backends.procs`).
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path

from kfp_trainer.backends.procs import free_port, pid_alive  # noqa: F401 - one home; the cluster's modules import them from here


def read_pid(path: Path) -> int | None:
    with contextlib.suppress(ValueError, OSError):
        return int(path.read_text().strip())
    return None


def processes_under(path: Path) -> list[tuple[int, str]]:
    """Live processes whose command line mentions ``path`` (a cluster's directory)."""
    needle = str(path)
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            with open(f"/proc/{entry}/cmdline", "rb") as f:
                cmd = f.read().replace(b"\0", b" ").decode(errors="replace").strip()
        except OSError:
            continue
        if needle in cmd and pid_alive(int(entry)):
            found.append((int(entry), cmd))
    return found


def start_daemon(
    argv: list[str], log_path: Path, pid_path: Path, env: Mapping[str, str] | None = None, pass_fds: tuple[int, ...] = ()
) -> subprocess.Popen:
    """Start ``argv`` in its own session, output appended to ``log_path``, pid in ``pid_path``;
    ``pass_fds``: descriptors it inherits (a lock it then holds too)."""
    log_path.parent.mkdir(parents=True, exist_ok=True)
    with open(log_path, "ab") as logf:
        proc = subprocess.Popen(
            argv,
            stdout=logf,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,
            env=dict(env) if env is not None else None,
            pass_fds=pass_fds,
        )
    pid_path.write_text(str(proc.pid))
    return proc


def wait_until(check: Callable[[], bool], timeout: float, what: str, alive: Callable[[], bool] = lambda: True) -> None:
    """Poll ``check`` until it is true; fail when ``alive`` turns false or time runs out."""
    from .binaries import ClusterError

    deadline = time.monotonic() + timeout
    while True:
        with contextlib.suppress(Exception):
            if check():
                return
        if not alive():
            raise ClusterError(f"{what}: the process exited")
        if time.monotonic() > deadline:
            raise ClusterError(f"{what}: not within {timeout:.0f} s")
        time.sleep(0.05)


def port_open(port: int) -> bool:
    with contextlib.suppress(OSError):
        socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
        return True
    return False


def terminate(pids: Iterable[int], grace: float = 10) -> list[int]:
    """SIGTERM, then SIGKILL after ``grace`` s; returns the pids still alive after that."""
    left = [p for p in set(pids) if pid_alive(p)]
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5)):
        for p in left:
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, sig)
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline and any(pid_alive(p) for p in left):
            time.sleep(0.05)
        left = [p for p in left if pid_alive(p)]
        if not left:
            break
    return left


def with_feature_gates(argv: list[str], gates: str) -> list[str]:
    """``argv`` with ``--feature-gates=<gates>`` instead of its own (none when ``gates`` is empty).

    Example:
        >>> with_feature_gates(["kube-apiserver", "--feature-gates=A=true", "--v=2"], "WatchList=false")
        ['kube-apiserver', '--v=2', '--feature-gates=WatchList=false']
    """
    kept = [a for a in argv if not a.startswith("--feature-gates=")]
    return kept + ([f"--feature-gates={gates}"] if gates else [])


def restart_kwokctl_component(
    cluster_dir: Path,
    name: str,
    kill: signal.Signals = signal.SIGTERM,
    timeout: float = 60,
    args: Callable[[list[str]], list[str]] | None = None,
) -> int:
    """Stop one of kwokctl's processes (``kube-apiserver``, ``etcd``, ...) with ``kill`` and
    start it again with the same command line (or ``args(command line)``) and log; wait until
    its port answers. Returns the new pid."""
    from .binaries import ClusterError

    pidfile = cluster_dir / "pids" / f"{name}.pid"
    pid = int(pidfile.read_text().strip())
    with open(f"/proc/{pid}/cmdline", "rb") as f:
        argv = [a.decode() for a in f.read().split(b"\0") if a]
    if args is not None:
        argv = args(argv)
    cwd = os.readlink(f"/proc/{pid}/cwd")
    port = next((a.split("=", 1)[1] for a in argv if a.startswith(("--secure-port=", "--listen-client-urls="))), None)
    port = int(port.rsplit(":", 1)[-1].split(",")[0]) if port else None
    if terminate([pid], grace=10) if kill == signal.SIGTERM else _kill_now(pid, kill):
        raise ClusterError(f"{name} (pid {pid}) did not stop")
    if port:
        # The thread group leader turns zombie before the last thread has closed the socket.
        wait_until(lambda: not port_open(port), timeout, f"{name}'s port {port} to be free")
    with open(cluster_dir / "logs" / f"{name}.log", "ab") as log:
        proc = subprocess.Popen(argv, cwd=cwd, stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True)
    pidfile.write_text(str(proc.pid))
    if port:
        wait_until(lambda: port_open(port), timeout, f"{name} after its restart", alive=lambda: proc.poll() is None)
    return proc.pid


def _kill_now(pid: int, sig: signal.Signals) -> list[int]:
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, sig)
    deadline = time.monotonic() + 10
    while pid_alive(pid) and time.monotonic() < deadline:
        time.sleep(0.02)
    return [pid] if pid_alive(pid) else []
