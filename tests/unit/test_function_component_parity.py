"""trainjob_component as the SDK's CustomTrainer: the source it ships, the call it writes, the names it leaves alone.

The TrainJobs themselves are compared with the SDK's on the API server in
tests/integration/test_sdk_interop_components.py; these are the pure parts.
"""

from __future__ import annotations

import functools
import inspect
import textwrap
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

import kfp_trainer.components as kc
from kfp_trainer.components import trainjob_component
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.steps import function as steps_function
from kfp_trainer.steps.function import FunctionTrainer, function_job_arguments

RUNTIMES = Path(__file__).resolve().parents[3] / "shared" / "kubeflow-trainer-v2.3.0" / "runtimes"


def logged(func):
    @functools.wraps(func)
    def wrapper(*args, **kwargs):
        return func(*args, **kwargs)

    return wrapper


def sdk_source(func) -> str:
    """What the kubeflow SDK 0.5.0 sends for ``func``: ``textwrap.dedent(inspect.getsource(func))``."""
    return textwrap.dedent(inspect.getsource(func))


@pytest.fixture
def constants(monkeypatch):
    """Calls a component's body; returns the input values and factory constants it hands the step."""

    def call(component) -> dict:
        seen: dict = {}
        monkeypatch.setattr(steps_function, "run_function_component", lambda values, fixed: seen.update(values=values, constants=fixed))
        required = {n: None for n, p in inspect.signature(component.python_func).parameters.items() if p.default is p.empty}
        component.python_func(**required)
        return seen

    return call


# --------------------------------------------------------------------------- the source


def test_a_decorated_function_keeps_its_decorators_as_the_sdk_does(constants):
    @logged
    def fit(lr: float = 0.1):
        print(lr)

    assert constants(trainjob_component(fit))["constants"]["source"] == sdk_source(fit)
    assert sdk_source(fit).startswith("@logged\ndef fit(")


def test_the_factorys_own_decorator_line_is_left_out_and_the_ones_below_it_stay(constants):
    @trainjob_component(num_nodes=2)
    @logged
    def fit(lr: float = 0.1):
        print(lr)

    source = constants(fit)["constants"]["source"]
    assert source == "@logged\ndef fit(lr: float = 0.1):\n    print(lr)\n"

    @kc.trainjob_component(  # through the module, over several lines
        num_nodes=2,
    )
    def bare(lr: float = 0.1):
        print(lr)

    assert constants(bare)["constants"]["source"] == "def bare(lr: float = 0.1):\n    print(lr)\n"


def test_no_parameters_is_called_without_arguments_as_the_sdk_does(constants):
    def hello():
        print("hi")

    fixed = constants(trainjob_component(hello))["constants"]
    args = function_job_arguments({"runtime": "torch-distributed"}, fixed)
    trainer = FunctionTrainer(**{k: args[k] for k in ("source", "function", "func_file", "arguments", "specials", "order")})
    assert trainer.func_args({}) is None
    command = trainer.finalize(SimpleNamespace(local=False), SimpleNamespace(document=runtime_doc()), {})["command"]
    assert "\nhello()\n" in command[-1] and "**{}" not in command[-1]


# --------------------------------------------------------------------------- the arguments

def test_every_parameter_name_reaches_the_function_with_its_own_value(monkeypatch):
    """Names of modules and of what a generated body might bind itself (the old one bound steps and inputs)."""

    def fit(steps: str = "a", inputs: str = "b", kfp: str = "c", dsl: str = "d", os: str = "e", sys: str = "f", json: str = "g",
            self: str = "h", values: str = "i", module: str = "j", locals: str = "k", exit_on_error: str = "l"):  # fmt: skip
        pass

    component = trainjob_component(fit)
    given = {n: f"value of {n}" for n in inspect.signature(fit).parameters}
    seen: dict = {}
    monkeypatch.setattr(steps_function, "run_function_job", lambda **kw: seen.update(kw))
    component.python_func(output_model=None, metrics=None, report=None, trainjob="", **given)
    assert seen["arguments"] == given
    assert seen["inputs"]["runtime"] == "torch-distributed" and seen["inputs"]["num_nodes"] is None and seen["inputs"]["image"] is None


