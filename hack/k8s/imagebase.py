"""The Dockerfiles' base image ``python:3.11-slim``, made on this machine for buildah (no registry).

No registry is reachable from the test machines, so ``FROM python:3.11-slim`` is served by a
Debian bookworm root file system made with ``debootstrap --variant=minbase`` with Debian's
Python 3.11, pip and venv, arranged so that ``python`` and ``pip`` resolve as in the official
image and ``pip install`` as root is allowed (no EXTERNALLY-MANAGED marker). It is written
into a buildah working container, committed with the official image's ``PATH``, ``LANG`` and
``CMD``, and tagged ``docker.io/library/python:3.11-slim`` in the build's own storage, with a
label holding the digest of this recipe: a changed recipe makes a new base (and so new layers
above it); an unchanged one is found in the storage in a fraction of a second.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

SUITE = "bookworm"
MIRROR = "http://deb.debian.org/debian"
PACKAGES = ("python3", "python3-pip", "python3-venv", "python-is-python3", "ca-certificates")
# What the official image's configuration says besides its file system.
ENV = {"PATH": "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
CMD = ["python3"]
RECIPE_LABEL = "dev.kfp-trainer.base-recipe"
# Base images this build can serve (the name the Dockerfiles use -> the recipe).
RECIPES = {
    "docker.io/library/python:3.11-slim": {
        "suite": SUITE,
        "variant": "minbase",
        "mirror": MIRROR,
        "packages": list(PACKAGES),
        "env": ENV,
        "cmd": CMD,
        # bump when the steps in make_rootfs change
        "steps": 2,
    },
}

Buildah = Callable[..., subprocess.CompletedProcess]


class BaseImageError(RuntimeError):
    """The base image cannot be made (no debootstrap, a failed bootstrap, buildah refused)."""


def recipe_digest(name: str) -> str:
    """The digest of the recipe of base image ``name`` (recorded in the image's labels)."""
    return hashlib.sha256(json.dumps(RECIPES[name], sort_keys=True).encode()).hexdigest()


def ensure(buildah: Buildah, log: Callable[[str], None] = print) -> dict[str, str]:
    """Every base in :data:`RECIPES` tagged in buildah's storage, made (1-2 minutes) when missing or stale.

    ``buildah(*args)`` runs buildah on the build's storage and returns the completed process.
    Returns the image ID of each base by name.
    """
    ids = {}
    for name in RECIPES:
        ids[name] = _current(buildah, name) or _make(buildah, name, log)
    return ids


def _current(buildah: Buildah, name: str) -> str | None:
    done = buildah("inspect", "--type", "image", name, check=False)
    if done.returncode != 0:
        return None
    info = json.loads(done.stdout)
    labels = (info.get("OCIv1", {}).get("config") or {}).get("Labels") or {}
    return info["FromImageID"] if labels.get(RECIPE_LABEL) == recipe_digest(name) else None


def _make(buildah: Buildah, name: str, log: Callable[[str], None]) -> str:
    if shutil.which("debootstrap") is None:
        raise BaseImageError("debootstrap is missing: install it with `make host-packages` (Debian/Ubuntu, as root)")
    spec = RECIPES[name]
    started = time.monotonic()
    container = buildah("from", "scratch").stdout.strip()
    try:
        root = Path(buildah("mount", container).stdout.strip())
        make_rootfs(spec, root, log)
        buildah("umount", container)
        config = [arg for key, value in spec["env"].items() for arg in ("--env", f"{key}={value}")]
        buildah("config", *config, "--cmd", json.dumps(spec["cmd"]), "--label", f"{RECIPE_LABEL}={recipe_digest(name)}",
                "--created-by", f"debootstrap --variant={spec['variant']} {spec['suite']} ({', '.join(spec['packages'])})",
                container)
        image_id = buildah("commit", "--quiet", "--rm", container, name).stdout.strip()
    except BaseException:
        buildah("rm", container, check=False)
        raise
    log(f"base {name}: {time.monotonic() - started:.0f} s")
    return image_id


def make_rootfs(spec: dict, root: Path, log: Callable[[str], None] = print) -> None:
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
