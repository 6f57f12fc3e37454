"""The pieces under the samples and the run context of launcher tasks, without a pipeline run."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml
from kfp import compiler, dsl

from kfp_trainer.components import train_job, workspace_config
from kfp_trainer.errors import UserError
from kfp_trainer.steps import classify, sweep
from kfp_trainer.trainers import digits


class Art:
    """An artifact as KFP hands it to a component: a path, a URI, metadata."""

    def __init__(self, path: Path, metadata: dict | None = None) -> None:
        self.path, self.uri, self.metadata = str(path), str(path), dict(metadata or {})

    def log_metric(self, name: str, value: float) -> None:
        self.metadata[name] = value

    def log_confusion_matrix(self, categories: list[str], matrix: list[list[int]]) -> None:
        self.metadata["confusionMatrix"] = {"categories": categories, "matrix": matrix}


def compiled_task(pipeline, tmp_path: Path, task: str = "train-job") -> dict:
    compiler.Compiler().compile(pipeline, str(tmp_path / "p.yaml"))
    spec = next(yaml.safe_load_all((tmp_path / "p.yaml").read_text()))
    return spec["root"]["dag"]["tasks"][task]["inputs"]["parameters"]


def test_a_pipeline_without_workspace_gets_the_run_identity_but_no_workspace_path(tmp_path):
    @dsl.pipeline(name="no-workspace")
    def no_workspace():
        train_job(image="python:3.11", command=["python", "train.py"]).set_caching_options(False)

    given = compiled_task(no_workspace, tmp_path)
    assert given["run_id"]["runtimeValue"]["constant"] == "{{$.pipeline_job_uuid}}"
    assert given["task_id"]["runtimeValue"]["constant"] == "{{$.pipeline_task_uuid}}"
    assert "workspace_path" not in given  # else the backend would mount a PVC that does not exist


def test_values_the_call_gives_win_over_the_filled_in_context(tmp_path):
    @dsl.pipeline(name="explicit", pipeline_config=workspace_config("1Gi"))
    def explicit():
        train_job(command=["python", "t.py"], run_id="fixed-run", task_name="my-train", workspace_path="/data")

    given = compiled_task(explicit, tmp_path)
    assert given["run_id"]["runtimeValue"]["constant"] == "fixed-run"
    assert given["task_name"]["runtimeValue"]["constant"] == "my-train"
    assert given["workspace_path"]["runtimeValue"]["constant"] == "/data"
    assert given["pipeline_name"]["runtimeValue"]["constant"] == "{{$.pipeline_job_name}}"


def test_workspace_config_refuses_what_the_backend_refuses():
    patch = workspace_config("5Gi", access_modes=["ReadWriteOnce"], storage_class="fast").workspace.get_workspace()
    assert patch["kubernetes"]["pvcSpecPatch"] == {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast"}
    with pytest.raises(ValueError, match="empty storageClassName"):
        workspace_config("5Gi", storage_class="")
    with pytest.raises(ValueError, match="ReadWriteMany"):
        workspace_config("5Gi", access_modes=["RWX"])
    with pytest.raises(ValueError, match="size"):
        workspace_config("")


def test_confusion_matrix_and_scores_are_counts_and_finite_numbers():
    matrix = classify.confusion_matrix([0, 0, 1, 2, 2], [0, 1, 1, 2, 0], 4)
    assert matrix == [[1, 1, 0, 0], [0, 1, 0, 0], [1, 0, 1, 0], [0, 0, 0, 0]]
    values = classify.scores(matrix)
    assert values["accuracy"] == pytest.approx(3 / 5) and values["recall_class_3"] == 0.0  # unseen class: 0, not NaN
    with pytest.raises(ValueError, match="out of range"):
        classify.confusion_matrix([0], [7], 4)
    with pytest.raises(ValueError, match="2 labels but 1 predictions"):
        classify.confusion_matrix([0, 1], [0], 4)


def test_classifier_evaluation_logs_metrics_and_the_matrix(tmp_path):
    metrics, confusion = Art(tmp_path / "m"), Art(tmp_path / "c")
    values = classify.run_classifier_evaluation(
        model=Art(tmp_path), dataset=Art(tmp_path), metrics=metrics, confusion=confusion,
        predict_fn=lambda m, d, s: ([0, 1, 1], [0, 1, 0], ["a", "b"]),
    )
    assert metrics.metadata["accuracy"] == values["accuracy"] == pytest.approx(2 / 3, abs=1e-6)
    assert confusion.metadata["confusionMatrix"] == {"categories": ["a", "b"], "matrix": [[1, 0], [1, 1]]}


def test_best_index_follows_the_metrics_direction_and_ignores_missing_values():
    assert sweep.best_index([{"val_accuracy": 0.5}, {"val_accuracy": float("nan")}, {"val_accuracy": 0.7}], "val_accuracy") == 2
    assert sweep.best_index([{"val_loss": 0.5}, {"val_loss": 0.2}], "val_loss") == 1
    assert sweep.best_index([{"score": 1.0}, {"score": 1.0}], "score") == 0  # ties: the first
    assert sweep.best_index([{"x": 1.0}, {"x": 2.0}], "x", higher_is_better=False) == 0
    with pytest.raises(UserError, match="no candidate has a numeric 'f1': the metrics they have are loss"):
        sweep.best_index([{"loss": 1.0}], "f1")


def test_select_best_copies_the_winner_and_tabulates_every_point(tmp_path):
    models, metrics = [], []
    for i, (lr, acc) in enumerate(((0.1, 0.8), (0.2, 0.9), (0.3, 0.85))):
        d = tmp_path / f"model-{i}"
        d.mkdir()
        (d / "model.safetensors").write_text(f"weights {i}")
        (d / "training_info.json").write_text(json.dumps({"hyperparameters": {"learning_rate": lr}}))
        models.append(Art(d, {"trainjob": f"ns/job-{i}"}))
        metrics.append(Art(tmp_path / f"m{i}", {"val_accuracy": acc}))
    best_model, best_metrics, table = Art(tmp_path / "best"), Art(tmp_path / "bm"), Art(tmp_path / "table.md")
    index = sweep.run_select_best(models=models, metrics=metrics, metric="val_accuracy", best_model=best_model,
                                  best_metrics=best_metrics, comparison=table)
    assert index == 1 and (tmp_path / "best" / "model.safetensors").read_text() == "weights 1"
    assert best_model.metadata["hyperparameters"] == '{"learning_rate": 0.2}' and best_model.metadata["trainjob"] == "ns/job-1"
    text = (tmp_path / "table.md").read_text()
    assert text.count("ns/job-") == 3 and "| **1** (best) | 0.9 | 0.2 | ns/job-1 |" in text
    with pytest.raises(UserError, match="3 models but 2 metrics"):
        sweep.run_select_best(models=models, metrics=metrics[:2], metric="val_accuracy", best_model=best_model,
                              best_metrics=best_metrics, comparison=table)


def test_digits_are_split_per_class_without_overlap(tmp_path):
    np = pytest.importorskip("numpy")
    pytest.importorskip("sklearn")
    meta = digits.prepare(tmp_path, seed=3)
    sizes = {s: meta[f"{s}_examples"] for s in digits.SPLITS}
    assert sum(sizes.values()) == 1797 and sizes["test"] == pytest.approx(0.25 * 1797, abs=10)
    splits = {s: digits.load_split(tmp_path, s) for s in digits.SPLITS}
    rows = [tuple(r) for s in digits.SPLITS for r in splits[s][0]]
    assert float(splits["train"][0].max()) <= 1.0 and set(np.unique(splits["test"][1])) == set(range(10))
    assert len(rows) == 1797
    with pytest.raises(FileNotFoundError, match="prepare"):
        digits.load_split(tmp_path, "holdout")


def test_sweep_points_override_the_trainers_options_with_clear_errors():
    import argparse

    ns = argparse.Namespace(learning_rate=0.1, hidden=64, epochs=3, batch_size=32, seed=0)
    assert vars(digits.apply_hyperparameters(ns, "learning_rate=0.5,hidden=16.0")) == {
        "learning_rate": 0.5, "hidden": 16, "epochs": 3, "batch_size": 32, "seed": 0}
    for bad, message in (("dropout=0.1", "unknown 'dropout'"), ("hidden=1.5", "not an integer"), ("lr", "name=value"),
                         ('{"hidden": "x"}', "not an integer")):
        with pytest.raises(SystemExit, match=message):
            digits.apply_hyperparameters(ns, bad)
