"""A user's mistakes caught while the pipeline is built (the real kfp 2.17 compiler), with the step's own message."""


import tempfile
from pathlib import Path
from typing import Any

import pytest
import yaml
from kfp import compiler, components, dsl

from kfp_trainer import spec
from kfp_trainer.components import (
    dataset_initializer,
    load_component_from_file,
    torchtune_finetune,
    train_job,
    trainjob_component,
    workspace_config,
)
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.steps.finetune import torchtune_settings
from kfp_trainer.steps.train_job import MISSING_CONTEXT
from tests.fakes import FakeBackend

REPO = Path(__file__).resolve().parents[2]
HF = "hf_" + "abcdefghijklmnopqrstuvwxyz0123456789"  # a Hugging Face token's shape
S3 = "s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI1K7MDENGbPxRfiCYEXAMPLEKEY@bucket/data"


def built(body: Any, **config: Any) -> str:
    """Compile a pipeline whose body is ``body``; the YAML text."""

    @dsl.pipeline(name="p", **config)
    def p():
        body()

    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.yaml"
        compiler.Compiler().compile(p, str(out))
        return out.read_text()


def refused_at_build(body: Any) -> InvalidSpecErrors:
    with pytest.raises(InvalidSpecErrors) as info:
        built(body)
    return info.value


class _Cluster(FakeBackend):
    """Just enough of a cluster for a step to reach its checks; refuses to create anything."""

    def __init__(self) -> None:
        super().__init__(namespace="team-a")

    def create(self, manifest: dict) -> None:
        raise AssertionError("nothing may be created")


def _artifact(cls: type, path: Path) -> Any:
    a = cls(uri=str(path), name=path.name, metadata={})
    a.path = str(path)
    return a


def run_time_error(component: Any, tmp_path: Path, monkeypatch: Any, capsys: Any, **kwargs: Any) -> str:
    """What the step prints when it runs with ``kwargs`` (as KFP would hand them over)."""
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: _Cluster())
    outputs = {
        "output_model": _artifact(dsl.Model, tmp_path / "o"), "metrics": _artifact(dsl.Metrics, tmp_path / "m"),
        "report": _artifact(dsl.HTML, tmp_path / "r"), "trainjob": str(tmp_path / "t"),
    }  # fmt: skip
    with pytest.raises(SystemExit) as exit_info:
        component.python_func(**outputs, run_id="run-1", task_name="train", task_config=dsl.TaskConfig(), **kwargs)
    assert exit_info.value.code == 2
    return capsys.readouterr().err


CASES = [
    ("node count", train_job, {"num_nodes": -2}),
    ("runtime name", train_job, {"runtime": "Torch_Distributed"}),
    ("half a GPU, flat", train_job, {"resources_per_node": {"gpu": 0.5}}),
    ("half a GPU, limits", train_job, {"resources_per_node": {"limits": {"nvidia.com/gpu": "500m"}}}),
    ("token in env", train_job, {"env": {"HF_TOKEN": HF}}),
    ("token in args", train_job, {"args": ["--hf-token", "secret-value-1234"]}),
    ("credentials in a URI", train_job, {"dataset_uri": S3}),
    ("time limit", train_job, {"start_timeout": -1.0}),
    ("method", torchtune_finetune, {"method": "lora2"}),
    ("half a GPU, torchtune", torchtune_finetune, {"resources_per_node": {"gpu": 0.5}}),
    ("torchtune runtime name", torchtune_finetune, {"runtime": "Qwen 2.5"}),
    ("credentials in a torchtune URI", torchtune_finetune, {"model_uri": S3}),
]


@pytest.mark.parametrize(("what", "component", "kwargs"), CASES, ids=[c[0] for c in CASES])
def test_a_literal_mistake_fails_when_the_pipeline_is_built_with_the_steps_own_message(
    what, component, kwargs, tmp_path, monkeypatch, capsys
):
    at_build = refused_at_build(lambda: component(**kwargs))
    at_run = run_time_error(component, tmp_path, monkeypatch, capsys, **kwargs)
    assert f"[kfp-trainer] error: {at_build}" in at_run, (str(at_build), at_run)
    for secret in (HF, "secret-value-1234", "wJalrXUtnFEMI1K7MDENGbPxRfiCYEXAMPLEKEY"):
        assert secret not in str(at_build) and secret not in "".join(getattr(at_build, "__notes__", []))


