"""A step reads its runtime once, parses its inputs once and builds its manifest at most twice, on the real local backend.

The ``train_job`` step and the typed steps (a Python function, ``trainjob_component``'s body; the
torchtune fine-tune) run real TrainJobs on :class:`~kfp_trainer.backends.local.LocalBackend`; the
test counts the runtime reads (``resolve_runtime``), the parses of the TrainJob inputs
(``TrainJobInputs.parse``) and of a typed trainer's settings, and the manifest builds
(:func:`kfp_trainer.spec.manifest.build`, which both the validator and the renderer call): one
check before the runtime is read and one render after it, not the same work again at the launch.
"""

from __future__ import annotations

import importlib
from pathlib import Path
from typing import Any

import pytest
from kfp import dsl

from kfp_trainer.backends.local import LocalBackend
from kfp_trainer.llm import inputs as llm_inputs
from kfp_trainer.spec import TrainJobInputs, manifest
from kfp_trainer.steps import StepArtifacts, StepOptions, run_train_job
from kfp_trainer.steps.function import run_function_job


def artifact(cls: type, path: Path) -> Any:
    a = cls(uri=str(path), name=path.name, metadata={})
    a.path = str(path)
    return a


@pytest.fixture
def counted(monkeypatch):
    """Counts of runtime reads, input and settings parses and manifest builds while the test runs."""
    counts = {"runtime reads": 0, "manifest builds": 0, "inputs parsed": 0, "settings parsed": 0}
    real_resolve, real_build = LocalBackend.resolve_runtime, manifest.build
    real_parse, real_settings = TrainJobInputs.parse.__func__, llm_inputs.parse

    def parse(cls, **inputs):
        counts["inputs parsed"] += 1
        return real_parse(cls, **inputs)

    def parse_settings(model, *args, **kwargs):  # the typed trainers' settings (and their sources)
        counts["settings parsed"] += 1
        return real_settings(model, *args, **kwargs)

    monkeypatch.setattr(TrainJobInputs, "parse", classmethod(parse))
    monkeypatch.setattr(llm_inputs, "parse", parse_settings)

    def resolve(self, inputs):
        counts["runtime reads"] += 1
        return real_resolve(self, inputs)

    def build(*args, **kwargs):
        counts["manifest builds"] += 1
        return real_build(*args, **kwargs)

    monkeypatch.setattr(LocalBackend, "resolve_runtime", resolve)
    real_submit = LocalBackend.submit

    def submit(self, manifest, *, runtime=None, stop=None):
        counts["submitted nodes"] = runtime.nodes if runtime is not None else None
        return real_submit(self, manifest, runtime=runtime, stop=stop)

    monkeypatch.setattr(LocalBackend, "submit", submit)
    # validate and render build through one function, spec.validate.checked_build
    monkeypatch.setattr(importlib.import_module("kfp_trainer.spec.validate"), "build", build)
    return counts


def step_outputs(tmp_path: Path, backend: LocalBackend, monkeypatch: pytest.MonkeyPatch) -> dict[str, Any]:
    """The step's artifacts and options; the step's backend is ``backend``."""
    monkeypatch.setattr("kfp_trainer.backends.select_backend", lambda kind="auto", **kw: backend)
    artifacts = StepArtifacts(
        output_model=artifact(dsl.Model, tmp_path / "model"), metrics=artifact(dsl.Metrics, tmp_path / "metrics"),
        report=artifact(dsl.HTML, tmp_path / "report.html"), trainjob_path=str(tmp_path / "trainjob"),
    )  # fmt: skip
    return {"artifacts": artifacts, "options": StepOptions(backend="local", start_timeout=0)}


def test_a_train_job_step_reads_its_runtime_once_and_builds_its_manifest_at_most_twice(tmp_path, counted, monkeypatch):
    backend = LocalBackend(tmp_path / "jobs")
    outcome = run_train_job(
        {"runtime": "torch-distributed", "command": ["python", "-c", "print('loss=0.5')"], "run_id": "r1", "task_name": "count",
         "num_nodes": 2},
        **step_outputs(tmp_path, backend, monkeypatch),
    )  # fmt: skip
    assert outcome.succeeded
    assert counted == {"runtime reads": 1, "manifest builds": 2, "submitted nodes": 2, "inputs parsed": 1, "settings parsed": 0}


def test_a_function_step_reads_its_runtime_and_its_settings_once_and_builds_its_manifest_at_most_twice(tmp_path, counted, monkeypatch):
    backend = LocalBackend(tmp_path / "jobs")
    source = "def fit(output_dir, epochs=1):\n    import os\n    open(os.path.join(output_dir, 'model.txt'), 'w').write(str(epochs))\n"
    outcome = run_function_job(
        source=source, function="fit", func_file="fit.py", arguments={"epochs": 3}, specials=["output_dir"],
        order=["output_dir", "epochs"],
        inputs={"runtime": "torch-distributed", "run_id": "r1", "task_name": "count-fn", "num_nodes": 2},
        **step_outputs(tmp_path, backend, monkeypatch),
    )  # fmt: skip
    assert outcome.succeeded
    assert (tmp_path / "model" / "model.txt").read_text() == "3"
    assert counted["runtime reads"] == 1
    assert counted["manifest builds"] <= 2
    assert counted["inputs parsed"] == 1 and counted["settings parsed"] == 1
    assert counted["submitted nodes"] == 2  # the backend is told the nodes the job asked for, not the runtime's default


class Submitted(Exception):
    """Raised in place of starting the job: what was prepared is all this test needs."""


def test_a_torchtune_step_reads_its_runtime_and_its_settings_once_and_builds_its_manifest_at_most_twice(tmp_path, counted, monkeypatch):
    from kfp_trainer.steps.finetune import run_torchtune_finetune

    backend = LocalBackend(tmp_path / "jobs")

    def submit(manifest, *, runtime=None, stop=None):
        raise Submitted(manifest)

    monkeypatch.setattr(backend, "submit", submit)  # the rest of the launch is other tests' subject
    with pytest.raises(Submitted) as sent:
        run_torchtune_finetune(
            method="lora", settings={"epochs": 1, "batch_size": 4, "lora_rank": 4},
            sources={"dataset_uri": "builtin://datasets/addition", "model_uri": "builtin://models/tiny-qwen2.5"},
            inputs={"runtime": "torchtune-qwen2.5-1.5b", "run_id": "r1", "task_name": "count-tune"},
            **step_outputs(tmp_path, backend, monkeypatch),
        )  # fmt: skip
    manifest = sent.value.args[0]
    assert manifest["spec"]["trainer"]["args"][:2] == ["batch_size=4", "epochs=1"]
    assert counted["runtime reads"] == 1
    assert counted["manifest builds"] <= 2
    assert counted["inputs parsed"] == 1 and counted["settings parsed"] == 1  # the TorchTuneConfig (builtin:// sources parse none)
