"""The images' recipes, checked without a container engine (tests/integration/test_images.py builds them).

Docker's own parser reads the Dockerfiles (stages, global build arguments, COPY sources,
the non-root numeric user that KFP 2.16+'s ``runAsNonRoot`` needs, the optional pip
configuration secret, the component's builtins stage repeating the trainer's dependency
steps); the slow test builds the wheel exactly as the recipe's first stage does, installs it
into a clean virtualenv as the component image's last stage does, and runs the recipe's own
checks there (no torch).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

dockerfile = pytest.importorskip("dockerfile")
REPO = Path(__file__).resolve().parents[2]
FILES = sorted((REPO / "deploy").glob("Dockerfile.*"))


def stages(path: Path) -> tuple[dict[str, str], list[list]]:
    """(global ARG defaults, the instructions of each stage)."""
    commands = dockerfile.parse_file(str(path))
    global_args, out = {}, []
    for c in commands:
        kind = c.cmd.upper()
        if kind == "FROM":
            out.append([c])
        elif not out and kind == "ARG":
            name, _, default = c.value[0].partition("=")
            global_args[name] = default.strip('"')
        elif out:
            out[-1].append(c)
        else:
            raise AssertionError(f"{path.name}: {c.original} before the first FROM")
    return global_args, out


def test_there_are_the_component_and_trainer_images():
    assert [f.name for f in FILES] == ["Dockerfile.component", "Dockerfile.trainer"]


PIP_CONF = "--mount=type=secret,id=pip.conf,target=/etc/pip.conf"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_dockerfile_builds_a_wheel_then_a_pinned_non_root_image(path):
    global_args, parts = stages(path)
    build, *middle, image = parts
    assert build[0].value[1:] == ("AS", "build")
    assert [stage[0].value[1:] for stage in middle] == ([("AS", "builtins")] if path.name == "Dockerfile.component" else [])
    for stage in parts:
        base = stage[0].value[0]
        if base.startswith("${"):
            assert base.strip("${}") in global_args, f"{path.name}: FROM {base} needs a global ARG (before the first FROM)"
            base = global_args[base.strip("${}")]
        assert ":" in base and not base.endswith(":latest"), f"{path.name}: pin the base image ({base})"
    kinds = [c.cmd.upper() for stage in parts for c in stage]
    assert "ADD" not in kinds, f"{path.name}: COPY, not ADD"
    copied_from = {("--from=build",): {("/src/requirements.txt", "/tmp/requirements.txt"), ("/wheels", "/wheels"),
                                       ("/src/requirements-local.txt", "/tmp/requirements.txt"),
                                       ("/src/requirements-llm.txt", "/tmp/requirements-llm.txt"),
                                       ("/src/constraints.txt", "/tmp/constraints.txt")},
                   ("--from=builtins",): {("/builtins", "/opt/kfp-trainer/builtins")}}
    for c in (c for stage in parts for c in stage if c.cmd.upper() == "COPY"):
        if any(f.startswith("--from=") for f in c.flags):
            # the dependency lists (a layer of their own, cached while the sources change), the wheel, the builtins
            assert c.value in copied_from.get(c.flags, set()), f"{path.name}: {c.original}"
            continue
        for source in c.value[:-1]:
            assert (REPO / source).exists(), f"{path.name}: COPY source {source} is not in the repository"
    assert "pip wheel" in " ".join(c.value[0] for c in build if c.cmd.upper() == "RUN")
    runs = " ".join(c.value[0] for c in image if c.cmd.upper() == "RUN")
    assert "/wheels/kfp_trainer-" in runs and "--no-cache-dir" in runs and "rm -rf /wheels" in runs
    assert "--no-deps /wheels/kfp_trainer-" in runs and "-r /tmp/requirements.txt" in runs, f"{path.name}: dependencies, then the wheel"
    assert "python -c" in runs and "kfp_trainer" in runs, f"{path.name}: the build should prove the package imports"
    users = [c.value[0] for c in image if c.cmd.upper() == "USER"]
    assert users and re.fullmatch(r"[1-9][0-9]*", users[-1]), f"{path.name}: USER must be a numeric non-root UID for runAsNonRoot"
    assert f"--uid {users[-1]}" in runs, f"{path.name}: the user {users[-1]} is created in the image"


@pytest.mark.parametrize("path", FILES, ids=lambda p: p.name)
def test_every_step_that_downloads_reads_the_optional_pip_conf_secret(path):
    # the build's PyPI mirror (hack/k8s/images.py) or a user's private index; never written into the image
    for stage in stages(path)[1]:
        for c in (c for c in stage if c.cmd.upper() == "RUN"):
            downloads = "pip wheel" in c.value[0] or re.search(r"pip install (?!.*--no-deps)", c.value[0])
            assert (PIP_CONF in c.flags) == bool(downloads), f"{path.name}: {c.original[:120]}"


def test_the_component_builtins_stage_repeats_the_trainer_dependency_steps_so_they_share_layers():
    # buildah's and BuildKit's layer caches key a step by the steps below it: kept verbatim, the
    # trainer image's ~6 GB of dependencies are built (and stored) once for both images
    _, (component_build, builtins, _) = stages(REPO / "deploy" / "Dockerfile.component")
    _, (trainer_build, trainer_image) = stages(REPO / "deploy" / "Dockerfile.trainer")

    def steps(stage, upto: str) -> list[tuple]:
        end = next(i for i, c in enumerate(stage) if c.cmd.upper() == "COPY" and c.value[0] == upto)
        return [(c.cmd.upper(), c.flags, c.value) for c in stage[1:end]]

    trainer_steps = [s if s[2] != ("/src/requirements.txt", "/tmp/requirements.txt") else
                     (s[0], s[1], ("/src/requirements-local.txt", "/tmp/requirements.txt")) for s in steps(trainer_image, "/wheels")]
    shared = steps(builtins, "/wheels")[: len(trainer_steps)]  # then the builtins' own (torchtune), before the wheel
    assert shared == trainer_steps
    assert builtins[0].value[0] == stages(REPO / "deploy" / "Dockerfile.trainer")[0]["BASE"]
    assert sum(1 for s in shared if s[0] == "RUN") == 3
    # and the two lists of requirements are written by the same program
    programs = [re.findall(r'python -c "([^"]+)"', c.value[0]) for c in (*component_build, *trainer_build) if c.cmd.upper() == "RUN"]
    component_programs, trainer_program = programs[0], programs[2]
    assert component_programs[1] == trainer_program[0]


def image_run_steps(path: Path) -> list[str]:
    """The ``&&``-joined steps of the image stage's RUN instructions."""
    _, (*_, image) = stages(path)
    steps: list[str] = []
    for c in image:
        if c.cmd.upper() == "RUN":
            steps += [s.strip() for s in c.value[0].split("&&")]
    return steps


