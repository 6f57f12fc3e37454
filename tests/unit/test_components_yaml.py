"""The generated component YAML, READMEs and pipeline YAML: in sync, loadable, composable."""


from pathlib import Path

import pytest
import yaml
from kfp import compiler, components, dsl

from kfp_trainer import compile as gen
from kfp_trainer.components import COMPONENTS, DEFAULT_IMAGE, load_component_from_file, trainjob_component, workspace_config

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def generated() -> "dict[Path, str]":
    return gen.generate(REPO)


def test_checked_in_files_match_the_python_sources(generated):
    import difflib

    diffs = []
    for p in gen.stale(generated):
        old = p.read_text().splitlines(True) if p.is_file() else []
        diffs.append("".join(difflib.unified_diff(old, generated[p].splitlines(True), str(p), "generated")))
    assert not diffs, "run: kfp-trainer compile\n" + "\n".join(d[:3000] for d in diffs)
    assert gen.main(["--check"]) == 0


def test_generation_is_deterministic(generated):
    again = gen.generate(REPO)
    assert again == generated


def test_base_image_can_be_chosen_at_compile_time(generated):
    swapped = gen.generate(REPO, base_image="registry.example/kfp-trainer:dev", trainer_image="registry.example/trainer:dev")
    train_yaml = swapped[REPO / "components" / "train_job" / "component.yaml"]
    assert "image: registry.example/kfp-trainer:dev" in train_yaml and DEFAULT_IMAGE not in train_yaml
    assert "image: registry.example/trainer:dev" in swapped[REPO / "components" / "evaluate_model" / "component.yaml"]
    assert "registry.example/kfp-trainer:dev" in swapped[REPO / "pipelines" / "llm_finetune" / "pipeline.yaml"]


def test_readmes_document_every_input_and_output():
    for name, component in COMPONENTS.items():
        readme = (REPO / "components" / name / "README.md").read_text()
        for key in list(component.component_spec.inputs or {}) + list(component.component_spec.outputs or {}):
            assert f"| `{key}` |" in readme, (name, key)


@pytest.mark.parametrize("name", sorted(COMPONENTS))
def test_each_component_yaml_loads_with_the_same_interface(name):
    loaded = components.load_component_from_file(str(REPO / "components" / name / "component.yaml"))
    original = COMPONENTS[name].component_spec
    assert set(loaded.component_spec.inputs) == set(original.inputs)
    assert set(loaded.component_spec.outputs) == set(original.outputs)


def test_loaded_yaml_components_compose_into_a_pipeline_that_compiles(tmp_path):
    # kfp's own loader (2.17) drops taskConfigPassthroughs; kfp-trainer's keeps them
    load = {n: load_component_from_file(str(REPO / "components" / n / "component.yaml")) for n in COMPONENTS}

    @dsl.pipeline(name="from-yaml", pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="1Gi")))
    def from_yaml(steps: int = 10):
        data = load["dataset_initializer"](uri="builtin://datasets/addition")
        base = load["model_initializer"](uri="builtin://models/tiny-char-lm")
        train = load["train_job"](
            command=["torchrun", "-m", "kfp_trainer.trainers.sft"],
            args=["--model-dir", "{model}", "--dataset-dir", "{dataset}", "--output-dir", "{output_model}", "--max-steps", steps],
            num_nodes=2, dataset=data.outputs["dataset"], model=base.outputs["model"],
            run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER, task_name=dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
            workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER,
        )
        train.set_caching_options(False)
        train.set_cpu_limit("4")
        train.set_accelerator_type("nvidia.com/gpu").set_accelerator_limit(1)
        train.set_env_variable("EPOCHS", "3")
        evaluation = load["evaluate_model"](model=train.outputs["output_model"], dataset=data.outputs["dataset"])
        with dsl.If(evaluation.outputs["Output"] == True):  # noqa: E712
            load["evaluate_model"](model=train.outputs["output_model"], dataset=data.outputs["dataset"], split="train")

    path = tmp_path / "p.yaml"
    compiler.Compiler().compile(from_yaml, str(path))
    spec, *_ = yaml.safe_load_all(path.read_text())
    assert spec["schemaVersion"] == "2.1.0"
    task = spec["root"]["dag"]["tasks"]["train-job"]
    assert task["cachingOptions"] == {}
    fields = [p["field"] for p in spec["components"]["comp-train-job"]["taskConfigPassthroughs"]]
    assert fields == ["RESOURCES", "ENV", "KUBERNETES_TOLERATIONS", "KUBERNETES_NODE_SELECTOR", "KUBERNETES_AFFINITY", "KUBERNETES_VOLUMES"]


def test_a_trainjob_component_from_a_function_compiles_in_a_pipeline(tmp_path):
    @trainjob_component(num_nodes=2)
    def fit(output_dir: str, epochs: int = 1):
        import os

        os.makedirs(output_dir, exist_ok=True)

    @dsl.pipeline(name="fn", pipeline_config=workspace_config("1Gi"))  # output_dir comes back on the workspace
    def fn():
        fit(epochs=3, run_id=dsl.PIPELINE_JOB_ID_PLACEHOLDER)

    compiler.Compiler().compile(fn, str(tmp_path / "fn.yaml"))
    spec = next(yaml.safe_load_all((tmp_path / "fn.yaml").read_text()))  # then the platform spec (the workspace)
    container = spec["deploymentSpec"]["executors"]["exec-fit"]["container"]
    assert "'source': 'def fit(output_dir: str, epochs: int = 1):" in " ".join(container["command"] + container.get("args", []))


def test_sample_pipeline_has_a_valid_name_workspace_and_no_cache_on_training():
    import re

    spec, platform = yaml.safe_load_all((REPO / "pipelines" / "llm_finetune" / "pipeline.yaml").read_text())
    assert re.match(r"^[a-z0-9][a-z0-9-]{0,127}$", spec["pipelineInfo"]["name"])
    assert spec["schemaVersion"] == "2.1.0"
    assert spec["root"]["dag"]["tasks"]["train-job"]["cachingOptions"] == {}
    assert platform["platforms"]["kubernetes"]["pipelineConfig"]["workspace"]["size"] == "10Gi"


def test_no_integer_input_defaults_to_none(generated):
    """kfp.local (2.17) runs int() on every integer input, so one left at a None default fails the task."""
    unset = []
    for path, text in generated.items():
        if path.name != "component.yaml":
            continue
        doc = yaml.safe_load(text)
        for name, spec in doc["root"]["inputDefinitions"]["parameters"].items():
            if spec["parameterType"] == "NUMBER_INTEGER" and spec.get("isOptional") and spec.get("defaultValue") is None:
                unset.append(f"{path.parent.name}.{name}")
    assert not unset, f"integer inputs with a None default (use a sentinel such as -1): {unset}"
