"""The layer cache: each layer is a directory in overlayfs' upper-directory form, kept once.

A layer's directory holds what its instruction added or changed; a deletion is an overlayfs
whiteout (a 0/0 character device) and a directory that hides everything below it carries the
``trusted.overlay.opaque`` attribute, so the directories stack directly as overlayfs lower
directories when a later instruction runs. The OCI tar of a layer is written from its directory
when needed (deterministically: the same directory gives the same bytes), and its digest and size
are recorded at commit, so no second copy of a heavy layer is kept on disk.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
import stat
import tarfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

DEFAULT_ROOT = Path.home() / ".cache" / "kfp-trainer" / "images"
OPAQUE_XATTR = "trusted.overlay.opaque"
WHITEOUT = ".wh."
OPAQUE_WHITEOUT = ".wh..wh..opq"


@dataclass(frozen=True)
class Layer:
    """A committed layer: its cache key, directory, tar digest and tar size."""

    key: str
    path: Path
    digest: str
    size: int
    created_by: str


class Store:
    """Layers under ``root/layers/<key>/{fs,meta.json}``; work in progress under ``root/tmp``."""

    def __init__(self, root: Path | None = None):
        self.root = Path(root or os.environ.get("KFP_TRAINER_IMAGE_CACHE") or DEFAULT_ROOT)
        self.tmp = self.root / "tmp"
        self.layers = self.root / "layers"

    def lookup(self, key: str) -> Layer | None:
        """The committed layer for ``key``, or None."""
        meta_file = self.layers / key / "meta.json"
        if not meta_file.exists():
            return None
        meta = json.loads(meta_file.read_text())
        return Layer(key, self.layers / key / "fs", meta["digest"], meta["size"], meta["created_by"])

    @contextlib.contextmanager
    def scratch(self, name: str) -> Iterator[Path]:
        """An empty directory on the store's file system (overlayfs work dirs must be there), removed after."""
        self.tmp.mkdir(parents=True, exist_ok=True)
        path = self.tmp / f"{name}.{os.getpid()}"
        remove_tree(path)
        path.mkdir()
        try:
            yield path
        finally:
            remove_tree(path)

    @contextlib.contextmanager
    def building(self, key: str) -> Iterator[Path]:
        """An empty directory to make the layer ``key`` in; gone unless committed."""
        with self.scratch(key) as work:
            fs = work / "fs"
            fs.mkdir()
            yield fs

    def commit(self, key: str, fs: Path, created_by: str) -> Layer:
        """Records ``fs`` (made in :meth:`building`) as the layer ``key``: digest and size of its tar."""
        sink = HashingSink()
        write_tar(fs, sink)
        meta = {"digest": "sha256:" + sink.hash.hexdigest(), "size": sink.size, "created_by": created_by}
        (fs.parent / "meta.json").write_text(json.dumps(meta, indent=1))
        self.layers.mkdir(parents=True, exist_ok=True)
        target = self.layers / key
        remove_tree(target)
        keep = fs.parent.with_name(fs.parent.name + ".commit")
        fs.parent.rename(keep)
        keep.rename(target)
        fs.parent.mkdir()  # for the context manager that removes it
        return self.lookup(key)

    def clean_stale(self) -> None:
        """Removes work directories left by builds that died (their process is gone)."""
        if not self.tmp.exists():
            return
        for path in self.tmp.iterdir():
            pid = path.name.split(".")[-1] if "." in path.name else ""
            if pid.isdigit() and not Path(f"/proc/{pid}").exists():
                remove_tree(path)


class HashingSink:
    """A write-only file that hashes (sha256) and counts what is written, optionally passing it on."""

    def __init__(self, out=None):
        self.hash = hashlib.sha256()
        self.size = 0
        self.out = out

    def write(self, data) -> int:
        self.hash.update(data)
        self.size += len(data)
        if self.out is not None:
            self.out.write(data)
        return len(data)

    def tell(self) -> int:
        return self.size

    def flush(self) -> None:
        if self.out is not None:
            self.out.flush()


def write_tar(fs: Path, out) -> None:
    """Writes the OCI layer tar of the layer directory ``fs`` to the file ``out`` (same bytes every time)."""
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.copybufsize = 1 << 20
        seen: dict[tuple[int, int], str] = {}
        for rel, path, st in walk(fs):
            _add(tar, rel, path, st, seen)


def walk(fs: Path, rel: str = "") -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative name, path, lstat) of everything under ``fs``, parents first, names sorted."""
    with os.scandir(fs / rel if rel else fs) as entries:
        names = sorted(e.name for e in entries)
    for name in names:
        child_rel = f"{rel}/{name}" if rel else name
        path = fs / child_rel
        st = path.lstat()
        yield child_rel, path, st
        if stat.S_ISDIR(st.st_mode):
            yield from walk(fs, child_rel)


def is_whiteout(st: os.stat_result) -> bool:
    """Whether an entry of a layer directory is an overlayfs whiteout (a 0/0 character device)."""
    return stat.S_ISCHR(st.st_mode) and st.st_rdev == 0


def is_opaque(path: Path) -> bool:
    """Whether a layer directory's directory hides the same directory in the layers below."""
    try:
        return os.getxattr(path, OPAQUE_XATTR, follow_symlinks=False) == b"y"
    except OSError:
        return False


def _add(tar: tarfile.TarFile, rel: str, path: Path, st: os.stat_result, seen: dict) -> None:
    info = tarfile.TarInfo(rel)
    info.mode, info.uid, info.gid, info.mtime = stat.S_IMODE(st.st_mode), st.st_uid, st.st_gid, int(st.st_mtime)
    info.uname = info.gname = ""
    mode = st.st_mode
    if is_whiteout(st):
        head, _, name = rel.rpartition("/")
        info.name = f"{head}/{WHITEOUT}{name}" if head else WHITEOUT + name
        info.mode = 0
        tar.addfile(info)
        return
    if stat.S_ISDIR(mode):
        info.type = tarfile.DIRTYPE
        tar.addfile(info)
        if is_opaque(path):
            marker = tarfile.TarInfo(f"{rel}/{OPAQUE_WHITEOUT}")
            marker.mtime = info.mtime
            tar.addfile(marker)
        return
    if st.st_nlink > 1:
        first = seen.setdefault((st.st_dev, st.st_ino), rel)
        if first != rel:
            info.type, info.linkname = tarfile.LNKTYPE, first
            tar.addfile(info)
            return
    if stat.S_ISREG(mode):
        info.size = st.st_size
        with open(path, "rb") as f:
            tar.addfile(info, f)
    elif stat.S_ISLNK(mode):
        info.type, info.linkname = tarfile.SYMTYPE, os.readlink(path)
        tar.addfile(info)
    elif stat.S_ISCHR(mode) or stat.S_ISBLK(mode):
        info.type = tarfile.CHRTYPE if stat.S_ISCHR(mode) else tarfile.BLKTYPE
        info.devmajor, info.devminor = os.major(st.st_rdev), os.minor(st.st_rdev)
        tar.addfile(info)
    elif stat.S_ISFIFO(mode):
        info.type = tarfile.FIFOTYPE
        tar.addfile(info)
    # sockets are not kept in images


def remove_tree(path: Path) -> None:
    """Removes a directory tree (or file) if it is there."""
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path)
    elif path.exists() or path.is_symlink():
        path.unlink()
