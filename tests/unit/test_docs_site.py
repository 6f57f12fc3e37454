"""The documentation site builds with warnings as errors, its references come from the code, and its links lead somewhere."""

from __future__ import annotations

import argparse
import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from docs_examples import GITHUB, REPO, pages

pytestmark = pytest.mark.timeout(600)


def build(root: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` of the site whose ``mkdocs.yml`` is in ``root``, with ``root``'s package first on the path."""
    env = {**os.environ, "PYTHONPATH": str(root), "NO_MKDOCS_2_WARNING": "1"}
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(site)], cwd=root, env=env,
                          capture_output=True, text=True, timeout=500)  # fmt: skip


def text_of(page: Path) -> str:
    return html.unescape(re.sub(r"<[^>]+>", "", page.read_text()))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    done = build(REPO, out)
    assert done.returncode == 0, done.stderr[-6000:]
    return out


def test_the_site_builds_with_warnings_as_errors(site):
    for page in ("index.html", "guide/quickstart/index.html", "reference/components/index.html", "develop/testing/index.html"):
        assert (site / page).is_file(), page


def test_the_cli_reference_is_the_parsers_help(site):
    from kfp_trainer.cli import build_parser

    text = text_of(site / "reference" / "cli" / "index.html")
    parser = build_parser()
    subparsers = next(a for a in parser._actions if a.__class__.__name__ == "_SubParsersAction")
    assert set(subparsers.choices) >= {"render", "launch", "run", "gc", "compile"}
    for name, sub in subparsers.choices.items():
        assert f"kfp-trainer {name}" in text, name
        for action in sub._actions:
            if action.help == argparse.SUPPRESS:  # hidden from --help, so from the reference too
                continue
            for flag in action.option_strings:
                assert flag in text, f"{name} {flag}"


def test_the_component_reference_documents_every_component_with_its_inputs(site):
    from kfp_trainer import components

    text = text_of(site / "reference" / "components" / "index.html")
    for name, component in {**components.COMPONENTS, "trainjob_component": None}.items():
        assert f"{name}(" in text, name  # its signature
        if component is not None:
            summary = component.component_spec.description.split("\n")[0]
            assert summary in text, name
            for given in component.component_spec.inputs or {}:
                assert given in text, f"{name}.{given}"


def test_a_broken_link_fails_the_build(tmp_path):
    root = tmp_path / "repo"
    shutil.copytree(REPO / "docs", root / "docs", ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(REPO / "mkdocs.yml", root / "mkdocs.yml")
    (root / "kfp_trainer").symlink_to(REPO / "kfp_trainer")
    with open(root / "docs" / "guide" / "install.md", "a") as f:
        f.write("\nSee [the missing page](no-such-page.md) and [a missing section](quickstart.md#no-such-section).\n")
    done = build(root, tmp_path / "site")
    assert done.returncode != 0
    assert "no-such-page.md" in done.stderr and "no-such-section" in done.stderr


def _relative_links(page: Path) -> list[str]:
    text = re.sub(r"```.*?```", "", page.read_text(), flags=re.S)
    return [m for m in re.findall(r"\]\(([^)\s]+)\)", text) if not m.startswith(("http://", "https://", "#", "mailto:"))]


def test_the_readmes_links_lead_to_files_of_the_repository():
    readme = REPO / "README.md"
    missing = [link for link in _relative_links(readme) if not (REPO / link.split("#")[0]).exists()]
    assert missing == []


def test_links_to_the_repository_name_files_that_exist():
    missing = []
    for page in pages():
        for link in re.findall(re.escape(GITHUB) + r"(?:blob|tree)/main/([^)#\s]+)", page.read_text()):
            if not (REPO / link).exists():
                missing.append(f"{page.relative_to(REPO)}: {link}")
    assert missing == []


def test_pyproject_names_the_repository_and_the_docs_packages():
    text = (REPO / "pyproject.toml").read_text()
    assert 'Source = "https://github.com/kfp-trainer/kfp-trainer"' in text
    dev = re.search(r"^dev = \[(.*?)\]$", text, re.S | re.M).group(1)
    for package in ("mkdocs>=", "mkdocs-material>=", "mkdocstrings[python]>="):
        assert package in dev, package
