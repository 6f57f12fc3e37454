"""Every pipeline in the README and the docs compiles against a registry of one's own, and names no image itself."""

from __future__ import annotations

import ast
import json
import os
import re
import subprocess
import sys

import pytest
import yaml
from docs_examples import REPO, blocks, pages, pipeline_blocks, section

REGISTRY = "registry.example.com/team"
DEFAULT_REGISTRY = "ghcr.io/kfp-trainer"
# An image reference: a registry host (with a dot or a port) or a namespace, a path, and a tag or digest.
IMAGE_REF = re.compile(r"^[a-z0-9][a-z0-9.-]*(:\d+)?/[a-z0-9._/-]+(:[\w.-]+|@sha256:[0-9a-f]{64})$")

# Runs in a fresh interpreter, so that kfp_trainer.components reads the registry variables at its import.
COMPILE = r"""
import importlib.util, json, sys
from pathlib import Path
from kfp import compiler
from kfp.dsl.graph_component import GraphComponent

out = {}
for path in sorted(Path(sys.argv[1]).glob("*.py")):
    spec = importlib.util.spec_from_file_location(path.stem, path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)  # as a file, so that inspect.getsource finds a training function's source
    for name, value in vars(module).items():
        if isinstance(value, GraphComponent):
            target = path.with_name(f"{path.stem}-{name}.yaml")
            compiler.Compiler().compile(value, str(target))
            out[f"{path.stem}:{name}"] = target.read_text()
print(json.dumps(out))
"""


def block_files(tmp_path) -> dict[str, str]:
    """Each pipeline block as a file of its own, named after its page and place."""
    names = {}
    for page, index, code in pipeline_blocks():
        stem = re.sub(r"\W", "_", page.removesuffix(".md")) + f"_{index}"
        (tmp_path / f"{stem}.py").write_text(code)
        names[stem] = page
    return names


@pytest.fixture(scope="module")
def compiled(tmp_path_factory) -> dict[str, str]:
    """Every pipeline of the docs compiled with ``KFP_TRAINER_REGISTRY`` set: {"<block>:<pipeline>": YAML}."""
    tmp_path = tmp_path_factory.mktemp("doc-pipelines")
    block_files(tmp_path)
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFP_TRAINER_")}
    env.update({"KFP_TRAINER_REGISTRY": REGISTRY, "PYTHONPATH": str(REPO)})
    done = subprocess.run([sys.executable, "-c", COMPILE, str(tmp_path)], env=env, cwd=tmp_path, capture_output=True, text=True,
                          timeout=300)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_the_readme_and_the_guide_have_pipelines_to_compile():
    found = {page for page, _, _ in pipeline_blocks()}
    assert {"README.md", "docs/guide/quickstart.md", "docs/guide/pipelines.md"} <= found


def test_every_pipeline_of_the_docs_compiles_with_its_images_under_the_registry_given(compiled, tmp_path):
    expected = {stem for stem in block_files(tmp_path)}
    assert {key.split(":")[0] for key in compiled} == expected  # each block defined a pipeline that compiled
    for key, text in compiled.items():
        images = set(re.findall(r"^\s*image: (\S+)$", text, re.MULTILINE))  # the executors' container images
        assert images and all(i.startswith(f"{REGISTRY}/") for i in images), (key, images)
        assert DEFAULT_REGISTRY not in text, f"{key}: an image of {DEFAULT_REGISTRY} stays in the compiled YAML"


def test_the_quick_start_trains_in_the_trainer_image_of_the_registry_given(compiled):
    from kfp_trainer.components import _image

    quickstart = next(text for key, text in compiled.items() if key.startswith("README_0:"))
    spec = next(yaml.safe_load_all(quickstart))
    image = spec["root"]["dag"]["tasks"]["train-job"]["inputs"]["parameters"]["image"]["runtimeValue"]["constant"]
    assert image == f"{REGISTRY}/kfp-trainer-trainer:{_image.VERSION}"  # what the TrainJob's nodes run
    assert "storageClassName" not in quickstart and "ReadWriteMany" in quickstart  # the default class, asked for ReadWriteMany


def hard_coded_images(code: str) -> list[str]:
    """String literals of a Python block that are image references."""
    return [node.value for node in ast.walk(ast.parse(code))
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and IMAGE_REF.match(node.value)]  # fmt: skip


def test_no_python_example_hard_codes_an_image():
    found = {}
    for page in pages():
        for i, code in enumerate(blocks(page, "python")):
            images = hard_coded_images(code)
            if images:
                found[f"{page.relative_to(REPO)} block {i}"] = images
    assert found == {}, f"examples that name an image: {found}; use kfp_trainer.components.TRAINER_IMAGE / BASE_IMAGE"


def test_the_image_check_catches_a_literal_image():
    assert hard_coded_images('train_job(image="ghcr.io/kfp-trainer/kfp-trainer-trainer:0.1.0")') == [
        "ghcr.io/kfp-trainer/kfp-trainer-trainer:0.1.0"]  # fmt: skip
    assert hard_coded_images('x = "registry.example.com:5000/team/trainer@sha256:' + "0" * 64 + '"')
    assert hard_coded_images('train_job(image=TRAINER_IMAGE, args=["--model-dir", "{model}", "a/b"])') == []


def test_the_readmes_quick_start_is_the_guides():
    readme, guide = REPO / "README.md", REPO / "docs" / "guide" / "quickstart.md"
    assert blocks(readme, "python")[0] == blocks(guide, "python")[0]
    guide_commands = "".join(blocks(guide, "bash"))
    for command in blocks(readme, "bash")[1:3]:  # the cluster setup and the compile/upload/run blocks
        for line in filter(str.strip, command.splitlines()):
            assert line in guide_commands, line


def test_make_demo_and_make_test_are_the_readmes_first_two_commands():
    first = blocks(REPO / "README.md", "bash")[0].splitlines()
    assert [line.split("#")[0].strip() for line in first[:2]] == ["make demo", "make test"]
    assert (REPO / "README.md").read_text().index("make demo") < (REPO / "README.md").read_text().index("## ")


def test_the_quick_start_installs_with_kubectl_apply_k_deploy_and_compiles_with_the_registry_set():
    setup = section(REPO / "README.md", "### Cluster setup")
    assert "git clone https://github.com/kfp-trainer/kfp-trainer" in setup
    assert "kubectl apply -k deploy/" in setup and "export KFP_TRAINER_REGISTRY=" in setup
    assert "make images REGISTRY=$KFP_TRAINER_REGISTRY PUSH=1" in setup


def test_the_guide_explains_every_placeholder_the_launcher_substitutes():
    from kfp_trainer import staging

    placeholders = section(REPO / "docs" / "guide" / "pipelines.md", "## Placeholders")
    for name in staging.NAMES:
        assert f"| `{{{name}}}` |" in placeholders, name
    from kfp_trainer.steps.function import SPECIAL

    for parameter, placeholder in SPECIAL.items():
        assert f"`{parameter}`" in placeholders and f"`{placeholder}`" in placeholders
