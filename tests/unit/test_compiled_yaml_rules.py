"""Every compiled YAML in the repository obeys what a KFP backend (2.15-2.17) enforces on upload and run.

The rules come from the backend's own code: the API server's upload checks (schema version,
pipeline name), its run compiler (``argocompiler``: workspace PVC spec) and the driver
(which placeholders it resolves, where TaskConfig passthroughs go). A YAML that breaks one
uploads fine but fails when a user presses "Create run", or runs with unresolved values.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest
import yaml
from kfp import compiler, dsl

from kfp_trainer.components import TASK_CONFIG_PASSTHROUGHS, _image, train_job

REPO = Path(__file__).resolve().parents[2]
PIPELINES = sorted(REPO.glob("pipelines/*/pipeline.yaml"))
COMPONENTS = sorted(REPO.glob("components/*/component.yaml"))
NAME = re.compile(r"^[a-z0-9][a-z0-9-]{0,127}$")
PARAMETER_TYPES = {
    "STRING": str, "NUMBER_INTEGER": (int, float), "NUMBER_DOUBLE": (int, float), "BOOLEAN": bool, "LIST": list, "STRUCT": dict,
}
# TaskConfigPassthroughTypeEnum of the 2.15 pipeline spec (2.14 knows none of them).
PASSTHROUGHS_215 = {"RESOURCES", "ENV", "KUBERNETES_AFFINITY", "KUBERNETES_TOLERATIONS", "KUBERNETES_NODE_SELECTOR", "KUBERNETES_VOLUMES"}
# Fields argocompiler's convertStructToPVCSpec accepts in a workspace pvcSpecPatch.
PVC_PATCH_FIELDS = {"accessModes", "storageClassName"}
ACCESS_MODES = {"ReadWriteOnce", "ReadOnlyMany", "ReadWriteMany", "ReadWriteOncePod"}
# Placeholders the driver resolves when a task passes them (resolve.go, resolveInputParameter).
CONTEXT = {
    "run_id": "{{$.pipeline_job_uuid}}",
    "task_name": "{{$.pipeline_task_name}}",
    "task_id": "{{$.pipeline_task_uuid}}",
    "pipeline_name": "{{$.pipeline_job_name}}",
}
OUR_IMAGES = {_image.DEFAULT_IMAGE, _image.DEFAULT_TRAINER_IMAGE}
_CREDENTIAL = re.compile(r"(^|_)(TOKEN|SECRET|PASSWORD|API_KEY|SECRET_ACCESS_KEY|ACCESS_KEY_ID)$", re.IGNORECASE)


def documents(text: str) -> tuple[dict, dict]:
    docs = [d for d in yaml.safe_load_all(text) if d is not None]
    return docs[0], (docs[1] if len(docs) > 1 else {})


def _typed_parameter_problems(where: str, parameters: dict) -> list[str]:
    problems = []
    for name, spec in (parameters or {}).items():
        kind = spec.get("parameterType")
        if kind not in PARAMETER_TYPES and kind != "TASK_CONFIG":
            problems.append(f"{where}: parameter {name!r} has no valid parameterType ({kind!r})")
        elif "defaultValue" in spec and kind in PARAMETER_TYPES and not isinstance(spec["defaultValue"], PARAMETER_TYPES[kind]):
            problems.append(f"{where}: parameter {name!r} default {spec['defaultValue']!r} is not a {kind}")
    return problems


def _tasks(dag: dict, components: dict) -> list[tuple[str, dict]]:
    """Every task of a DAG, nested DAGs (loops, conditions) included."""
    out = []
    for name, task in (dag.get("tasks") or {}).items():
        out.append((name, task))
        component = components.get(task.get("componentRef", {}).get("name", ""), {})
        if "dag" in component:
            out += _tasks(component["dag"], components)
    return out


def violations(text: str, *, pipeline: bool = True) -> list[str]:
    """What a KFP 2.15-2.17 backend would refuse or mishandle in one compiled pipeline or component YAML.

    ``pipeline=False`` for a component YAML, which users load into their pipelines: the
    task-level rules then apply to the tasks of those pipelines, not to the YAML itself.
    """
    spec, platform = documents(text)
    problems = []
    if spec.get("schemaVersion") != "2.1.0":
        problems.append(f"schemaVersion {spec.get('schemaVersion')!r}: the API server accepts 2.1.0")
    name = (spec.get("pipelineInfo") or {}).get("name", "")
    if not NAME.match(name):
        problems.append(f"pipeline name {name!r} does not match {NAME.pattern}")
    problems += _typed_parameter_problems("root", (spec.get("root") or {}).get("inputDefinitions", {}).get("parameters"))
    components = spec.get("components") or {}
    for cname, component in components.items():
        problems += _typed_parameter_problems(cname, (component.get("inputDefinitions") or {}).get("parameters"))
        for p in component.get("taskConfigPassthroughs") or []:
            if p.get("field") not in PASSTHROUGHS_215:
                problems.append(f"{cname}: passthrough {p.get('field')!r} is unknown to KFP 2.15")
    for ename, executor in ((spec.get("deploymentSpec") or {}).get("executors") or {}).items():
        container = executor.get("container") or {}
        image = container.get("image", "")
        if image not in OUR_IMAGES and "{{$" not in image:
            problems.append(f"{ename}: image {image!r} is not one of the project's images {sorted(OUR_IMAGES)}")
        for env in container.get("env") or []:
            if _CREDENTIAL.search(env.get("name", "")) and env.get("value"):
                problems.append(f"{ename}: credential {env['name']!r} as a literal value; use a Secret by reference")

    workspace = ((platform.get("platforms") or {}).get("kubernetes") or {}).get("pipelineConfig", {}).get("workspace")
    if workspace is not None:
        if not str(workspace.get("size") or "").strip():
            problems.append("workspace: no size")
        patch = (workspace.get("kubernetes") or {}).get("pvcSpecPatch") or {}
        if set(patch) - PVC_PATCH_FIELDS:
            extra = sorted(set(patch) - PVC_PATCH_FIELDS)
            problems.append(f"workspace pvcSpecPatch: fields {extra} are refused (only accessModes, storageClassName)")
        modes = patch.get("accessModes") or []
        if not modes:
            problems.append("workspace PVC spec must specify accessModes (run creation fails without an admin default)")
        if set(modes) - ACCESS_MODES:
            problems.append(f"workspace accessModes {modes}: unknown modes")
        if "storageClassName" in patch and not str(patch["storageClassName"]).strip():
            problems.append('workspace storageClassName "": refused; omit it or name a class')

    root_dag = (spec.get("root") or {}).get("dag") or {}
    for tname, task in _tasks(root_dag, components) if pipeline else []:
        component = components.get(task.get("componentRef", {}).get("name", ""), {})
        declared = (component.get("inputDefinitions") or {}).get("parameters") or {}
        given = (task.get("inputs") or {}).get("parameters") or {}
        for pname, pspec in declared.items():
            default = pspec.get("defaultValue")
            if isinstance(default, str) and "{{$." in default and pname not in given:
                problems.append(f"task {tname}: input {pname!r} relies on the default {default!r}, which the driver does not resolve")
        if component.get("taskConfigPassthroughs"):  # a launcher of external workloads
            for pname, placeholder in CONTEXT.items():
                if pname in declared and (given.get(pname) or {}).get("runtimeValue", {}).get("constant") != placeholder:
                    problems.append(f"task {tname}: {pname} must be {placeholder}")
            if workspace is not None and "workspace_path" in declared:
                if (given.get("workspace_path") or {}).get("runtimeValue", {}).get("constant") != "{{$.workspace_path}}":
                    problems.append(f"task {tname}: workspace_path must be {{{{$.workspace_path}}}} (else the workspace is not mounted)")
                elif "ReadWriteMany" not in ((workspace.get("kubernetes") or {}).get("pvcSpecPatch") or {}).get("accessModes", []):
                    problems.append(f"task {tname}: the TrainJob's nodes mount the workspace from several nodes: ReadWriteMany")
            if task.get("cachingOptions", {}).get("enableCache"):
                problems.append(f"task {tname}: caching on a launcher skips training on a cache hit")
    return problems


@pytest.mark.parametrize("path", PIPELINES + COMPONENTS, ids=lambda p: str(p.relative_to(REPO)))
def test_every_compiled_yaml_is_accepted_and_run_as_meant_by_a_kfp_backend(path):
    assert violations(path.read_text(), pipeline=path.name == "pipeline.yaml") == []


def test_there_is_a_gallery_of_pipelines_and_every_one_has_a_workspace_and_a_launcher():
    assert {p.parent.name for p in PIPELINES} >= {"llm_finetune", "pytorch_distributed", "hparam_sweep"}
    for path in PIPELINES:
        spec, platform = documents(path.read_text())
        assert platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]["kubernetes"]["pvcSpecPatch"]["accessModes"] == [
            "ReadWriteMany"
        ], path
        launchers = [c for c in spec["components"].values() if c.get("taskConfigPassthroughs")]
        assert launchers, f"{path}: no TrainJob launcher"


def test_the_rules_catch_what_the_backend_refuses(tmp_path):
    @dsl.pipeline(name="Bad_Name", pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="1Gi")))
    def bad():
        # train_job as kfp's own loader gives it: nothing fills in task_name, task_id, workspace_path
        task = _plain_train_job()(command=["python", "t.py"], run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)
        task.set_caching_options(True)
        # the workspace is not mounted; caching (off by default on a launcher) turned back on
        train_job(command=["python", "t.py"], workspace_path="").set_caching_options(True)

    path = tmp_path / "bad.yaml"
    compiler.Compiler().compile(bad, str(path))
    spec, platform = documents(path.read_text())
    spec["pipelineInfo"]["name"], spec["schemaVersion"] = "Bad_Name", "2.0.0"
    spec["deploymentSpec"]["executors"]["exec-train-job"]["container"]["image"] = "ghcr.io/kubeflow/kfp-trainer:0.1.0"
    found = "\n".join(violations(yaml.dump_all([spec, platform])))
    assert "pipeline name 'Bad_Name'" in found and "schemaVersion '2.0.0'" in found
    assert "image 'ghcr.io/kubeflow/kfp-trainer:0.1.0' is not one of the project's images" in found
    assert "must specify accessModes" in found
    assert "input 'task_name' relies on the default '{{$.pipeline_task_name}}'" in found
    assert "task train-job-2: workspace_path must be" in found and "train-job-2: run_id" not in found
    assert "caching on a launcher" in found
    assert "input 'run_id'" not in found  # passed by the task: resolved by the driver


def test_a_storage_class_and_no_empty_one_can_be_compiled_in():
    from kfp_trainer import compile as gen

    text = (REPO / "pipelines" / "llm_finetune" / "pipeline.yaml").read_text()
    patched = gen.set_storage_class(text, "nfs-client")
    _, platform = documents(patched)
    patch = platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]["kubernetes"]["pvcSpecPatch"]
    assert patch == {"accessModes": ["ReadWriteMany"], "storageClassName": "nfs-client"}
    assert violations(patched) == []
    assert patched.startswith("# PIPELINE DEFINITION") and text.startswith("# PIPELINE DEFINITION")
    with pytest.raises(ValueError, match="empty storageClassName"):
        gen.set_storage_class(text, "")


def test_a_bad_storage_class_patch_is_reported():
    text = (REPO / "pipelines" / "llm_finetune" / "pipeline.yaml").read_text()
    spec, platform = documents(text)
    platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]["kubernetes"]["pvcSpecPatch"] = {
        "storageClassName": "", "volumeMode": "Block"
    }
    found = "\n".join(violations(yaml.dump_all([spec, platform])))
    assert 'storageClassName "": refused' in found and "volumeMode" in found and "accessModes" in found


def _passthroughs():
    return [dsl.TaskConfigPassthrough(field=p, apply_to_task=False) if isinstance(p, dsl.TaskConfigField) else p
            for p in TASK_CONFIG_PASSTHROUGHS]


def _plain_train_job():
    """train_job as kfp.components' own loader returns it: no run context filled in."""
    from kfp import components

    return components.load_component_from_text((REPO / "components" / "train_job" / "component.yaml").read_text())