def test_each_refusal_names_the_field_the_value_and_what_is_allowed():
    gpu = refused_at_build(lambda: train_job(resources_per_node={"gpu": 0.5}))
    assert [str(e) for e in gpu.errors] == [
        "resources_per_node.limits['nvidia.com/gpu']: got 0.5; expected a whole number: nvidia.com/gpu counts devices, "
        "which cannot be split (ask for 1, or for a MIG slice where the cluster offers one)"
    ]
    many = refused_at_build(lambda: train_job(num_nodes=-2, runtime="Torch_Distributed", env={"HF_TOKEN": HF}))
    assert {e.field for e in many.errors} == {"num_nodes", "runtime", "env[0].value"}
    assert "got '<hidden>'" in str(many) and HF not in str(many)
    notes = getattr(many, "__notes__", None)  # Python 3.11+
    assert notes is None or any("refused while the pipeline was built" in note for note in notes)


def test_a_literal_credential_reaches_neither_the_yaml_nor_kfp_local(tmp_path, capfd, monkeypatch):
    from kfp import local
    from kfp.local import config

    monkeypatch.setattr(config.LocalExecutionConfig, "instance", config.LocalExecutionConfig.instance)  # restored after
    refused_at_build(lambda: dataset_initializer(uri=S3))
    refused_at_build(lambda: train_job(model_uri=S3))
    root = tmp_path / "root"
    local.init(runner=local.SubprocessRunner(use_venv=False), pipeline_root=str(root))
    with pytest.raises(InvalidSpecErrors) as info:
        train_job(env={"HF_TOKEN": HF}, backend="local")  # kfp.local would run (and print) the task
    out, err = capfd.readouterr()
    assert HF not in out + err + str(info.value)
    assert not root.exists() or not any(root.iterdir())  # no task ran


def test_pipeline_parameters_and_upstream_outputs_are_left_to_the_step(tmp_path):
    @dsl.pipeline(name="params")
    def params(token: str = "", nodes: int = 2):
        first = train_job()
        train_job(
            num_nodes=nodes, env={"HF_TOKEN": token}, args=["--hf-token", token, "--steps", nodes], dataset_secret=token,
            resources_per_node={"gpu": nodes}, runtime=f"rt-{nodes}", name_prefix=first.outputs["trainjob"],
        )

    compiler.Compiler().compile(params, str(tmp_path / "p.yaml"))
    task = next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))["root"]["dag"]["tasks"]["train-job-2"]
    assert task["inputs"]["parameters"]["num_nodes"] == {"componentInputParameter": "nodes"}
    assert task["inputs"]["parameters"]["name_prefix"]["taskOutputParameter"]["producerTask"] == "train-job"


def test_volumes_a_task_adds_itself_are_not_known_at_the_call():
    # kfp.kubernetes.mount_pvc gives the task its volume when it runs (TaskConfig passthrough)
    text = built(lambda: train_job(volume_mounts=[{"name": "data", "mountPath": "/data"}]))
    assert "/data" in text
    refused = refused_at_build(lambda: train_job(volume_mounts=[{"name": "data", "mountPath": "relative"}]))
    assert [e.field for e in refused.errors] == ["volume_mounts[0].mountPath"]


def test_integer_literals_are_accepted_for_float_inputs():
    def body() -> None:
        torchtune_finetune(method="lora", lora_alpha=16, lora_dropout=0, learning_rate=1)
        train_job(start_timeout=600, run_timeout=0)

    spec_doc = next(yaml.safe_load_all(built(body, pipeline_config=workspace_config("1Gi"))))
    tune = spec_doc["root"]["dag"]["tasks"]["torchtune-finetune"]["inputs"]["parameters"]
    assert tune["lora_alpha"]["runtimeValue"]["constant"] == 16.0 and tune["learning_rate"]["runtimeValue"]["constant"] == 1.0
    assert spec_doc["root"]["dag"]["tasks"]["train-job"]["inputs"]["parameters"]["start_timeout"]["runtimeValue"]["constant"] == 600.0
    assert torchtune_settings("lora", lora_alpha=16.0).peft_config.lora_alpha == 16  # the SDK writes 16, not 16.0


