"""``kfp-trainer compile`` never writes next to an installed package: ``--output-dir``, or a clear refusal.

The installed case is real: the package copied into a folder of its own (as pip lays it out in
site-packages, with no checkout around it) and run from there in a fresh process.
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from kfp_trainer import compile as gen
from kfp_trainer.components import COMPONENTS, _image
from kfp_trainer.errors import EXIT_USER

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def site_packages(tmp_path_factory) -> Path:
    site = tmp_path_factory.mktemp("site-packages")
    shutil.copytree(REPO / "kfp_trainer", site / "kfp_trainer", ignore=shutil.ignore_patterns("__pycache__"))
    return site


def installed_cli(site: Path, cwd: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KFP_TRAINER_")}, "PYTHONPATH": str(site)}
    return subprocess.run([sys.executable, "-m", "kfp_trainer.cli", "compile", *args], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=300)  # fmt: skip


def written(folder: Path) -> list[str]:
    return sorted(p.relative_to(folder).as_posix() for p in folder.rglob("*") if p.is_file() and "__pycache__" not in p.parts)


def test_an_installed_package_refuses_to_write_next_to_itself(site_packages, tmp_path):
    before = written(site_packages)
    done = installed_cli(site_packages, tmp_path)
    assert done.returncode == EXIT_USER, done.stdout + done.stderr
    lines = done.stderr.strip().splitlines()
    assert len(lines) == 1 and "installed package" in lines[0] and "--output-dir" in lines[0], done.stderr
    assert written(site_packages) == before and written(tmp_path) == []
    assert installed_cli(site_packages, tmp_path, "--check").returncode == EXIT_USER


def test_an_installed_package_writes_the_components_under_output_dir(site_packages, tmp_path):
    before = written(site_packages)
    out = tmp_path / "build"
    done = installed_cli(site_packages, tmp_path, "--output-dir", "build", "--base-image", "registry.example.com/team/kfp-trainer:1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert written(site_packages) == before  # nothing next to the package
    files = written(out)
    expected = ["components/README.md", "deploy/trl-runtime.yaml"]  # the TRL runtime for the images compiled for
    assert files == sorted([*expected, *(f"components/{n}/{f}" for n in COMPONENTS for f in ("README.md", "component.yaml"))])
    assert "image: registry.example.com/team/kfp-trainer:1" in (out / "components" / "train_job" / "component.yaml").read_text()
    check = ["--output-dir", "build", "--base-image", "registry.example.com/team/kfp-trainer:1", "--check"]
    assert installed_cli(site_packages, tmp_path, *check).returncode == 0
    (out / "components" / "train_job" / "component.yaml").write_text("stale\n")
    stale = installed_cli(site_packages, tmp_path, *check)
    assert stale.returncode == 1 and "stale: components/train_job/component.yaml" in stale.stderr


def test_the_source_checkout_is_recognised_and_output_dir_gets_its_pipelines_too(tmp_path):
    assert gen.source_checkout() == REPO
    assert gen.source_checkout(tmp_path) is None
    files = gen.generate(tmp_path)
    pipeline_yaml = tmp_path / "pipelines" / "llm_finetune" / "pipeline.yaml"
    assert pipeline_yaml in files and files[pipeline_yaml] == (REPO / "pipelines" / "llm_finetune" / "pipeline.yaml").read_text()
    assert all(tmp_path in path.parents for path in files)


def test_output_dir_that_is_a_file_is_refused(tmp_path, capsys):
    from kfp_trainer import cli

    (tmp_path / "f").write_text("")
    assert cli.main(["compile", "--output-dir", str(tmp_path / "f")]) == EXIT_USER
    assert "not a folder" in capsys.readouterr().err


MY_PIPELINE = '''
from kfp import dsl
from kfp_trainer.components import dataset_initializer, evaluate_model, train_job


@dsl.pipeline(name="finetune")
def finetune():
    data = dataset_initializer(uri="hf://tatsu-lab/alpaca")
    train = train_job(runtime="torch-distributed", command=["torchrun", "train.py"], dataset=data.outputs["dataset"])
    train.set_caching_options(False)
    evaluate_model(model=train.outputs["output_model"], dataset=data.outputs["dataset"])
'''


def test_the_readmes_recipe_compiles_ones_own_pipeline_against_ones_own_registry(tmp_path):
    readme = (REPO / "docs" / "guide" / "images.md").read_text()  # the user guide's images page
    recipe = next(block for block in readme.split("```bash\n")[1:] if "KFP_TRAINER_REGISTRY=" in block.split("```")[0])
    command = recipe.split("```")[0].replace("\\\n", " ")
    (tmp_path / "my_pipeline.py").write_text(MY_PIPELINE)
    env = {**{k: v for k, v in os.environ.items() if not k.startswith("KFP_TRAINER_")}, "PYTHONPATH": f"{REPO}{os.pathsep}{tmp_path}"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"  # its `python` is this one
    done = subprocess.run(command, shell=True, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    compiled = (tmp_path / "finetune.yaml").read_text()
    images = set(re.findall(r"^\s*image: (\S+)$", compiled, re.MULTILINE))  # the executors' container images
    version = _image.VERSION
    assert images == {f"registry.example.com/team/kfp-trainer:{version}", f"registry.example.com/team/kfp-trainer-trainer:{version}"}


def test_the_readme_states_the_pins_of_pyproject_and_the_image_variables():
    # the user guide's install and images pages
    readme = "\n".join((REPO / "docs" / "guide" / page).read_text() for page in ("install.md", "images.md"))
    # the project's dependencies, as pyproject.toml pins them ("kfp>=2.17.3,<2.18", ...); tomllib needs Python 3.11
    pins = dict(re.findall(r'^\s*"([A-Za-z][A-Za-z0-9_.-]*)([<>=!~][^"]*)",?$', (REPO / "pyproject.toml").read_text(), re.MULTILINE))
    assert {"kfp", "kfp-kubernetes", "kubernetes"} <= set(pins)
    assert f"`{pins['kfp']}`" in readme and f"`{pins['kfp-kubernetes']}`" in readme and f"`{pins['kubernetes']}`" in readme
    for variable in (_image.REGISTRY_ENV, _image.IMAGE_ENV, _image.TRAINER_IMAGE_ENV):
        assert f"| `{variable}` |" in readme
    install = readme.split("# Install\n", 1)[1].split("\n## Cluster setup", 1)[0]
    assert "pip install 'kfp-trainer[local]'" in install and "pip install -e '.[local]'" in install

