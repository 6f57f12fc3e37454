"""COPY and WORKDIR as new layers, and the file trees they read from.

A tree is either a directory of this machine (the build context) or the merged view of a stage's
layer directories (what ``COPY --from=<stage>`` reads), read with overlayfs' rules: a whiteout
hides a name, an opaque directory hides the layers below it. The digest of what a COPY reads
(names, modes, contents, link targets; not times, as Docker) is part of its layer's cache key.
"""

from __future__ import annotations

import fnmatch
import hashlib
import os
import posixpath
import shutil
import stat
from collections.abc import Iterator
from pathlib import Path

from .layers import is_opaque, is_whiteout


class CopyError(ValueError):
    """A COPY source is missing, or the copy cannot be done as asked."""


class HostTree:
    """A directory of this machine, read as a file tree."""

    def __init__(self, root: Path):
        self.root = Path(root)

    def lookup(self, rel: str) -> Path | None:
        path = self.root / rel.strip("/") if rel.strip("/") else self.root
        return path if os.path.lexists(path) else None

    def listdir(self, rel: str) -> dict[str, Path]:
        path = self.lookup(rel)
        return {p.name: p for p in path.iterdir()} if path and path.is_dir() and not path.is_symlink() else {}


class MergedView:
    """The file tree that overlayfs would show for layer directories ``lowers`` (top first)."""

    def __init__(self, lowers: list[Path]):
        self.lowers = [Path(p) for p in lowers]

    def lookup(self, rel: str) -> Path | None:
        parts = [p for p in rel.strip("/").split("/") if p]
        for layer in self.lowers:
            hidden_below = False
            for i in range(len(parts)):
                path = layer.joinpath(*parts[: i + 1])
                if not os.path.lexists(path):
                    break
                st = path.lstat()
                if is_whiteout(st):
                    return None
                if i == len(parts) - 1:
                    return path
                if not stat.S_ISDIR(st.st_mode):
                    return None
                hidden_below = hidden_below or is_opaque(path)
            else:
                return layer  # the root
            if hidden_below:
                return None
        return None

    def listdir(self, rel: str) -> dict[str, Path]:
        found: dict[str, Path] = {}
        hidden: set[str] = set()
        for layer in self.lowers:
            path = layer / rel.strip("/") if rel.strip("/") else layer
            if not os.path.lexists(path):
                continue
            st = path.lstat()
            if is_whiteout(st) or not stat.S_ISDIR(st.st_mode):
                break
            for entry in os.scandir(path):
                if entry.name in found or entry.name in hidden:
                    continue
                if is_whiteout(entry.stat(follow_symlinks=False)):
                    hidden.add(entry.name)
                else:
                    found[entry.name] = Path(entry.path)
            if is_opaque(path):
                break
        return found


def walk(tree, rel: str) -> Iterator[tuple[str, Path, os.stat_result]]:
    """(relative name, path, lstat) of ``rel`` in ``tree`` and everything under it, sorted, parents first."""
    path = tree.lookup(rel)
    if path is None:
        return
    st = path.lstat()
    yield rel, path, st
    if stat.S_ISDIR(st.st_mode):
        for name, _ in sorted(tree.listdir(rel).items()):
            yield from walk(tree, posixpath.join(rel, name))


def expand_sources(tree, patterns: tuple[str, ...], where: str) -> list[str]:
    """The relative names that COPY's source ``patterns`` (with ``*``/``?``/``[]`` wildcards) name."""
    out = []
    for pattern in patterns:
        rel = posixpath.normpath(pattern.strip("/")) if pattern.strip("/") else "."
        rel = "" if rel == "." else rel
        if any(ch in rel for ch in "*?["):
            head, tail = posixpath.split(rel)
            matched = sorted(n for n in tree.listdir(head) if fnmatch.fnmatchcase(n, tail))
            if not matched:
                raise CopyError(f"{where}: COPY {pattern}: nothing matches")
            out += [posixpath.join(head, n) for n in matched]
        elif tree.lookup(rel) is None:
            raise CopyError(f"{where}: COPY {pattern}: not found")
        else:
            out.append(rel)
    return out


