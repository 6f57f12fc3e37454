"""A step that needs a volume shared with its TrainJob, in a pipeline without a workspace, fails the compilation.

It used to compile, and the step refused to start only on the cluster, after the steps before it
(initializers, a baseline evaluation) had run.
"""

import tempfile
from pathlib import Path
from typing import Any

import pytest
from kfp import compiler, dsl, kubernetes
from test_components_build_checks import run_time_error

from kfp_trainer.components import torchtune_finetune, train_job, trainjob_component, trl_finetune, workspace_config
from kfp_trainer.errors import InvalidSpecErrors

SAVES_MODEL = {"command": ["python", "train.py"], "args": ["--out", "{output_model}"]}


def compile_text(pipeline: Any) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "p.yaml"
        compiler.Compiler().compile(pipeline, str(out))
        return out.read_text()


def refused_at_compile(pipeline: Any) -> InvalidSpecErrors:
    with pytest.raises(InvalidSpecErrors) as info:
        compile_text(pipeline)
    return info.value


def test_a_train_job_that_saves_its_model_needs_a_workspace_with_the_steps_own_message(tmp_path, monkeypatch, capsys):
    @dsl.pipeline(name="no-workspace")
    def no_workspace():
        train_job(**SAVES_MODEL)

    refused = refused_at_compile(no_workspace)
    assert [e.field for e in refused.errors] == ["workspace_path"]
    at_run = run_time_error(train_job, tmp_path, monkeypatch, capsys, backend="kubernetes", **SAVES_MODEL)
    assert f"[kfp-trainer] error: {refused.errors[0]}" in at_run, (str(refused), at_run)
    notes = getattr(refused, "__notes__", None)  # Python 3.11+
    assert notes is None or any("task 'train-job'" in n and "workspace_config(" in n and "mount_pvc" in n for n in notes)


def test_a_workspace_a_pvc_or_the_local_backend_each_satisfy_it():
    @dsl.pipeline(name="with-workspace", pipeline_config=workspace_config("1Gi"))
    def with_workspace():
        train_job(**SAVES_MODEL)

    @dsl.pipeline(name="with-pvc")
    def with_pvc():
        kubernetes.mount_pvc(train_job(**SAVES_MODEL), pvc_name="shared", mount_path="/shared")

    @dsl.pipeline(name="with-volume-inputs")
    def with_volume_inputs():
        train_job(**SAVES_MODEL, volumes=[{"name": "data", "persistentVolumeClaim": {"claimName": "d"}}],
                  volume_mounts=[{"name": "data", "mountPath": "/data"}])  # fmt: skip

    @dsl.pipeline(name="local-only")
    def local_only():
        train_job(**SAVES_MODEL, backend="local")

    @dsl.pipeline(name="no-placeholder")
    def no_placeholder():
        train_job(command=["python", "train.py"])

    for pipeline in (with_workspace, with_pvc, with_volume_inputs, local_only, no_placeholder):
        assert "train-job" in compile_text(pipeline), pipeline.name


def test_only_the_tasks_without_a_volume_are_named():
    @dsl.pipeline(name="mixed")
    def mixed():
        kubernetes.mount_pvc(train_job(**SAVES_MODEL), pvc_name="shared", mount_path="/shared")
        train_job(**SAVES_MODEL)

    notes = getattr(refused_at_compile(mixed), "__notes__", None)
    assert notes is None or any("task 'train-job-2'" in n and "task 'train-job'," not in n for n in notes), notes


def test_typed_trainers_that_hand_back_a_model_need_one_too():
    @trainjob_component
    def fit(output_dir: str):
        print(output_dir)

    @trainjob_component
    def score(epochs: int = 1):
        print(epochs)

    def pipeline_of(call: Any) -> Any:
        @dsl.pipeline(name="typed")
        def typed():
            call()

        return typed

    tune = refused_at_compile(pipeline_of(lambda: torchtune_finetune()))
    assert [e.field for e in tune.errors] == ["workspace_path"] and "fine-tuned model" in str(tune)
    trl = pipeline_of(lambda: trl_finetune(model_uri="hf://org/m", dataset_uri="hf://org/d"))
    assert [e.field for e in refused_at_compile(trl).errors] == ["workspace_path"]
    assert [e.field for e in refused_at_compile(pipeline_of(lambda: fit())).errors] == ["workspace_path"]
    assert "score" in compile_text(pipeline_of(lambda: score(epochs=2)))  # hands back no model: nothing to carry


def test_a_nested_pipeline_gets_it_from_the_pipeline_it_runs_in():
    @dsl.pipeline(name="inner")
    def inner():
        train_job(**SAVES_MODEL)

    @dsl.pipeline(name="outer", pipeline_config=workspace_config("1Gi"))
    def outer():
        inner()

    @dsl.pipeline(name="bare-outer")
    def bare_outer():
        inner()

    assert "train-job" in compile_text(outer)
    notes = getattr(refused_at_compile(bare_outer), "__notes__", None)
    assert notes is None or any("task 'train-job' (of pipeline 'inner')" in n for n in notes), notes
    refused_at_compile(inner)  # compiled on its own, it has no workspace either
