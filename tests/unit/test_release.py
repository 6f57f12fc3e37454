"""The release path: the tag-triggered workflow, `make images`, and images the compiled YAML can pull."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

from kfp_trainer.components import _image

REPO = Path(__file__).resolve().parents[2]
WORKFLOW = REPO / ".github" / "workflows" / "release.yml"
ACTIONLINT = Path.home() / ".cache" / "kfp-trainer" / "tools" / "actionlint-v1.7.12" / "actionlint"


def workflow() -> dict:
    return yaml.safe_load(WORKFLOW.read_text())


def steps_of(job: str) -> list[dict]:
    return workflow()["jobs"][job]["steps"]


def test_release_runs_on_version_tags_only_and_checks_the_tag_against_the_package_version():
    flow = workflow()
    assert flow[True] == {"push": {"tags": ["v*"]}}  # YAML reads the key `on` as True
    version_step = next(s for s in steps_of("check") if s.get("id") == "version")
    assert 'if [ "$TAG" != "v$version" ]' in version_step["run"] and "exit 1" in version_step["run"]
    assert "kfp-trainer compile --check" in steps_of("check")[-1]["run"]


def test_release_builds_both_dockerfiles_multi_arch_and_pushes_them_to_the_owners_namespace():
    job = workflow()["jobs"]["images"]
    files = {m["dockerfile"]: m["image"] for m in job["strategy"]["matrix"]["include"]}
    assert files == {"deploy/Dockerfile.component": _image.COMPONENT_IMAGE_NAME, "deploy/Dockerfile.trainer": _image.TRAINER_IMAGE_NAME}
    uses = [s.get("uses", "") for s in job["steps"]]
    assert any(u.startswith("docker/setup-buildx-action@") for u in uses) and any(u.startswith("docker/setup-qemu-action@") for u in uses)
    build = next(s for s in job["steps"] if s.get("uses", "").startswith("docker/build-push-action@"))
    assert build["with"]["platforms"] == "linux/amd64,linux/arm64" and build["with"]["push"] is True
    assert build["with"]["tags"] == "${{ needs.check.outputs.registry }}/${{ matrix.image }}:${{ needs.check.outputs.version }}"
    assert 'registry=ghcr.io/${OWNER,,}' in next(s for s in steps_of("check") if s.get("id") == "version")["run"]
    assert job["permissions"] == {"contents": "read", "packages": "write"}
    # the project's own namespace is what the defaults name
    assert _image.REGISTRY == "ghcr.io/kfp-trainer" and "kubeflow" not in _image.DEFAULT_IMAGE + _image.DEFAULT_TRAINER_IMAGE


def test_release_publishes_the_package_with_trusted_publishing_and_attaches_pinned_yaml():
    package = workflow()["jobs"]["package"]
    assert package["permissions"]["id-token"] == "write"
    assert any(s.get("uses", "").startswith("pypa/gh-action-pypi-publish@") for s in package["steps"])
    compile_step = next(s for s in steps_of("yaml") if "kfp-trainer compile" in s.get("run", ""))
    assert '--base-image "$REGISTRY/kfp-trainer:$VERSION"' in compile_step["run"]
    assert '--trainer-image "$REGISTRY/kfp-trainer-trainer:$VERSION"' in compile_step["run"]
    assert workflow()["jobs"]["yaml"]["needs"] == ["check", "images"]  # YAML only for images that exist


def test_the_workflow_passes_actionlint():
    if not ACTIONLINT.is_file():
        if os.environ.get("CI"):
            pytest.fail("actionlint is not built: make lint-workflows")
        pytest.skip("actionlint not built yet (make lint-workflows)")
    done = subprocess.run([str(ACTIONLINT), str(WORKFLOW)], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stdout + done.stderr


def make_images(*args: str) -> subprocess.CompletedProcess:
    # Run as a user would, not as a sub-make of `make test` (which prints "Entering directory").
    env = {k: v for k, v in os.environ.items() if k not in ("MAKEFLAGS", "MAKELEVEL", "MFLAGS", "MAKEOVERRIDES")}
    return subprocess.run(["make", "-n", "images", *args], cwd=REPO, capture_output=True, text=True, timeout=60, env=env)


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
@pytest.mark.parametrize("tool", ["docker", "podman", "buildah"])
def test_make_images_builds_both_images_under_your_registry_with_the_tool_you_have(tool):
    done = make_images("REGISTRY=registry.example/team", f"CONTAINER_TOOL={tool}", "VERSION=9.9.9", "PUSH=1")
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    assert lines[:4] == [
        f"{tool} build -f deploy/Dockerfile.component -t registry.example/team/kfp-trainer:9.9.9 .",
        f"{tool} build -f deploy/Dockerfile.trainer -t registry.example/team/kfp-trainer-trainer:9.9.9 .",
        f"{tool} push registry.example/team/kfp-trainer:9.9.9",
        f"{tool} push registry.example/team/kfp-trainer-trainer:9.9.9",
    ]
    images = "--base-image registry.example/team/kfp-trainer:9.9.9 --trainer-image registry.example/team/kfp-trainer-trainer:9.9.9"
    assert images in lines[-1]


@pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")
def test_make_images_without_a_registry_says_what_to_give_and_defaults_to_the_package_version():
    done = make_images()
    assert done.returncode != 0 and "make images needs REGISTRY=" in done.stderr
    ok = make_images("REGISTRY=r.example/me", "CONTAINER_TOOL=podman")
    assert f"r.example/me/kfp-trainer:{_image.VERSION} ." in ok.stdout and "push" not in ok.stdout
