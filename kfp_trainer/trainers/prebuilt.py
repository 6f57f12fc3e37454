"""Builtins written ahead of time, for an image that cannot write them (no torch, no transformers).

The component image runs the initializers but has none of the packages that write the builtin
models; its build writes the builtins the samples use into a directory (``python -m
kfp_trainer.trainers.builtin --prebuild DIR URI...``) and names it in ``$KFP_TRAINER_BUILTINS_DIR``.
The layout is ``DIR/<kind>/<name>/`` (the files :func:`kfp_trainer.trainers.builtin.materialize`
would write) and ``DIR/prebuilt.json`` (the URIs and the versions of the packages that wrote them).

Only the standard library is imported.

Example:
    >>> import tempfile
    >>> root = Path(tempfile.mkdtemp())
    >>> (root / "models" / "tiny-char-lm").mkdir(parents=True)
    >>> listed(root)
    ['builtin://models/tiny-char-lm']
"""

from __future__ import annotations

import json
import os
from importlib import metadata
from pathlib import Path

from kfp_trainer.errors import UserError

ENV = "KFP_TRAINER_BUILTINS_DIR"
INFO = "prebuilt.json"
KINDS = ("datasets", "models")
# The packages whose versions decide what the writers write, recorded in prebuilt.json.
WRITER_PACKAGES = ("torch", "transformers", "tokenizers", "safetensors", "pyarrow")
TRAINER_IMAGE = "ghcr.io/kfp-trainer/kfp-trainer-trainer"


class BuiltinUnavailableError(UserError):
    """A builtin this environment can neither copy (not prebuilt) nor write (a package is missing)."""


def directory() -> Path | None:
    """The directory of prebuilt builtins named by ``$KFP_TRAINER_BUILTINS_DIR``, or None where unset."""
    value = os.environ.get(ENV)
    return Path(value) if value else None


def find(kind: str, name: str) -> Path | None:
    """The prebuilt files of ``builtin://<kind>/<name>``, or None when there are none here."""
    root = directory()
    path = root / kind / name if root is not None else None
    return path if path is not None and path.is_dir() else None


def listed(root: Path) -> list[str]:
    """The ``builtin://`` URIs prebuilt under ``root``."""
    return sorted(f"builtin://{kind}/{p.name}" for kind in KINDS if (root / kind).is_dir()
                  for p in (root / kind).iterdir() if p.is_dir())


def unavailable(uri: str, error: ImportError) -> BuiltinUnavailableError:
    """The error for a builtin whose writer needs a package this environment lacks (and no prebuilt copy)."""
    root = directory()
    served = f"; this image has {', '.join(listed(root)) or 'none'} prebuilt in ${ENV}" if root is not None else ""
    return BuiltinUnavailableError(
        f"{uri}: writing it needs the package {error.name or error}, which is missing here{served}. Run this step in "
        f"the trainer image ({TRAINER_IMAGE}, deploy/Dockerfile.trainer), which writes every builtin, or install "
        "kfp-trainer[local]"
    )


def make_readable(root: Path) -> None:
    """Lets every user read the files under ``root`` (the image's USER is not the one that wrote them)."""
    for path in (root, *root.rglob("*")):
        if not path.is_symlink():
            path.chmod(path.stat().st_mode | (0o555 if path.is_dir() else 0o444))


def write_info(root: Path) -> dict[str, object]:
    """Writes ``root/prebuilt.json`` (the URIs under ``root``, the writers' package versions) and returns it."""
    versions = {}
    for package in WRITER_PACKAGES:
        try:
            versions[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            continue
    info: dict[str, object] = {"uris": listed(root), "versions": versions}
    (root / INFO).write_text(json.dumps(info, indent=2) + "\n")
    return info
