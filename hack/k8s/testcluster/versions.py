"""The Kubeflow Trainer releases a test cluster can run, and where each one's manifests are.

v2.3.0 (the default) uses the manifests next to the repository (``../shared``, see
:func:`.binaries.trainer_manifests`). The older releases take their CRDs and
ClusterTrainingRuntimes from the Trainer Go module and the JobSet CRD from the JobSet module
their controllers are built with (``hack/k8s/controllers/<version>/go.mod``), both in the Go
module cache, where building the controllers put them.

    >>> [str(d) for d in trainer_dirs("v2.1.0")]          # doctest: +SKIP
    ['.../github.com/kubeflow/trainer/v2@v2.1.0/manifests/base',
     '.../sigs.k8s.io/jobset@v0.10.1/config/components/crd/bases']
"""

from __future__ import annotations

import os
import re
import subprocess
from pathlib import Path

from .binaries import K8S_DIR, ClusterError, jobset_manifests, trainer_manifests

DEFAULT_TRAINER_VERSION = "v2.3.0"
# The releases with a controllers binary (hack/k8s/build.sh, OLD_TRAINERS), oldest first.
TRAINER_VERSIONS = ("v2.1.0", "v2.2.1", DEFAULT_TRAINER_VERSION)
TRAINER_MODULE = "github.com/kubeflow/trainer/v2"
JOBSET_MODULE = "sigs.k8s.io/jobset"


def check_version(version: str) -> str:
    """``version`` when a cluster can run it; a ClusterError naming the choices otherwise."""
    if version not in TRAINER_VERSIONS:
        raise ClusterError(f"trainer_version {version!r} is not available: one of {', '.join(TRAINER_VERSIONS)}")
    return version


def jobset_version(version: str) -> str:
    """The JobSet release the controllers of Trainer ``version`` are built with."""
    if version == DEFAULT_TRAINER_VERSION:
        return "v0.12.0"
    go_mod = (K8S_DIR / "controllers" / version / "go.mod").read_text()
    m = re.search(rf"^\s*(?:require\s+)?{re.escape(JOBSET_MODULE)} (\S+)", go_mod, re.M)
    if not m:
        raise ClusterError(f"hack/k8s/controllers/{version}/go.mod requires no {JOBSET_MODULE}")
    return m.group(1)


def module_dir(module: str, version: str) -> Path:
    """The directory of ``module@version`` in the Go module cache (downloaded when missing)."""
    cache = os.environ.get("GOMODCACHE") or _go_env("GOMODCACHE")
    escaped = re.sub(r"[A-Z]", lambda m: "!" + m.group(0).lower(), module)
    path = Path(cache) / f"{escaped}@{version}"
    if not path.is_dir():
        try:
            subprocess.run(["go", "mod", "download", f"{module}@{version}"], check=True, capture_output=True, text=True, timeout=600)
        except (OSError, subprocess.SubprocessError) as e:
            raise ClusterError(f"cannot download the Go module {module}@{version}: {e}") from e
    if not path.is_dir():
        raise ClusterError(f"the Go module {module}@{version} is not in the module cache ({path})")
    return path


def trainer_dirs(version: str) -> tuple[Path, Path]:
    """The Trainer manifests (``crds/``, ``runtimes/``) and the JobSet CRD directory of ``version``."""
    if check_version(version) == DEFAULT_TRAINER_VERSION:
        return trainer_manifests(), jobset_manifests()
    trainer = module_dir(TRAINER_MODULE, version) / "manifests" / "base"
    jobset = module_dir(JOBSET_MODULE, jobset_version(version)) / "config" / "components" / "crd" / "bases"
    return trainer, jobset


def _go_env(name: str) -> str:
    try:
        out = subprocess.run(["go", "env", name], check=True, capture_output=True, text=True, timeout=60).stdout.strip()
    except (OSError, subprocess.SubprocessError) as e:
        raise ClusterError(f"go env {name} failed ({e}): the older Trainer manifests come from the Go module cache") from e
    return out or str(Path.home() / "go" / "pkg" / "mod")
