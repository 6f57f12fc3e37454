"""The real node's cleanup after a crash: a shim killed with the machine's processes leaves its
socket in containerd's host directory; a dead socket goes, a socket in use and other files stay."""

from __future__ import annotations

import socket
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))
from testcluster import hostguard  # noqa: E402  (hack/k8s/testcluster)


def _bound(path: Path, listen: bool) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(str(path))
    if listen:
        sock.listen(1)
    return sock


def test_only_dead_sockets_are_removed_and_the_directory_then_goes(tmp_path: Path) -> None:
    host_dir = tmp_path / "containerd"
    (host_dir / "s").mkdir(parents=True)
    dead = _bound(host_dir / "s" / "dead", listen=False)
    dead.close()  # the file stays, nobody listens: what a killed shim leaves
    live = _bound(host_dir / "s" / "live", listen=True)
    (host_dir / "s" / "file").write_text("another runtime's")
    try:
        assert hostguard.dead_socket(host_dir / "s" / "dead")
        assert not hostguard.dead_socket(host_dir / "s" / "live")
        assert not hostguard.dead_socket(host_dir / "s" / "file")
        hostguard.remove_dead_sockets(str(host_dir))
        assert sorted(p.name for p in (host_dir / "s").iterdir()) == ["file", "live"]
    finally:
        live.close()
    (host_dir / "s" / "live").unlink()
    (host_dir / "s" / "file").unlink()
    dead = _bound(host_dir / "s" / "dead", listen=False)
    dead.close()
    hostguard.remove_dead_sockets(str(host_dir))
    hostguard.remove_empty_dirs(str(host_dir))
    assert not host_dir.exists()
