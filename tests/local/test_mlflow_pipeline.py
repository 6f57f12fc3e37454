"""The sample pipeline (``make demo``'s) tracked in a real MLflow server, its approved model registered, its run in the MLflow UI.

``kfp-trainer run pipelines/llm_finetune --local`` with ``MLFLOW_TRACKING_URI`` set, as a user runs
it; then the MLflow UI's page of the training run opened in headless Chromium: its DOM must show
the run, and the screenshot is the one in ``docs/mlflow.md`` (``KFP_TRAINER_UPDATE_DOCS=1``
writes it to ``docs/images/mlflow-run.png``).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import uuid
from pathlib import Path

import pytest

from kfp_trainer.tracking.registry import alias_version
from tests.local.test_pipelines_local import artifact, browse, png_pixels, run_pipeline

REPO = Path(__file__).resolve().parents[2]
SCREENSHOT = REPO / "docs" / "images" / "mlflow-run.png"


def browse_url(url: str, tmp: Path, *mode: str) -> subprocess.CompletedProcess:
    """Open ``url`` in headless Chromium; the MLflow UI is a React app: give it time."""
    return browse(url, tmp, "--virtual-time-budget=30000", *mode, window="1400,1300", timeout=180)


@pytest.mark.slow
def test_the_sample_pipeline_is_tracked_registers_its_approved_model_and_the_ui_shows_the_run(tmp_path, monkeypatch, mlflow_server):
    experiment, model_name = f"llm-finetune-{uuid.uuid4().hex[:6]}", f"tiny-char-lm-addition-{uuid.uuid4().hex[:6]}"
    for key in [k for k in os.environ if k.startswith("MLFLOW_")]:
        monkeypatch.delenv(key)
    monkeypatch.setenv("MLFLOW_TRACKING_URI", mlflow_server.url)
    monkeypatch.setenv("MLFLOW_EXPERIMENT_NAME", experiment)
    outputs = run_pipeline(
        "llm_finetune", tmp_path / "run", max_steps=120, time_budget_seconds=40, eval_examples=100, gate_metric="loss",
        min_improvement=0.5, registered_model=model_name,
    )  # fmt: skip
    # the training step's run: the trainer's settings and loss curve, the launcher's TrainJob and times
    [run] = mlflow_server.runs(experiment)
    info = run["info"]
    tags = {t["key"]: t["value"] for t in run["data"]["tags"]}
    params = {p["key"]: p["value"] for p in run["data"]["params"]}
    trained = artifact(outputs, "train-job", "output_model")["metadata"]
    assert info["status"] == "FINISHED" and trained["mlflow_run_id"] == info["run_id"]
    assert tags["kfp_trainer.trainjob"] == trained["trainjob"] and tags["kfp_trainer.trainer"] == "kfp_trainer.trainers.sft"
    assert params["max_steps"] == "120" and params["lora"] == "False"
    losses = mlflow_server.metric_history(info["run_id"], "loss")
    assert len({m["step"] for m in losses}) >= 2 and losses[-1]["value"] < losses[0]["value"]  # a point every 50 steps
    assert "report.html" in mlflow_server.artifacts(info["run_id"])
    # the approved model, registered past the gate: linked to that run, its files uploaded there, the alias on it
    assert outputs["register-model"]["parameterValues"]["Output"] == f"models:/{model_name}/1"
    version = mlflow_server.client().call("GET", "model-versions/get", query={"name": model_name, "version": "1"})["model_version"]
    version_tags = {t["key"]: t["value"] for t in version["tags"]}
    assert version["run_id"] == info["run_id"] and version["source"].endswith(f"/{info['run_id']}/artifacts/model")
    assert version_tags["kfp_trainer.trainjob"] == trained["trainjob"] and version_tags["kfp_trainer.dataset"] == "builtin://datasets/addition"
    assert float(version_tags["metric.loss"]) == artifact(outputs, "evaluate-model-2", "metrics")["metadata"]["loss"]
    assert alias_version(mlflow_server.client(), model_name, "champion") == "1"
    assert "model/model.safetensors" in mlflow_server.artifacts(info["run_id"], "model")
    # the MLflow UI's page of the run, in a real browser
    page = f"{mlflow_server.url}/#/experiments/{info['experiment_id']}/runs/{info['run_id']}?workflowType=machine_learning"
    for _ in range(3):  # on a loaded machine the app may still be fetching when Chromium dumps the page: load it again
        dom = browse_url(page, tmp_path, "--dump-dom")
        if dom.returncode == 0 and info["run_name"] in dom.stdout and info["run_id"] in dom.stdout:
            break
    assert dom.returncode == 0, dom.stderr[-2000:]
    shown = dom.stdout
    assert info["run_name"] in shown and info["run_id"] in shown, "the MLflow UI shows no run"
    assert "Finished" in shown and "max_steps" in shown and "kfp_trainer.trainjob" in shown
    shot = browse_url(page, tmp_path, f"--screenshot={tmp_path / 'mlflow-run.png'}")
    assert shot.returncode == 0 and (tmp_path / "mlflow-run.png").is_file(), shot.stderr[-2000:]
    width, height, pixels = png_pixels(tmp_path / "mlflow-run.png")
    assert (width, height) == (1400, 1300) and len(set(pixels[:: 97])) > 20, "a blank screenshot"
    if os.environ.get("KFP_TRAINER_UPDATE_DOCS") == "1":
        SCREENSHOT.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(tmp_path / "mlflow-run.png", SCREENSHOT)