def test_kfps_own_loader_loses_the_passthroughs_and_run_context_ours_keeps_them(tmp_path):
    from kfp_trainer.components import load_component_from_file

    path = str(REPO / "components" / "train_job" / "component.yaml")
    ours = load_component_from_file(path)

    @dsl.pipeline(name="from-yaml", pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(
        size="1Gi", kubernetes=dsl.KubernetesWorkspaceConfig(pvcSpecPatch={"accessModes": ["ReadWriteMany"]}))))
    def from_yaml():
        ours(command=["python", "t.py"]).set_caching_options(False)

    @dsl.pipeline(name="from-kfp-loader", pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(
        size="1Gi", kubernetes=dsl.KubernetesWorkspaceConfig(pvcSpecPatch={"accessModes": ["ReadWriteMany"]}))))
    def from_kfp_loader():
        _plain_train_job()(command=["python", "t.py"]).set_caching_options(False)

    for pipeline, expected in ((from_yaml, []), (from_kfp_loader, None)):
        out = tmp_path / f"{pipeline.name}.yaml"
        compiler.Compiler().compile(pipeline, str(out))
        spec, _ = documents(out.read_text())
        passthroughs = spec["components"]["comp-train-job"].get("taskConfigPassthroughs")
        if expected is None:  # what users of kfp.components.load_component_from_url get
            assert passthroughs is None
            assert any("relies on the default" in v for v in violations(out.read_text()))
        else:
            assert [p["field"] for p in passthroughs] == [p.field.name for p in _passthroughs()]
            assert violations(out.read_text()) == expected