def test_launcher_tasks_default_to_caching_off_and_can_turn_it_on():
    @trainjob_component
    def fit(output_dir: str, epochs: int = 1):
        print(output_dir, epochs)

    def body() -> None:
        dataset_initializer(uri="builtin://datasets/addition")
        train_job()
        torchtune_finetune()
        fit(epochs=2)
        train_job().set_caching_options(True)

    tasks = next(yaml.safe_load_all(built(body, pipeline_config=workspace_config("1Gi"))))["root"]["dag"]["tasks"]
    assert tasks["dataset-initializer"]["cachingOptions"] == {"enableCache": True}
    assert [tasks[t]["cachingOptions"] for t in ("train-job", "torchtune-finetune", "fit")] == [{}, {}, {}]
    assert tasks["train-job-2"]["cachingOptions"] == {"enableCache": True}


def test_yaml_loaded_with_our_loader_gets_the_same_checks_and_defaults():
    loaded = load_component_from_file(str(REPO / "components" / "train_job" / "component.yaml"))
    refused = refused_at_build(lambda: loaded(num_nodes=-2))
    assert [e.field for e in refused.errors] == ["num_nodes"]
    tasks = next(yaml.safe_load_all(built(lambda: loaded(start_timeout=60))))["root"]["dag"]["tasks"]
    assert tasks["train-job"]["cachingOptions"] == {}


def test_a_step_without_its_run_context_says_how_to_load_the_yaml(tmp_path, monkeypatch, capsys):
    plain = components.load_component_from_file(str(REPO / "components" / "train_job" / "component.yaml"))
    run_id = plain.component_spec.inputs["run_id"].default
    assert run_id == dsl.PIPELINE_JOB_ID_PLACEHOLDER  # what such a task receives: the default, unresolved
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: _Cluster())
    outputs = {"output_model": _artifact(dsl.Model, tmp_path / "o"), "metrics": _artifact(dsl.Metrics, tmp_path / "m"),
               "report": _artifact(dsl.HTML, tmp_path / "r"), "trainjob": str(tmp_path / "t")}  # fmt: skip
    with pytest.raises(SystemExit):
        train_job.python_func(**outputs, run_id=run_id, task_name="train", num_nodes=-1)
    out = capsys.readouterr().out
    assert MISSING_CONTEXT in out and "kfp_trainer.components.load_component_from_file" in MISSING_CONTEXT
    with pytest.raises(SystemExit):
        train_job.python_func(**outputs, run_id="run-1", task_name="train", num_nodes=-1)
    assert MISSING_CONTEXT not in capsys.readouterr().out


def test_workspace_access_modes_may_be_one_string():
    patch = workspace_config("1Gi", access_modes="ReadWriteMany").workspace.get_workspace()["kubernetes"]["pvcSpecPatch"]
    assert patch == {"accessModes": ["ReadWriteMany"]}
    with pytest.raises(ValueError, match="ReadWriteManyy"):
        workspace_config("1Gi", access_modes="ReadWriteManyy")


def test_resources_per_node_in_either_shape_for_every_component():
    flat = spec.build_trainjob(run_id="r", task_name="t", resources_per_node={"gpu": 2, "cpu": 4, "memory": "16Gi"})
    assert flat["spec"]["trainer"]["resourcesPerNode"] == {
        "requests": {"nvidia.com/gpu": "2", "cpu": "4", "memory": "16Gi"},
        "limits": {"nvidia.com/gpu": "2", "cpu": "4", "memory": "16Gi"},
    }
    limits = torchtune_settings("full", resources_per_node={"limits": {"nvidia.com/gpu": 2, "cpu": 4.0}})
    assert limits.resources_per_node == {"limits": {"nvidia.com/gpu": 2, "cpu": 4}}
    from kfp_trainer.llm.render import resources_per_node

    assert resources_per_node(limits.resources_per_node) == {"limits": {"nvidia.com/gpu": 2, "cpu": 4}}


@pytest.mark.parametrize("gpus", [0.5, "500m", "1.5"])
def test_a_fraction_of_a_gpu_is_refused_in_both_shapes(gpus):
    with pytest.raises(InvalidSpecErrors, match="counts devices"):
        spec.build_trainjob(run_id="r", resources_per_node={"limits": {"nvidia.com/gpu": gpus}})
    with pytest.raises(InvalidSpecErrors, match=r"resources_per_node.*gpu: .* counts devices"):
        torchtune_settings("full", resources_per_node={"gpu": gpus})
    with pytest.raises(InvalidSpecErrors, match="counts devices"):
        torchtune_settings("full", resources_per_node={"requests": {"amd.com/gpu": gpus}})
    assert spec.build_trainjob(run_id="r", resources_per_node={"limits": {"cpu": gpus}})  # CPUs divide


