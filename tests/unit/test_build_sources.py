"""The control plane's builds find the module sources they read on a new machine: an empty Go module cache.

A build that finds its source only in a warm module cache passes on every machine that built it once
and fails on the next new one. These tests run each source-locating step (hack/k8s/build.sh
--locate, the older Trainer releases' manifests) against an empty module cache. The modules come
from this machine's download cache when it has them (a file:// proxy, offline and quick), else from
the Go module proxy.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
BUILD = REPO / "hack" / "k8s" / "build.sh"


def go_env(name: str) -> str:
    return subprocess.run(["go", "env", name], check=True, capture_output=True, text=True, timeout=60).stdout.strip()


@pytest.fixture
def empty_module_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """GOMODCACHE set to an empty directory; downloads from this machine's download cache first."""
    downloads = Path(go_env("GOMODCACHE")) / "cache" / "download"
    proxy = go_env("GOPROXY")
    cache = tmp_path / "gomodcache"
    cache.mkdir()
    monkeypatch.setenv("GOMODCACHE", str(cache))
    monkeypatch.setenv("GOPROXY", f"file://{downloads},{proxy}" if proxy not in ("", "off") else proxy)
    monkeypatch.setenv("GOFLAGS", "-modcacherw")  # so that the test's directory can be removed afterwards
    monkeypatch.setenv("KFP_TRAINER_CACHE", str(tmp_path / "kfp-trainer-cache"))
    return cache


@pytest.mark.slow
def test_build_locates_its_module_sources_in_an_empty_module_cache(empty_module_cache: Path) -> None:
    run = subprocess.run(["bash", str(BUILD), "--locate"], capture_output=True, text=True, timeout=900)
    assert run.returncode == 0, run.stderr[-3000:]
    assert (empty_module_cache / "k8s.io" / "kubernetes@v1.36.3" / "build" / "pause" / "linux" / "pause.c").is_file()
    assert (empty_module_cache / "sigs.k8s.io" / "kueue@v0.17.0" / "cmd" / "kueue" / "main.go").is_file()
    assert not (Path(os.environ["KFP_TRAINER_CACHE"]) / "k8s-v1.36.3-etcd-v3.6.16-kwok-v0.8.0").exists()  # found, nothing built


def test_a_module_that_cannot_be_downloaded_fails_the_build_naming_it(empty_module_cache: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("GOPROXY", "off")
    run = subprocess.run(["bash", str(BUILD), "--locate"], capture_output=True, text=True, timeout=300)
    assert run.returncode == 1
    assert "cannot download k8s.io/kubernetes (required by hack/k8s/kube/go.mod)" in run.stderr, run.stderr
    assert "No such file" not in run.stderr  # it stops at the download, before reading any file


@pytest.mark.slow
def test_older_trainer_manifests_are_found_in_an_empty_module_cache(empty_module_cache: Path) -> None:
    sys.path.insert(0, str(REPO / "hack" / "k8s"))
    try:
        from testcluster import versions
    finally:
        sys.path.remove(str(REPO / "hack" / "k8s"))
    for version in ("v2.1.0", "v2.2.1"):
        trainer, jobset = versions.trainer_dirs(version)
        assert str(trainer).startswith(str(empty_module_cache)) and (trainer / "crds").is_dir(), trainer
        assert list(jobset.glob("*.yaml")), jobset
