"""The Trainer releases a test cluster can run (hack/k8s/testcluster/versions.py) and the
controllers binaries build.sh names for them. Pure: no cluster, no Go."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "k8s"))

from testcluster import versions  # noqa: E402
from testcluster.binaries import BUILD_SH, Binaries, BinariesUnavailable, ClusterError  # noqa: E402


def test_an_unknown_release_is_refused_with_the_choices():
    with pytest.raises(ClusterError, match=r"trainer_version 'v2\.0\.0' is not available: one of v2\.1\.0, v2\.2\.1, v2\.3\.0"):
        versions.trainer_dirs("v2.0.0")


def test_each_older_release_names_the_jobset_its_controllers_are_built_with():
    assert versions.jobset_version("v2.1.0") == "v0.10.1"
    assert versions.jobset_version("v2.2.1") == "v0.12.0"
    assert versions.jobset_version("v2.3.0") == "v0.12.0"


def test_the_default_release_uses_the_shared_manifests(monkeypatch, tmp_path):
    monkeypatch.setenv("KFP_TRAINER_CRDS_DIR", str(tmp_path / "t"))
    monkeypatch.setenv("KFP_TRAINER_JOBSET_DIR", str(tmp_path / "j"))
    assert versions.trainer_dirs("v2.3.0") == ((tmp_path / "t").resolve(), (tmp_path / "j").resolve())


def test_older_releases_read_their_manifests_from_the_module_cache(monkeypatch, tmp_path):
    monkeypatch.setenv("GOMODCACHE", str(tmp_path))
    for d in ("github.com/kubeflow/trainer/v2@v2.1.0", "sigs.k8s.io/jobset@v0.10.1"):
        (tmp_path / d).mkdir(parents=True)
    trainer, jobset = versions.trainer_dirs("v2.1.0")
    assert trainer == tmp_path / "github.com/kubeflow/trainer/v2@v2.1.0/manifests/base"
    assert jobset == tmp_path / "sigs.k8s.io/jobset@v0.10.1/config/components/crd/bases"


def test_build_sh_prints_a_controllers_binary_per_older_release(tmp_path):
    env = {"PATH": "/usr/bin:/bin", "HOME": str(tmp_path), "KFP_TRAINER_CACHE": str(tmp_path)}
    out = subprocess.run(["bash", str(BUILD_SH), "--print"], capture_output=True, text=True, env=env).stdout
    named = dict(line.split("=", 1) for line in out.splitlines() if "=" in line)
    for v, js in (("v2.1.0", "v0.10.1"), ("v2.2.1", "v0.12.0")):
        path = Path(named[f"CONTROLLERS_BIN_{v}"])
        assert path.name == "controllers" and path.parent.parent.name.startswith(f"controllers-trainer-{v}-jobset-{js}-")
        assert path.is_relative_to(tmp_path)


def test_a_release_without_a_binary_is_a_clear_error():
    b = Binaries(Path("/bin"), Path("/c23"), older_controllers={"v2.1.0": Path("/c21")})
    assert b.controllers_for("v2.3.0") == Path("/c23") and b.controllers_for("v2.1.0") == Path("/c21")
    with pytest.raises(BinariesUnavailable, match=r"no controllers binary of Trainer v2\.2\.1 .*builds v2\.3\.0, v2\.1\.0"):
        b.controllers_for("v2.2.1")