def test_func_args_hold_what_differs_from_the_defaults_in_the_parameters_order_and_types():
    fixed = {
        "source": "def f(a, b=1, c=0.5, d='x', output_dir=''): pass", "function": "f", "func_file": "f.py",
        "parameters": ["a", "b", "c", "output_dir", "d"], "defaults": {"b": 1, "c": 0.5, "d": "x"},
        "types": {"a": "int", "b": "int", "c": "float", "d": "str"},
    }  # fmt: skip
    args = function_job_arguments({"a": 2.0, "b": 1.0, "c": 1, "d": "y"}, fixed)
    assert args["arguments"] == {"a": 2, "c": 1.0, "d": "y"}  # b is the default; JSON numbers in the parameters' types
    assert type(args["arguments"]["a"]) is int and type(args["arguments"]["c"]) is float
    trainer = FunctionTrainer(**{k: args[k] for k in ("source", "function", "func_file", "arguments", "specials", "order")})
    assert list(trainer.func_args({"output_dir": "/out"})) == ["a", "c", "output_dir", "d"]
    assert function_job_arguments({"a": 1, "b": 1, "c": 0.5, "d": "x"}, fixed)["arguments"] == {"a": 1}


def test_the_runtimes_image_and_node_count_unless_set():
    def fit(lr: float = 0.1):
        pass

    spec = trainjob_component(fit).component_spec.inputs
    assert spec["num_nodes"].default == 0 and spec["image"].default == ""
    spec = trainjob_component(fit, num_nodes=2, image="python:3.12").component_spec.inputs
    assert spec["num_nodes"].default == 2 and spec["image"].default == "python:3.12"
    fixed = {"source": "", "function": "fit", "func_file": "f.py", "parameters": []}
    args = function_job_arguments({"num_nodes": 0, "image": ""}, fixed)
    assert args["inputs"]["num_nodes"] is None and args["inputs"]["image"] is None


def test_parameters_without_annotations_take_their_defaults_type():
    def fit(lr=0.01, epochs=3, name="run", verbose=False, tags=None, *rest, extra: dict = None, **more):  # noqa: B006
        pass

    with pytest.raises(TypeError, match="'tags' of fit: annotate it"):
        trainjob_component(fit)

    def fit2(lr=0.01, epochs=3, name="run", verbose=False, *rest, extra: dict = None, **more):
        pass

    inputs = trainjob_component(fit2).component_spec.inputs
    assert [inputs[n].type for n in ("lr", "epochs", "name", "verbose", "extra")] == ["Float", "Integer", "String", "Boolean", "Dict"]
    assert "rest" not in inputs and "more" not in inputs


@pytest.mark.parametrize(
    ("source", "message"),
    [
        ("def fit(a: int, /): pass", "positional-only"),
        ("def fit(runtime: str): pass", "taken by the component's own inputs"),
        ("def fit(output_model: str): pass", "taken by the component's own inputs"),
        ("def fit(dataset: str, dataset_dir: str): pass", "taken by the component's own inputs"),
        ("def fit(_private: str): pass", "start with a letter"),
        ("def fit(Output: str): pass", "KFP reserves the input name 'Output'"),
    ],
)
def test_parameters_a_component_cannot_take_are_refused_by_name(tmp_path, source, message):
    path = tmp_path / "fit_module.py"
    path.write_text(source + "\n")
    scope: dict = {"__name__": "fit_module"}
    exec(compile(path.read_text(), str(path), "exec"), scope)  # noqa: S102 - a file, so that getsource finds it
    with pytest.raises(TypeError, match=message):
        trainjob_component(scope["fit"])


def test_a_dataset_parameter_is_free_when_the_function_takes_no_dataset_dir():
    def fit(dataset: str = "alpaca", model: str = "qwen"):
        pass

    inputs = trainjob_component(fit).component_spec.inputs
    assert inputs["dataset"].type == "String" and inputs["model"].type == "String"


# --------------------------------------------------------------------------- resources


def runtime_doc() -> dict:
    return yaml.safe_load((RUNTIMES / "torch_distributed.yaml").read_text())