def test_a_training_functions_literals_are_checked_at_the_call():
    @trainjob_component(resources_per_node={"gpu": 0.5})
    def half(output_dir: str):
        print(output_dir)

    refused = refused_at_build(lambda: half())
    assert [e.field for e in refused.errors] == ["resources_per_node.limits['nvidia.com/gpu']"]

    @trainjob_component
    def fit(output_dir: str, hf_token: str = "", epochs: int = 1):
        print(output_dir, hf_token, epochs)

    refused = refused_at_build(lambda: fit(hf_token=HF, num_nodes=-2))
    assert {e.field for e in refused.errors} == {"hf_token", "num_nodes"} and HF not in str(refused)
    assert "fit" in built(lambda: fit(epochs=3), pipeline_config=workspace_config("1Gi"))
    # the runtime's node count and image, as the SDK leaves them
    assert "fit" in built(lambda: fit(epochs=3, num_nodes=0, image=""), pipeline_config=workspace_config("1Gi"))


def test_a_launcher_in_a_nested_pipeline_gets_the_outer_pipelines_workspace(tmp_path):
    from test_compiled_yaml_rules import documents, violations

    @dsl.pipeline(name="inner")
    def inner(steps: int = 3):
        train_job(command=["python", "t.py"], args=["--steps", steps])

    @dsl.pipeline(name="middle")
    def middle(again: bool = True):
        inner(steps=4)
        with dsl.If(again == True):  # noqa: E712
            inner(steps=5)

    @dsl.pipeline(name="outer", pipeline_config=workspace_config("1Gi"))
    def outer():
        inner(steps=1)
        middle()

    compiler.Compiler().compile(outer, str(tmp_path / "outer.yaml"))
    text = (tmp_path / "outer.yaml").read_text()
    assert violations(text) == []  # among them: "workspace_path must be {{$.workspace_path}}"
    spec_doc, _ = documents(text)
    dags = [c.get("dag") or {} for c in spec_doc["components"].values()]
    launchers = [task for dag in dags for name, task in (dag.get("tasks") or {}).items() if name == "train-job"]
    assert len(launchers) == 3
    assert all(t["inputs"]["parameters"]["workspace_path"] == {"runtimeValue": {"constant": "{{$.workspace_path}}"}} for t in launchers)
    # the nested pipeline itself is unchanged: compiled alone (no workspace) it is still accepted
    compiler.Compiler().compile(inner, str(tmp_path / "inner.yaml"))
    alone, _ = documents((tmp_path / "inner.yaml").read_text())
    assert "workspace_path" not in alone["root"]["dag"]["tasks"]["train-job"]["inputs"]["parameters"]


def _trl_pipeline(**kw):
    from kfp_trainer.components import trl_finetune

    kw = {"model_uri": "builtin://models/tiny-char-lm", "dataset_uri": "builtin://datasets/addition", **kw}

    @dsl.pipeline
    def p():
        trl_finetune(**kw)

    return p


@pytest.mark.parametrize(
    "kw, field",
    [({"method": "grpo2"}, "method"), ({"num_nodes": -2}, "num_nodes"), ({"lora_alpha": 16}, "lora_alpha"),
     ({"resources_per_node": {"gpu": 0.5}}, "resources_per_node")],
)  # fmt: skip
def test_trl_finetune_literals_are_checked_when_the_pipeline_is_built(kw, field):
    with pytest.raises(InvalidSpecErrors) as e:
        _trl_pipeline(**kw)
    assert any(err.field.startswith(field) for err in e.value.errors), e.value


def test_trl_finetune_refuses_a_uri_with_credentials_at_the_call_without_showing_it():
    with pytest.raises(InvalidSpecErrors) as e:
        _trl_pipeline(model_uri="s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMIK7MDENGbPxRfiCYEXAMPLEKEY@bucket/m")
    assert "wJalr" not in str(e.value) and "AKIAIOSFODNN7EXAMPLE" not in str(e.value)


def test_trl_finetune_accepts_good_literals():
    _trl_pipeline(method="dpo", beta=0.1, use_peft=True, lora_alpha=16, lora_r=4)
