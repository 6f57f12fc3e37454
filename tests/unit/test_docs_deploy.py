"""``kubectl apply -k deploy/``, as the docs tell an admin: the kustomization is the RBAC and the TRL runtime, whole."""

from __future__ import annotations

import re
import subprocess

import yaml
from docs_examples import REPO, blocks

DEPLOY = REPO / "deploy"


def kustomize(folder) -> list[dict]:
    done = subprocess.run(["kubectl", "kustomize", str(folder)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    return [d for d in yaml.safe_load_all(done.stdout) if d]


def identity(doc: dict) -> tuple[str, str, str]:
    return doc["kind"], doc["metadata"].get("namespace", ""), doc["metadata"]["name"]


def test_the_kustomization_is_the_rbac_and_the_trl_runtime_unchanged():
    built = {identity(d): d for d in kustomize(DEPLOY)}
    files = [d for name in ("rbac.yaml", "trl-runtime.yaml") for d in yaml.safe_load_all((DEPLOY / name).read_text()) if d]
    assert built == {identity(d): d for d in files}


def test_every_manifest_in_deploy_is_in_the_kustomization():
    listed = yaml.safe_load((DEPLOY / "kustomization.yaml").read_text())["resources"]
    assert sorted(listed) == sorted(p.name for p in DEPLOY.glob("*.yaml") if p.name != "kustomization.yaml")


def test_the_install_guides_overlay_points_the_trl_runtime_at_ones_own_trainer_image(tmp_path):
    guide = REPO / "docs" / "guide" / "install.md"
    overlay = next(b for b in blocks(guide, "yaml") if "kustomization.yaml" in b)
    folder = re.search(r"# (\S+)/kustomization\.yaml", overlay).group(1)
    (tmp_path / folder).mkdir()
    (tmp_path / folder / "kustomization.yaml").write_text(overlay)
    (tmp_path / "deploy").symlink_to(DEPLOY)  # "beside the clone's deploy/ folder"
    built = kustomize(tmp_path / folder)
    runtime = next(d for d in built if d["kind"] == "ClusterTrainingRuntime")
    container = runtime["spec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]["containers"][0]
    assert container["image"].startswith("registry.example.com/team/kfp-trainer-trainer:")
    assert {identity(d) for d in built} == {identity(d) for d in kustomize(DEPLOY)}