def test_flat_resources_go_to_the_trainer_and_are_mapped_as_the_sdk_maps_them():
    fixed = {"source": "def f(): pass", "function": "f", "func_file": "f.py", "parameters": [],
             "resources_per_node": {"cpu": 4, "memory": "8Gi", "gpu": 1}}  # fmt: skip
    args = function_job_arguments({"runtime": "torch-distributed"}, fixed)
    assert args["inputs"]["resources_per_node"] is None and args["resources_per_node"] == {"cpu": 4, "memory": "8Gi", "gpu": 1}
    keys = ("source", "function", "func_file", "arguments", "specials", "order", "resources_per_node")
    trainer = FunctionTrainer(**{k: args[k] for k in keys})
    ctx, runtime = SimpleNamespace(local=False), SimpleNamespace(document=runtime_doc())
    trainer.configure(ctx, runtime, None)
    expected = {"cpu": 4, "memory": "8Gi", "nvidia.com/gpu": 1}
    assert trainer.finalize(ctx, runtime, {})["resources_per_node"] == {"requests": expected, "limits": expected}
    kube = {**fixed, "resources_per_node": {"limits": {"cpu": 2}}}
    args = function_job_arguments({"runtime": "torch-distributed"}, kube)
    assert args["inputs"]["resources_per_node"] == {"limits": {"cpu": 2}} and args["resources_per_node"] is None


def test_bad_flat_resources_are_refused_before_anything_is_created():
    ctx, runtime = SimpleNamespace(local=False), SimpleNamespace(document=runtime_doc())
    for resources, message in (({"gpu": 1, "mig-1g.5gb": 1}, "either nvidia.com/gpu or a MIG slice"), ({"cpu": "lots"}, "not a quantity")):
        trainer = FunctionTrainer(source="def f(): pass", function="f", func_file="f.py", arguments={}, specials=[],
                                  resources_per_node=resources)  # fmt: skip
        with pytest.raises(InvalidSpecErrors, match=message):
            trainer.configure(ctx, runtime, None)


def test_a_parameter_named_like_an_input_artifact_is_the_functions_own_value():
    """Without dataset_dir / model_dir the component has no dataset / model artifact: those names may be the function's."""
    fixed = {"source": "def f(dataset: str = 'a', model: str = 'b'): pass", "function": "f", "func_file": "f.py",
             "parameters": ["dataset", "model"], "defaults": {"dataset": "a", "model": "b"},
             "types": {"dataset": "str", "model": "str"}}  # fmt: skip
    args = function_job_arguments({"dataset": "mnist", "model": "resnet", "runtime": "torch-distributed"}, fixed)
    assert args["arguments"] == {"dataset": "mnist", "model": "resnet"}
    assert args["artifacts"].dataset is None and args["artifacts"].model is None
    taking = {**fixed, "source": "def f(dataset_dir: str): pass", "parameters": ["dataset_dir"], "defaults": {}, "types": {}}
    artifact = SimpleNamespace(path="/in", uri="u", metadata={})
    assert function_job_arguments({"dataset": artifact, "runtime": "r"}, taking)["artifacts"].dataset is artifact


def test_the_step_sends_no_trainer_args_when_none_were_given_as_the_sdk_does(tmp_path, monkeypatch):
    """Nothing sets args for a function: the TrainJob has no spec.trainer.args, as the SDK's CustomTrainer job has none."""
    from kfp_trainer.jobstatus import JobStatus, Phase
    from kfp_trainer.steps import StepArtifacts, StepOptions
    from tests.fakes import FakeBackend

    fake = FakeBackend([JobStatus(Phase.SUCCEEDED)], hold_logs=False)
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: fake)
    fixed = {"source": "def hello():\n    print('hi')\n", "function": "hello", "func_file": "hello.py", "parameters": []}
    args = function_job_arguments({"runtime": "torch-distributed", "run_id": "r1", "task_name": "hello"}, fixed)
    out = tmp_path / "model"
    args["artifacts"] = StepArtifacts(
        output_model=SimpleNamespace(path=str(out), uri=str(out), metadata={}), metrics=SimpleNamespace(log_metric=lambda *a: None),
        report=SimpleNamespace(path=str(tmp_path / "report.html")), trainjob_path=str(tmp_path / "trainjob"),
    )  # fmt: skip
    args["options"] = StepOptions(backend="kubernetes", start_timeout=0)
    monkeypatch.setattr(FakeBackend, "runtime_info", lambda self, inputs: _torch_runtime(inputs))
    steps_function.run_function_job(**args)
    trainer = fake.submitted[0]["spec"]["trainer"]
    assert "args" not in trainer and trainer["command"][:2] == ["bash", "-c"]


def _torch_runtime(inputs):
    from kfp_trainer.backends.base import RuntimeInfo

    return RuntimeInfo.from_runtime(runtime_doc(), name=inputs.runtime, kind=inputs.runtime_kind, api_version="v2.2", num_nodes=None)
