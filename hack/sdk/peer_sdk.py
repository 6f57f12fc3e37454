#!/usr/bin/env python3
"""A cached virtualenv holding the kubeflow SDK (PyPI ``kubeflow``), the peer we compare against.

The SDK is never a dependency of kfp-trainer: it lives in its own virtualenv under the cache
root, keyed by its version, so interop tests and benchmarks can drive it as a separate program.

    python hack/sdk/peer_sdk.py            # create if missing; print the venv's python on the last line
    python hack/sdk/peer_sdk.py --print    # print it only (exit 1 when missing)
    python hack/sdk/peer_sdk.py --force    # recreate

Environment:
    KFP_TRAINER_CACHE   cache root (default: $HOME/.cache/kfp-trainer)
    KFP_TRAINER_PEER_SDK_VERSION   kubeflow SDK version (default: 0.5.0)

From Python: ``peer_sdk.python(create=True)`` returns the interpreter path; it raises
``PeerSdkUnavailable`` (with pip's output) when the package index cannot be reached.
"""

from __future__ import annotations

import fcntl
import os
import shutil
import subprocess
import sys
from pathlib import Path

DEFAULT_VERSION = "0.5.0"


class PeerSdkUnavailable(RuntimeError):
    """The SDK's virtualenv could not be created (no package index, no venv module...)."""


def version() -> str:
    return os.environ.get("KFP_TRAINER_PEER_SDK_VERSION", DEFAULT_VERSION)


def venv_dir() -> Path:
    root = Path(os.environ.get("KFP_TRAINER_CACHE", Path.home() / ".cache" / "kfp-trainer"))
    return root / f"peer-sdk-kubeflow-{version()}"


def _python(venv: Path) -> Path:
    return venv / "bin" / "python"


def _ready(venv: Path) -> bool:
    return (venv / ".installed").is_file() and _python(venv).exists()


def python(create: bool = True, force: bool = False, log=sys.stderr) -> Path:
    """Path of the virtualenv's interpreter, creating the virtualenv first when asked."""
    venv = venv_dir()
    if _ready(venv) and not force:
        return _python(venv)
    if not create:
        raise PeerSdkUnavailable(f"{venv} is not set up (run: python hack/sdk/peer_sdk.py)")
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / f".{venv.name}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)  # another session may be creating it right now
        if _ready(venv) and not force:
            return _python(venv)
        shutil.rmtree(venv, ignore_errors=True)
        steps = [
            [sys.executable, "-m", "venv", str(venv)],
            [str(_python(venv)), "-m", "pip", "install", "-q", "--disable-pip-version-check", f"kubeflow=={version()}"],
        ]
        for cmd in steps:
            print(f"[peer sdk] {' '.join(cmd)}", file=log, flush=True)
            done = subprocess.run(cmd, capture_output=True, text=True, check=False)
            if done.returncode != 0:
                shutil.rmtree(venv, ignore_errors=True)
                raise PeerSdkUnavailable(f"{' '.join(cmd)} failed ({done.returncode}):\n{done.stdout[-2000:]}{done.stderr[-2000:]}")
        (venv / ".installed").write_text(version() + "\n")
    return _python(venv)


def main(argv: list[str]) -> int:
    mode = argv[1] if len(argv) > 1 else ""
    if mode not in ("", "--print", "--force"):
        print(__doc__, file=sys.stderr)
        return 2
    try:
        print(python(create=mode != "--print", force=mode == "--force"))
    except PeerSdkUnavailable as e:
        print(e, file=sys.stderr)
        print(_python(venv_dir()))
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
