"""The images' Dockerfiles, parsed with Docker's own parser (no engine here to build them)."""

from __future__ import annotations

from pathlib import Path

import pytest

dockerfile = pytest.importorskip("dockerfile")
REPO = Path(__file__).resolve().parents[2]
FILES = sorted((REPO / "deploy").glob("Dockerfile.*"))


def test_there_are_the_component_and_trainer_images():
    assert [f.name for f in FILES] == ["Dockerfile.component", "Dockerfile.trainer"]


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dockerfile_is_sound(path):
    commands = dockerfile.parse_file(str(path))
    kinds = [c.cmd.upper() for c in commands]
    args = {c.value[0].split("=", 1)[0]: c.value[0].split("=", 1)[-1] for c in commands if c.cmd.upper() == "ARG"}
    base = next(c.value[0] for c in commands if c.cmd.upper() == "FROM")
    if base.startswith("${"):
        base = args[base.strip("${}")]
    assert ":" in base and not base.endswith(":latest"), f"{path.name}: pin the base image ({base})"
    assert "ADD" not in kinds, f"{path.name}: COPY, not ADD"
    for c in commands:
        if c.cmd.upper() == "COPY":
            for source in c.value[:-1]:
                assert (REPO / source).exists(), f"{path.name}: COPY source {source} is not in the repository"
    users = [c.value[0] for c in commands if c.cmd.upper() == "USER"]
    assert users and users[-1] not in ("root", "0"), f"{path.name}: the image must not run as root"
    runs = " ".join(c.value[0] for c in commands if c.cmd.upper() == "RUN")
    assert "pip install" in runs and "--no-cache-dir" in runs
    assert "python -c" in runs and "kfp_trainer" in runs, f"{path.name}: the build should prove the package imports"
