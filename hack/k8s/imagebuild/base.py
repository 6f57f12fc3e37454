"""The base image ``python:3.11-slim`` made on this machine: a Debian bookworm root file system.

No registry is reachable from the test machines, so the recipes' ``FROM python:3.11-slim`` is
served by a ``debootstrap`` of Debian bookworm (minbase) with Debian's Python 3.11, pip and venv,
arranged so that ``python`` and ``pip`` resolve as they do in the official image and ``pip
install`` as root is allowed (no EXTERNALLY-MANAGED marker). The result is cached under a digest
of this recipe and becomes the first layer of every image built from that base.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from pathlib import Path

from . import layers

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates")
# What the official image's configuration says besides its file system.
CONFIG = {
    "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG=C.UTF-8"],
    "Cmd": ["python3"],
}
# Base images this build can serve, and the recipe for each.
RECIPES = {
    "python:3.11-slim": {
        "suite": SUITE,
        "variant": "minbase",
        "mirror": MIRROR,
        "packages": list(PACKAGES),
        "config": CONFIG,
        # bump when the steps in make_rootfs change
        "steps": 2,
    },
}


class BaseImageError(RuntimeError):
    """The base image cannot be made (unknown name, no debootstrap, a failed bootstrap)."""


def recipe_digest(image: str) -> str:
    """The digest that names the cached root file system of ``image``."""
    return hashlib.sha256(json.dumps(recipe(image), sort_keys=True).encode()).hexdigest()


def recipe(image: str) -> dict:
    """The recipe for a base image name, or a clear error for a name this build cannot serve."""
    try:
        return RECIPES[image]
    except KeyError:
        raise BaseImageError(f"FROM {image}: only {sorted(RECIPES)} can be built here (no registry)") from None


def base_layer(image: str, store: layers.Store, log=print) -> layers.Layer:
    """The first layer of an image ``FROM image``, made (a few minutes) when not cached."""
    key = "base-" + recipe_digest(image)
    found = store.lookup(key)
    if found:
        return found
    if shutil.which("debootstrap") is None:
        raise BaseImageError("debootstrap is missing: install it with `make debootstrap` (Debian/Ubuntu, as root)")
    started = time.monotonic()
    with store.building(key) as fs:
        make_rootfs(recipe(image), fs, log)
        layer = store.commit(key, fs, created_by=f"debootstrap {recipe(image)['suite']} for {image}")
    log(f"base {image}: {time.monotonic() - started:.0f} s, {layer.size / 1e6:.0f} MB")
    return layer


def make_rootfs(spec: dict, root: Path, log=print) -> None:
    """Bootstraps ``spec`` into the empty directory ``root`` and tidies it into an image's file system."""
    log(f"debootstrap {spec['suite']} ({spec['variant']}) into {root} ...")
    command = ["debootstrap", f"--variant={spec['variant']}", "--include=" + ",".join(spec["packages"]),
               spec["suite"], str(root), spec["mirror"]]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode != 0:
        tail = (done.stdout + done.stderr)[-3000:]
        debootstrap_log = root / "debootstrap" / "debootstrap.log"
        if debootstrap_log.exists():
            tail += "\n" + debootstrap_log.read_text(errors="replace")[-3000:]
        raise BaseImageError(f"debootstrap failed ({done.returncode}):\n{tail}")
    # pip may install as root, as in the official image
    for marker in root.glob("usr/lib/python3*/EXTERNALLY-MANAGED"):
        marker.unlink()
    # what a container runtime provides at run time stays out of the image
    for path in ("var/lib/apt/lists", "var/cache/apt", "var/log", "dev", "tmp", "proc", "sys"):
        _empty_dir(root / path)
    (root / "tmp").chmod(0o1777)
    for name in ("etc/resolv.conf", "etc/hostname"):
        (root / name).unlink(missing_ok=True)
        (root / name).write_text("")
    (root / "etc/hosts").write_text("127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n")
    missing = [name for name in ("usr/bin/python", "usr/bin/pip", "etc/ssl/certs/ca-certificates.crt")
               if not (root / name).exists()]
    if missing:
        raise BaseImageError(f"the bootstrapped file system lacks {missing}")


def _empty_dir(path: Path) -> None:
    if path.is_symlink():
        return
    if path.exists():
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    else:
        path.mkdir(parents=True)
