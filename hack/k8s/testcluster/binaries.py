"""Where the control plane's binaries and manifests are, and building the binaries."""

from __future__ import annotations

import dataclasses
import os
import subprocess
import threading
from pathlib import Path
from typing import TextIO

HERE = Path(__file__).resolve().parent
K8S_DIR = HERE.parent
REPO = K8S_DIR.parent.parent
BUILD_SH = K8S_DIR / "build.sh"

KUBE_VERSION = "v1.36.3"
# The oldest API server the tests run (hack/k8s/kube-1.32): its kube-apiserver, controller
# manager and scheduler; etcd, kwok and the controllers are the same as with KUBE_VERSION.
OLD_KUBE_VERSION = "v1.32.2"
KUBE_VERSIONS = (KUBE_VERSION, OLD_KUBE_VERSION)


class ClusterError(RuntimeError):
    """The test cluster could not be started, used or stopped."""


class BinariesUnavailable(ClusterError):
    """The control plane binaries are missing and could not be built."""


@dataclasses.dataclass(frozen=True)
class Binaries:
    """The Kubernetes, etcd and kwok binaries (``bin_dir``), the controllers binary, the
    real node's pieces: the kubelet, CoreDNS and the node images (``pause.tar``, ``probe.tar``),
    the oldest version's kube-apiserver, controller manager and scheduler (``kube_old``) and
    Kueue's manager. ``controllers`` runs Trainer v2.3.0; ``older_controllers`` the older
    releases, by version."""

    bin_dir: Path
    controllers: Path
    kubelet: Path | None = None
    coredns: Path | None = None
    node_images: Path | None = None
    kube_old: Path | None = None
    kueue: Path | None = None  # Kueue's manager; its CRDs and webhook manifests beside its bin/
    older_controllers: dict[str, Path] = dataclasses.field(default_factory=dict)

    def __truediv__(self, name: str) -> Path:
        return self.bin_dir / name

    def kube(self, name: str, version: str = KUBE_VERSION) -> Path:
        """The control plane binary ``name`` (``kube-apiserver``, ...) of Kubernetes ``version``."""
        if version == KUBE_VERSION:
            return self.bin_dir / name
        if version == OLD_KUBE_VERSION and self.kube_old is not None:
            return self.kube_old / name
        raise ClusterError(f"Kubernetes {version}: no binaries (built: {', '.join(KUBE_VERSIONS)})")

    def controllers_for(self, trainer_version: str) -> Path:
        """The controllers binary of a Trainer release (``v2.3.0``: :attr:`controllers`)."""
        if trainer_version == "v2.3.0":
            return self.controllers
        if trainer_version not in self.older_controllers:
            built = ", ".join(["v2.3.0", *sorted(self.older_controllers)])
            raise BinariesUnavailable(f"no controllers binary of Trainer {trainer_version} (hack/k8s/build.sh builds {built})")
        return self.older_controllers[trainer_version]


def cache_root() -> Path:
    return Path(os.environ.get("KFP_TRAINER_CACHE") or Path.home() / ".cache" / "kfp-trainer")


def _shared(env: str, name: str) -> Path:
    value = os.environ.get(env)
    if value:
        return Path(value).resolve()
    return (REPO / ".." / "shared" / name).resolve()


def trainer_manifests() -> Path:
    """Trainer v2.3.0 CRDs (``crds/``) and ClusterTrainingRuntimes (``runtimes/``)."""
    return _shared("KFP_TRAINER_CRDS_DIR", "kubeflow-trainer-v2.3.0")


def jobset_manifests() -> Path:
    """The JobSet v0.12.0 CRD."""
    return _shared("KFP_TRAINER_JOBSET_DIR", "jobset-v0.12.0")


def binaries(build: bool = False, log: TextIO | None = None) -> Binaries:
    """The binaries; builds what is missing first when ``build`` is true.

    ``log`` gets build.sh's progress. Raises BinariesUnavailable when they are missing
    (and the build failed)."""
    args = ["bash", str(BUILD_SH)] + ([] if build else ["--print"])
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    err_lines: list[str] = []

    def pump() -> None:
        assert proc.stderr is not None
        for line in proc.stderr:
            err_lines.append(line)
            if log is not None:
                log.write(line)
                log.flush()

    t = threading.Thread(target=pump, daemon=True)
    t.start()
    out = proc.stdout.read() if proc.stdout else ""
    rc = proc.wait()
    t.join(5)
    lines = out.strip().splitlines()
    named = dict(ln.split("=", 1) for ln in lines if "=" in ln)
    controllers = named.get("CONTROLLERS_BIN", "")
    if rc != 0 or not lines or not controllers:
        where = lines[-1] if lines else "(unknown)"
        tail = "".join(err_lines[-15:]).strip()
        raise BinariesUnavailable(
            f"control plane binaries not available in {where} (hack/k8s/build.sh exited {rc})" + (f":\n{tail}" if tail else "")
        )
    keys = (
        ("kubelet", "KUBELET_BIN"), ("coredns", "COREDNS_BIN"), ("node_images", "NODE_IMAGES"),
        ("kube_old", "KUBE_OLD_BIN"), ("kueue", "KUEUE_BIN"),
    )  # fmt: skip
    extra = {f: Path(named[k]) for f, k in keys if k in named}
    older = {k.removeprefix("CONTROLLERS_BIN_"): Path(v) for k, v in named.items() if k.startswith("CONTROLLERS_BIN_")}
    return Binaries(Path(lines[-1]), Path(controllers), **extra, older_controllers=older)