def sources_digest(tree, sources: list[str]) -> str:
    """A digest of what COPY reads from ``sources``: names, types and modes, contents, link targets."""
    h = hashlib.sha256()
    for source in sources:
        for rel, path, st in walk(tree, source):
            h.update(f"{rel}\0{st.st_mode:o}\0".encode())
            if stat.S_ISREG(st.st_mode):
                with open(path, "rb") as f:
                    h.update(hashlib.file_digest(f, "sha256").digest())
            elif stat.S_ISLNK(st.st_mode):
                h.update(os.readlink(path).encode())
    return h.hexdigest()


def parse_chown(chown: str | None, where: str) -> tuple[int, int]:
    """``--chown=<uid>[:<gid>]`` (numeric) as (uid, gid); (0, 0) without it."""
    if not chown:
        return 0, 0
    user, _, group = chown.partition(":")
    if not user.isdigit() or (group and not group.isdigit()):
        raise CopyError(f"{where}: COPY --chown={chown}: only numeric <uid>[:<gid>] is implemented")
    return int(user), int(group or user)


def copy_layer(fs: Path, target: MergedView, tree, sources: list[str], dest: str, owner: tuple[int, int]) -> None:
    """Makes in the empty layer directory ``fs`` what ``COPY sources dest`` changes on ``target``."""
    into_dir = dest.endswith("/") or len(sources) > 1
    dest = dest.rstrip("/") or "/"
    existing = target.lookup(dest)
    if existing is not None and existing.is_dir() and not existing.is_symlink():
        into_dir = True
    for source in sources:
        src = tree.lookup(source)
        if src.is_dir() and not src.is_symlink():
            _ensure_dir(fs, target, dest, owner)
            for name in sorted(tree.listdir(source)):
                _copy_tree(fs, tree, posixpath.join(source, name), posixpath.join(dest, name), owner)
        else:
            to = posixpath.join(dest, posixpath.basename(source)) if into_dir else dest
            _ensure_dir(fs, target, posixpath.dirname(to), owner)
            _copy_tree(fs, tree, source, to, owner)


def mkdir_layer(fs: Path, target: MergedView, path: str) -> None:
    """Makes in the empty layer directory ``fs`` the directory ``path`` (WORKDIR) and its missing parents."""
    _ensure_dir(fs, target, path, (0, 0))


def _ensure_dir(fs: Path, target: MergedView, dest: str, owner: tuple[int, int]) -> None:
    parts = [p for p in dest.strip("/").split("/") if p]
    for i in range(len(parts)):
        rel = "/".join(parts[: i + 1])
        here = fs / rel
        if here.is_dir():
            continue
        below = target.lookup(rel)
        here.mkdir()
        if below is not None and below.is_dir() and not below.is_symlink():
            st = below.lstat()  # an existing directory keeps its owner and mode
            os.chown(here, st.st_uid, st.st_gid)
            os.chmod(here, stat.S_IMODE(st.st_mode))
            os.utime(here, ns=(st.st_atime_ns, st.st_mtime_ns))
        else:
            os.chown(here, *owner)
            os.chmod(here, 0o755)


def _copy_tree(fs: Path, tree, source: str, to: str, owner: tuple[int, int]) -> None:
    for rel, path, st in walk(tree, source):
        out = fs / (to.strip("/") + rel[len(source):])
        if stat.S_ISDIR(st.st_mode):
            out.mkdir(exist_ok=True)
        elif stat.S_ISLNK(st.st_mode):
            out.unlink(missing_ok=True)
            os.symlink(os.readlink(path), out)
        elif stat.S_ISREG(st.st_mode):
            out.unlink(missing_ok=True)
            shutil.copyfile(path, out)
        else:
            raise CopyError(f"COPY {source}: {rel} is neither a file, a directory nor a link")
        os.chown(out, *owner, follow_symlinks=False)
        if not stat.S_ISLNK(st.st_mode):
            os.chmod(out, stat.S_IMODE(st.st_mode))
    for rel, _path, st in walk(tree, source):  # times last: writing children changes a directory's
        out = fs / (to.strip("/") + rel[len(source):])
        os.utime(out, ns=(st.st_atime_ns, st.st_mtime_ns), follow_symlinks=False)