@pytest.mark.slow
def test_component_image_recipe_installs_the_wheel_in_a_clean_virtualenv_without_torch(tmp_path):
    wheels, venv, src, builtins = tmp_path / "wheels", tmp_path / "venv", tmp_path / "src", tmp_path / "builtins"
    _, (build, builtins_stage, image) = stages(REPO / "deploy" / "Dockerfile.component")
    extras = next(c.value[0] for c in image if c.cmd.upper() == "ARG" and c.value[0].startswith("EXTRAS=")).split("=", 1)[1].strip('"')
    env = {k: v for k, v in os.environ.items() if k not in ("VIRTUAL_ENV", "PYTHONPATH")}
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, timeout=300)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env['PATH']}"
    # stage 1, as written (the dependency lists, pip wheel ... --wheel-dir /wheels .), in a copy of the sources
    src.mkdir()
    for name in ("pyproject.toml", "README.md", "constraints.txt"):
        shutil.copy(REPO / name, src / name)
    shutil.copytree(REPO / "kfp_trainer", src / "kfp_trainer", ignore=shutil.ignore_patterns("__pycache__"))
    for c in build[1:]:
        if c.cmd.upper() == "RUN":
            command = c.value[0].replace("/wheels", str(wheels))
            subprocess.run(command, shell=True, cwd=src, env=env, check=True, capture_output=True, timeout=600)
    (wheel,) = wheels.glob("kfp_trainer-*.whl")
    assert "kfp>=2.17.3,<2.18" in (src / "requirements.txt").read_text().splitlines()
    assert "torch>=2.5" in (src / "requirements-local.txt").read_text().splitlines()
    # stage 2's last step, with this machine's torch: the builtins the image copies
    (prebuild,) = [c.value[0] for c in builtins_stage if c.cmd.upper() == "RUN" and "--prebuild" in c.value[0]]
    uris = prebuild.split("--prebuild /builtins", 1)[1].split()
    subprocess.run([sys.executable, "-m", "kfp_trainer.trainers.builtin", "--prebuild", str(builtins), *uris],
                   check=True, capture_output=True, timeout=600, cwd=REPO)
    env["KFP_TRAINER_BUILTINS_DIR"] = str(builtins)  # the image's ENV, pointed at them
    ran = []
    for step in image_run_steps(REPO / "deploy" / "Dockerfile.component"):
        if step.startswith(("useradd", "rm ")):
            continue  # changes this machine's users / the scratch folder: the image's business
        # --no-cache-dir keeps the image small; here the machine's pip cache may serve the same files
        command = (step.replace("/wheels/kfp_trainer-*.whl", str(wheel)).replace("/tmp/requirements.txt", str(src / "requirements.txt"))
                   .replace("/tmp/constraints.txt", str(src / "constraints.txt"))
                   .replace("${EXTRAS}", extras).replace(" --no-cache-dir", "").replace("/tmp/served", str(tmp_path / "served")))
        done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=900)
        assert done.returncode == 0, f"{command}\n{done.stdout[-2000:]}{done.stderr[-2000:]}"
        ran.append(command.split()[0])
    assert ran == ["pip", "pip", "python", "python", "python"]  # both installs and the recipe's three checks ran
    installed = subprocess.run([str(venv / "bin" / "pip"), "list", "--format=freeze"], capture_output=True, text=True, check=True).stdout
    assert "kfp-trainer==" in installed and "torch==" not in installed and "kfp==2.17" in installed
    assert (tmp_path / "served" / "model.safetensors").is_file()  # the tiny model, served without torch
    cli = subprocess.run([str(venv / "bin" / "kfp-trainer"), "render", "--runtime", "torch-distributed", "--run-id", "r1",
                          "--task-name", "t"], capture_output=True, text=True, env=env, timeout=120)
    assert cli.returncode == 0 and "kind: TrainJob" in cli.stdout, cli.stderr


def test_every_samples_default_builtin_is_prebuilt_in_the_component_image():
    # the initializer steps run in the component image, which has no torch: a builtin default that is not
    # prebuilt there fails the sample on every cluster (tests/integration/test_images.py serves them for real)
    import ast

    prebuilt = set()
    for c in (c for stage in stages(REPO / "deploy" / "Dockerfile.component")[1] for c in stage if c.cmd.upper() == "RUN"):
        if "--prebuild" in c.value[0]:
            prebuilt |= set(re.findall(r"builtin://[\w./-]+", c.value[0].split("--prebuild", 1)[1]))
    defaults = {}
    for path in sorted((REPO / "pipelines").glob("*/pipeline.py")):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and re.fullmatch(r"builtin://[\w./-]+", node.value):
                defaults.setdefault(node.value, []).append(path.parent.name)
    assert "builtin://models/tiny-qwen2.5" in defaults and len(defaults) >= 4, defaults
    missing = {uri: samples for uri, samples in defaults.items() if uri not in prebuilt}
    assert missing == {}, f"sample defaults the component image does not prebuild: {missing}"
