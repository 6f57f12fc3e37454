"""KFP's UI can open the Task Details of every task of every sample pipeline.

KFP 2.17's run page (``RuntimeNodeDetailsV2.tsx``, ``getNodeVolumeMounts``) decodes
``platforms.kubernetes.deploymentSpec`` of the compiled YAML whenever the pipeline has a
``platforms.kubernetes`` section, and reads ``.executors`` of it: a section with a workspace
(``pipelineConfig``) and no ``deploymentSpec`` throws there, and the whole page turns into
"Something went wrong". The same lookup is played here on each compiled pipeline.
"""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from kfp_trainer.compile import task_details_readable

REPO = Path(__file__).resolve().parents[2]
PIPELINES = sorted(REPO.glob("pipelines/*/pipeline.yaml"))


def volume_mounts_of_every_task(text: str) -> dict[str, list]:
    """What the UI's getNodeVolumeMounts does for each executor: TypeError where KFP's UI throws."""
    spec, *platform = yaml.safe_load_all(text)
    if not platform or "kubernetes" not in ((platform[0] or {}).get("platforms") or {}):
        return {}
    deployment = platform[0]["platforms"]["kubernetes"].get("deploymentSpec")  # PlatformDeploymentConfig.fromJSON(...)
    if deployment is None:  # object.executors of undefined
        raise TypeError("Cannot read properties of undefined (reading 'executors')")
    executors = deployment.get("executors") or {}
    return {name: [m["mountPath"] for m in (executors.get(name) or {}).get("pvcMount", [])] for name in spec["deploymentSpec"]["executors"]}


@pytest.mark.parametrize("path", PIPELINES, ids=lambda p: p.parent.name)
def test_the_ui_reads_the_task_details_of_every_task(path):
    mounts = volume_mounts_of_every_task(path.read_text())
    assert all(isinstance(m, list) for m in mounts.values())


def test_a_workspace_alone_is_given_an_empty_deployment_spec_and_nothing_else_changes():
    text = (REPO / "pipelines" / "pytorch_distributed" / "pipeline.yaml").read_text()
    docs = list(yaml.safe_load_all(text))
    del docs[1]["platforms"]["kubernetes"]["deploymentSpec"]
    bare = "".join(line for line in text.splitlines(keepends=True) if line.startswith("#")) + yaml.dump_all(docs, sort_keys=True)
    with pytest.raises(TypeError):  # what the UI met: the section without a deploymentSpec
        volume_mounts_of_every_task(bare)
    assert task_details_readable(bare) == text
    assert task_details_readable(text) == text  # once is enough
    no_platform = yaml.dump_all(docs[:1], sort_keys=True)
    assert task_details_readable(no_platform) == no_platform
