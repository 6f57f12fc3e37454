"""One process runs a cluster name at a time: an exclusive lock file per name."""

from __future__ import annotations

import fcntl
import os
from pathlib import Path


def acquire(path: Path) -> int | None:
    """Lock ``path`` (created if missing) without waiting; the descriptor, or None if held."""
    fd = os.open(path, os.O_RDWR | os.O_CREAT, 0o644)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        os.close(fd)
        return None
    return fd


def release(path: Path, fd: int | None) -> None:
    """Release a lock taken by :func:`acquire` and remove its file."""
    if fd is not None:
        os.close(fd)
        path.unlink(missing_ok=True)
