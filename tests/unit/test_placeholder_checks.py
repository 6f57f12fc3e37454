"""A placeholder typo or an artifact placeholder without its input fails when the pipeline is built, as the step would.

``{output_dir}`` for ``{output_model}`` used to reach the trainer literally, and the step "succeeded" with an
empty model; ``{dataset}`` without ``dataset=`` failed only on the cluster, after the steps before it ran.
"""

from typing import Any

import pytest
from kfp import dsl
from test_components_build_checks import built, refused_at_build, run_time_error

from kfp_trainer import cli, spec
from kfp_trainer.components import dataset_initializer, load_component_from_file, train_job, trainjob_component
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs
from kfp_trainer.spec.placeholders import unknown_placeholder_errors
from kfp_trainer.staging import NAMES
from tests.fakes import FakeBackend

MISTAKES = [
    ("typo in args", {"args": ["--out", "{output_dir}"]}, "args[1]", "did you mean {output_model}?"),
    ("typo inside an argument", {"args": ["--out={output_dir}/final"]}, "args[0]", "did you mean {output_model}?"),
    ("typo in the command", {"command": ["python", "train.py", "{datset}"]}, "command[2]", "did you mean {dataset}?"),
    ("typo in env", {"env": {"MODEL_DIR": "{model_dir}"}}, "env[MODEL_DIR]", "did you mean {model}?"),
    ("dataset not connected", {"args": ["--data", "{dataset}"]}, "dataset", "an artifact connected to the dataset input"),
    ("model not connected", {"env": {"BASE": "{model}/weights"}}, "model", "an artifact connected to the model input"),
]


@pytest.mark.parametrize(("what", "kwargs", "field", "says"), MISTAKES, ids=[m[0] for m in MISTAKES])
def test_a_placeholder_mistake_fails_the_build_with_the_message_the_step_prints(
    what, kwargs, field, says, tmp_path, monkeypatch, capsys
):
    at_build = refused_at_build(lambda: train_job(**kwargs))
    assert [e.field for e in at_build.errors] == [field] and says in str(at_build)
    at_run = run_time_error(train_job, tmp_path, monkeypatch, capsys, **kwargs)
    assert f"[kfp-trainer] error: {at_build}" in at_run, (str(at_build), at_run)


def test_the_message_names_the_task_the_value_and_the_known_placeholders():
    def body() -> None:
        train_job(args=["--epochs", "1"])
        train_job(args=["--out", "{output_dir}"])

    refused = refused_at_build(body)
    text = str(refused)
    assert "got '{output_dir}'" in text and "did you mean {output_model}?" in text
    assert all(f"{{{name}}}" in text for name in NAMES)
    notes = getattr(refused, "__notes__", None)  # Python 3.11+
    assert notes is None or any("task 'train-job-2'" in note for note in notes), notes


def test_connected_artifacts_and_known_placeholders_build():
    def body() -> None:
        data = dataset_initializer(uri="builtin://datasets/addition")
        train_job(args=["--data", "{dataset}", "--out", "{output_model}"], dataset=data.outputs["dataset"], backend="local")

    assert "{dataset}" in built(body)


@pytest.mark.parametrize(
    "text",
    ["--epochs={epoch}-{step}", "${HOME}/x", "{{ output_dir }}", "{ output_dir }", "--loss={loss:.2f}",
     "import json\nprint(f'{output_dir}')"],
)  # fmt: skip
def test_braces_that_are_not_meant_as_placeholders_pass(text):
    assert unknown_placeholder_errors({"args": [text], "command": [text], "env": {"X": text}}) == []
    assert "train-job" in built(lambda: train_job(args=[text]))


def test_a_pipeline_parameters_value_is_checked_when_the_step_runs_with_the_same_message(tmp_path, monkeypatch, capsys):
    @dsl.pipeline(name="params")
    def params(out: str = "{output_dir}", data: str = "{dataset}"):
        train_job(args=["--out", out, "--data", data])

    assert params.name == "params"  # built: the values are known only when the run starts
    literal = refused_at_build(lambda: train_job(args=["--out", "{output_dir}", "--data", "{dataset}"]))
    at_run = run_time_error(train_job, tmp_path, monkeypatch, capsys, args=["--out", "{output_dir}", "--data", "{dataset}"])
    assert f"[kfp-trainer] error: {literal}" in at_run
    assert {e.field for e in literal.errors} == {"args[1]", "dataset"}


def test_a_yaml_loaded_with_our_loader_is_checked_at_the_call():
    from pathlib import Path

    loaded = load_component_from_file(str(Path(__file__).resolve().parents[2] / "components" / "train_job" / "component.yaml"))
    refused = refused_at_build(lambda: loaded(args=["{output_dir}"]))
    assert [e.field for e in refused.errors] == ["args[0]"]


def test_a_training_function_that_reads_dataset_dir_needs_the_dataset_connected(tmp_path, monkeypatch, capsys):
    @trainjob_component
    def fit(dataset_dir: str, epochs: int = 1):
        print(dataset_dir, epochs)

    refused = refused_at_build(lambda: fit(epochs=2, backend="local"))
    assert [e.field for e in refused.errors] == ["dataset"]
    monkeypatch.setattr(FakeBackend, "runtime_info", _torch_runtime)
    at_run = run_time_error(fit, tmp_path, monkeypatch, capsys, epochs=2, backend="kubernetes")
    assert f"[kfp-trainer] error: {refused}" in at_run, (str(refused), at_run)

    def connected() -> None:
        data = dataset_initializer(uri="builtin://datasets/addition")
        fit(dataset=data.outputs["dataset"], backend="local")

    assert "fit" in built(connected)


def _torch_runtime(self: Any, inputs: Any) -> Any:
    """The torch-distributed ClusterTrainingRuntime as a cluster holds it (a training function's step reads it)."""
    from kfp_trainer.backends.base import RuntimeInfo
    from kfp_trainer.backends.local_runtime import BUILTIN_RUNTIMES

    document = BUILTIN_RUNTIMES["torch-distributed"]
    return RuntimeInfo.from_runtime(document, name=inputs.runtime, kind=inputs.runtime_kind, api_version="v2.2", num_nodes=None)


def test_the_library_and_the_cli_refuse_an_unknown_placeholder(capsys):
    with pytest.raises(InvalidSpecErrors, match=r"did you mean \{output_model\}"):
        spec.build_trainjob(run_id="r", args=["--out", "{output_dir}"])
    assert cli.main(["render", "--api-version", "v2.2", "--run-id", "r1", "--args=--out,{output_dir}"]) == 2
    assert "did you mean {output_model}?" in capsys.readouterr().err
    backend = FakeBackend()
    with pytest.raises(InvalidSpecErrors, match=r"did you mean \{output_model\}"):  # kfp-trainer launch's path
        Launcher(backend, LaunchOptions()).run(prepare(backend, TrainJobInputs.parse(run_id="r", args=["{output_dir}"])))
    assert not [c for c in backend.calls if c[0] in ("create", "submit")]


def test_the_placeholders_checked_are_those_the_launcher_fills_in():
    from kfp_trainer.spec.placeholders import PLACEHOLDERS

    assert tuple(PLACEHOLDERS) == NAMES
