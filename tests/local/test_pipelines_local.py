"""Every sample pipeline end to end under ``kfp-trainer run <dir> --local``, as a user runs it.

Real ``kfp.local`` subprocesses, real torch training on CPU (small settings: seconds per
TrainJob), and what a user looks at afterwards: the approved model only when the gate
passes, metrics and a confusion matrix in the shape the KFP UI draws, the sweep's best
really the best, and the HTML report drawn by a real headless browser.
"""

from __future__ import annotations

import json
import math
import os
import shutil
import struct
import subprocess
import sys
import zlib
from pathlib import Path

import pytest

from kfp_trainer.cli import task_outputs
from tests.our_warnings import SHOW_ALL, ours

REPO = Path(__file__).resolve().parents[2]
CLI = Path(sys.executable).with_name("kfp-trainer")
IN_CI = os.environ.get("CI", "").lower() in ("1", "true", "yes")
PLOT_BLUE = (0x1A, 0x73, 0xE8)  # the report's curve colour


def run_pipeline(name: str, out: Path, **params: object) -> dict[str, dict]:
    """``kfp-trainer run pipelines/<name> --local`` with ``params``; the executor output of each task."""
    args = [str(CLI), "run", str(REPO / "pipelines" / name), "--local", "--output", str(out)]
    for key, value in params.items():
        args += ["--param", f"{key}={json.dumps(value) if isinstance(value, (list, dict)) else value}"]
    env = {k: v for k, v in os.environ.items() if not k.startswith("KFP_TRAINER_")} | {"PYTHONWARNINGS": SHOW_ALL}
    done = subprocess.run(args, capture_output=True, text=True, env=env, timeout=900)
    assert done.returncode == 0, done.stdout[-4000:] + done.stderr[-4000:]
    assert ours(done.stdout + done.stderr) == [], "a warning of ours in the run's output"  # the steps' and trainers' too
    return dict(task_outputs(out / "artifacts"))


def artifact(outputs: dict[str, dict], task: str, name: str) -> dict:
    return outputs[task]["artifacts"][name]["artifacts"][0]


def metric_values(outputs: dict[str, dict], task: str, name: str = "metrics") -> dict[str, float]:
    return artifact(outputs, task, name)["metadata"]


# --------------------------------------------------------------------------- a real browser


def chromium() -> str | None:
    return shutil.which("chromium") or shutil.which("chromium-browser")


def browse(page: Path | str, tmp: Path, *mode: str, window: str = "1000,1400", timeout: float = 120) -> subprocess.CompletedProcess:
    """Open ``page`` (a file, or a URL) in headless Chromium (fresh profile, no network services) with ``mode`` flags."""
    browser = chromium()
    if browser is None:
        if IN_CI:
            pytest.fail("chromium is not installed: run `make browser` (apt-get install chromium)")
        pytest.skip("chromium is not installed (make browser)")
    profile = tmp / f"chromium-profile-{len(list(tmp.glob('chromium-profile-*')))}"
    args = [
        browser, "--headless", "--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking",
        "--disable-component-update", "--disable-sync", f"--user-data-dir={profile}", f"--window-size={window}",
        *mode, page if isinstance(page, str) else page.resolve().as_uri(),
    ]
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, cwd=tmp)


def png_pixels(path: Path) -> tuple[int, int, list[tuple[int, int, int]]]:
    """Width, height and RGB pixels of a non-interlaced 8-bit RGB/RGBA PNG (what Chromium writes)."""
    data = path.read_bytes()
    assert data[:8] == b"\x89PNG\r\n\x1a\n", "not a PNG"
    pos, idat, header = 8, b"", None
    while pos < len(data):
        (length,) = struct.unpack(">I", data[pos : pos + 4])
        kind, body = data[pos + 4 : pos + 8], data[pos + 8 : pos + 8 + length]
        if kind == b"IHDR":
            header = struct.unpack(">IIBBBBB", body)
        elif kind == b"IDAT":
            idat += body
        pos += 12 + length
    width, height, depth, color, _, _, interlace = header
    assert depth == 8 and color in (2, 6) and interlace == 0, header
    channels = 3 if color == 2 else 4
    raw, stride, rows, prev = zlib.decompress(idat), width * channels, [], bytearray(width * channels)
    for y in range(height):
        kind, line = raw[y * (stride + 1)], bytearray(raw[y * (stride + 1) + 1 : (y + 1) * (stride + 1)])
        for i in range(stride):
            left = line[i - channels] if i >= channels else 0
            up, corner = prev[i], prev[i - channels] if i >= channels else 0
            if kind == 1:
                line[i] = (line[i] + left) & 255
            elif kind == 2:
                line[i] = (line[i] + up) & 255
            elif kind == 3:
                line[i] = (line[i] + (left + up) // 2) & 255
            elif kind == 4:
                p = left + up - corner
                pa, pb, pc = abs(p - left), abs(p - up), abs(p - corner)
                line[i] = (line[i] + (left if pa <= pb and pa <= pc else up if pb <= pc else corner)) & 255
        rows.append(line)
        prev = line
    pixels = [tuple(row[x * channels : x * channels + 3]) for row in rows for x in range(width)]
    return width, height, pixels


def assert_report_renders_with_its_plot(report: Path, tmp: Path) -> None:
    """The report's DOM in Chromium has the plot, and the plot is painted when shown as the KFP UI shows it.

    The KFP UI puts an HTML artifact into ``<iframe sandbox="allow-scripts" srcdoc=...>``:
    the screenshot is taken of such a frame.
    """
    text = report.read_text()
    assert "http://" not in text.replace('xmlns="http://www.w3.org/2000/svg"', "") and "https://" not in text, "self-contained"
    page = tmp / "report.html"  # the artifact file has no extension; a browser needs one to parse it as HTML
    page.write_text(text)
    dom = browse(page, tmp, "--dump-dom")
    assert dom.returncode == 0, dom.stderr[-2000:]
    assert "<svg" in dom.stdout and "<polyline" in dom.stdout, "the browser's DOM has no plot"
    points = dom.stdout.split("<polyline", 1)[1].split('points="', 1)[1].split('"', 1)[0].split()
    assert len(points) >= 2, points
    import html

    frame = tmp / "kfp-ui.html"
    frame.write_text(
        '<html><body style="margin:0"><iframe sandbox="allow-scripts" width="1000" height="1400" style="border:0" '
        f'srcdoc="{html.escape(text, quote=True)}"></iframe></body></html>'
    )
    # The frame loads its srcdoc after the page; on a loaded machine headless Chromium now and
    # then takes the shot before anything is painted (an all-white image): such a shot is taken again.
    for attempt in range(3):
        shot = browse(frame, tmp, "--virtual-time-budget=10000", f"--screenshot={tmp / f'report-{attempt}.png'}")
        assert shot.returncode == 0 and (tmp / f"report-{attempt}.png").is_file(), shot.stderr[-2000:]
        width, height, pixels = png_pixels(tmp / f"report-{attempt}.png")
        if any(p != (255, 255, 255) for p in pixels):
            break
    blue = sum(1 for p in pixels if all(abs(a - b) <= 40 for a, b in zip(p, PLOT_BLUE, strict=True)))
    assert blue >= 50, f"the curve was not painted ({blue} plot-coloured pixels in {width}x{height})"


# --------------------------------------------------------------------------- the pipelines


@pytest.mark.slow
def test_pytorch_distributed_trains_on_two_nodes_and_shows_metrics_a_confusion_matrix_and_a_report(tmp_path):
    outputs = run_pipeline("pytorch_distributed", tmp_path / "run", num_nodes=2, epochs=6)
    model = Path(artifact(outputs, "train-job", "output_model")["uri"])
    info = json.loads((model / "training_info.json").read_text())
    assert info["world_size"] == 2 and (model / "model.safetensors").is_file()
    values = metric_values(outputs, "evaluate-classifier")
    assert values["accuracy"] > 0.8 and values["examples"] == 450  # 10 classes: chance is 0.1
    assert all(isinstance(v, (int, float)) and math.isfinite(v) for v in values.values())
    matrix = artifact(outputs, "evaluate-classifier", "confusion_matrix")["metadata"]["confusionMatrix"]
    assert [a["displayName"] for a in matrix["annotationSpecs"]] == [str(d) for d in range(10)]
    rows = [r["row"] for r in matrix["rows"]]
    assert len(rows) == 10 and all(len(r) == 10 for r in rows)
    assert all(math.isfinite(v) and v >= 0 and float(v).is_integer() for r in rows for v in r)
    assert sum(map(sum, rows)) == 450 and sum(rows[i][i] for i in range(10)) / 450 == pytest.approx(values["accuracy"], abs=1e-5)
    assert_report_renders_with_its_plot(Path(artifact(outputs, "train-job", "report")["uri"]), tmp_path)


@pytest.mark.slow
def test_hparam_sweep_gives_identical_points_their_own_trainjobs_and_picks_the_true_best(tmp_path):
    grid = ["learning_rate=0.02,hidden=8", "learning_rate=0.2,hidden=32", "learning_rate=0.2,hidden=32"]
    outputs = run_pipeline("hparam_sweep", tmp_path / "run", grid=grid, epochs=2)
    iterations = sorted(t for t in outputs if t.endswith("/train-job"))
    assert len(iterations) == 3
    names = [artifact(outputs, t, "output_model")["metadata"]["trainjob"] for t in iterations]
    assert len(set(names)) == 3, names  # the two identical points did not share (adopt) one TrainJob
    scores = {t: metric_values(outputs, t)["val_accuracy"] for t in iterations}
    best = metric_values(outputs, "select-best", "best_metrics")
    assert best["val_accuracy"] == max(scores.values())
    winners = [t for t in iterations if scores[t] == max(scores.values())]
    chosen = (Path(artifact(outputs, "select-best", "best_model")["uri"]) / "model.safetensors").read_bytes()
    assert chosen in {(Path(artifact(outputs, t, "output_model")["uri"]) / "model.safetensors").read_bytes() for t in winners}
    table = Path(artifact(outputs, "select-best", "comparison")["uri"]).read_text()
    assert table.count("| local/") == 3 and "(best)" in table and all(n.split("/")[1] in table for n in names)
    assert metric_values(outputs, "evaluate-classifier")["accuracy"] > 0.5


@pytest.mark.slow
def test_llm_finetune_gate_passes_after_real_training_and_hands_on_the_approved_model(tmp_path):
    outputs = run_pipeline(
        "llm_finetune", tmp_path / "run", num_nodes=2, max_steps=120, time_budget_seconds=0, eval_examples=100,
        gate_metric="loss", min_improvement=0.5,
    )
    base, tuned = metric_values(outputs, "evaluate-model"), metric_values(outputs, "evaluate-model-2")
    assert tuned["loss"] < base["loss"] - 0.5 and outputs["evaluate-model-2"]["parameterValues"]["Output"] is True
    trained = Path(artifact(outputs, "train-job", "output_model")["uri"])
    assert json.loads((trained / "training_info.json").read_text())["world_size"] == 2
    approved = artifact(outputs, "promote-model", "approved_model")
    assert approved["metadata"]["approved"] is True and approved["metadata"]["eval_loss"] == tuned["loss"]
    assert (Path(approved["uri"]) / "model.safetensors").read_bytes() == (trained / "model.safetensors").read_bytes()
    assert "loss" in Path(artifact(outputs, "promote-model", "card")["uri"]).read_text()
    assert_report_renders_with_its_plot(Path(artifact(outputs, "train-job", "report")["uri"]), tmp_path)


@pytest.mark.slow
def test_llm_finetune_gate_that_fails_leaves_no_approved_model(tmp_path):
    outputs = run_pipeline(
        "llm_finetune", tmp_path / "run", max_steps=2, time_budget_seconds=0, eval_examples=40,
        gate_metric="exact_match", min_improvement=0.5,
    )
    assert outputs["evaluate-model-2"]["parameterValues"]["Output"] is False
    assert "train-job" in outputs and "promote-model" not in outputs
    assert not list((tmp_path / "run" / "artifacts").glob("*/promote-model"))


@pytest.mark.slow
def test_llm_finetune_torchtune_runs_the_runtimes_own_tune_command_and_the_held_out_loss_falls(tmp_path):
    pytest.importorskip("torchtune", reason="the [llm] extra (torchtune) is not installed")
    outputs = run_pipeline("llm_finetune_torchtune", tmp_path / "run", eval_examples=24)
    base, tuned = metric_values(outputs, "evaluate-model"), metric_values(outputs, "evaluate-model-2")
    assert tuned["loss"] < base["loss"] - 0.5 and outputs["evaluate-model-2"]["parameterValues"]["Output"] is True
    model = artifact(outputs, "torchtune-finetune", "output_model")
    meta = model["metadata"]
    assert (meta["recipe"], meta["config"], meta["weights"], meta["format"]) == (
        "full_finetune_distributed", "qwen2_5/1.5B_full", "full", "safetensors",
    )
    assert meta["base_model"] == "builtin://models/tiny-qwen2.5" and meta["runtime"] == "ClusterTrainingRuntime/torchtune-qwen2.5-1.5b"
    files = {p.name for p in Path(model["uri"]).iterdir()}
    assert {"model-00001-of-00001.safetensors", "config.json", "vocab.json", "merges.txt", "torchtune_config.yaml"} <= files
    # The TrainJob the local backend ran: the SDK's BuiltinTrainer shape, the runtime's own initializers.
    [job_file] = (tmp_path / "run" / "trainjobs").glob("*/*/trainjob.json")
    job = json.loads(job_file.read_text())
    assert job["metadata"]["name"] == meta["trainjob"].split("/")[1]
    spec = job["spec"]
    assert spec["trainer"]["command"] == ["tune", "run"]
    assert spec["trainer"]["args"] == [
        "batch_size=4", "epochs=1", "dataset.data_dir=/workspace/dataset/data", "dataset=torchtune.datasets.instruct_dataset",
        "dataset.source=parquet", "optimizer.lr=0.003", "seed=7",
    ]
    assert spec["initializer"]["dataset"]["storageUri"] == "builtin://datasets/instruct-sums"
    assert spec["initializer"]["model"]["storageUri"] == "builtin://models/tiny-qwen2.5"
    command = (job_file.parent / "logs" / "node-0.command").read_text()  # what the local node ran
    assert "run --rdzv_endpoint=127.0.0.1:" in command and "full_finetune_distributed --config qwen2_5/1.5B_full" in command
    assert "mounted /workspace/output -> " + model["uri"] + ".torchtune-output" in (job_file.parent / "logs" / "node-0.log").read_text()
    logged = set(metric_values(outputs, "torchtune-finetune"))  # torchtune's per-step log (no settings) and where the time went
    times = {"queued_seconds", "starting_seconds", "running_seconds"}
    allowed = {"loss", "best_loss", "learning_rate", "tokens_per_second_per_gpu"} | times
    assert {"loss", "learning_rate"} | times <= logged <= allowed, logged
    assert metric_values(outputs, "torchtune-finetune")["loss"] < base["loss"]  # the loss torchtune logged, per step
    assert_report_renders_with_its_plot(Path(artifact(outputs, "torchtune-finetune", "report")["uri"]), tmp_path)


@pytest.mark.slow
def test_llm_grpo_with_its_defaults_beats_the_sft_model_it_starts_from_with_its_own_reward_shipped(tmp_path):
    """The sample as a user runs it (its defaults, ~4 minutes on 2 cores): GRPO beats the SFT model by the gate's margin.

    Seeded and on CPU, so the figures are the same on a loaded machine, only slower: ``bench/grpo_gain.md`` has
    them for three seeds (gains +0.112 to +0.150); the margin asked here is the sample's own gate, five points.
    """
    outputs = run_pipeline("llm_grpo", tmp_path / "run")
    sft, grpo_eval = metric_values(outputs, "evaluate-model"), metric_values(outputs, "evaluate-model-2")
    assert sft["examples"] == grpo_eval["examples"] == 500
    assert grpo_eval["exact_match"] >= sft["exact_match"] + 0.05, (sft, grpo_eval)
    assert outputs["evaluate-model-2"]["parameterValues"]["Output"] is True and "promote-model" in outputs  # the gate passed
    grpo = metric_values(outputs, "trl-finetune-2")
    assert {"rewards/exact_sum/mean", "rewards/exact_sum/std", "reward", "completions/mean_length"} <= set(grpo), grpo
    meta = artifact(outputs, "trl-finetune-2", "output_model")["metadata"]
    assert (meta["method"], meta["runtime"]) == ("grpo", "ClusterTrainingRuntime/kfp-trainer-trl")
    assert json.loads(meta["trl_settings"])["rewards"] == [{"kind": "function", "name": "exact_sum", "weight": 1.0}]
    trained = Path(artifact(outputs, "trl-finetune-2", "output_model")["uri"])
    samples = [json.loads(line) for line in (trained / "completions.jsonl").read_text().splitlines()]
    assert samples and all(set(s["rewards"]) == {"exact_sum"} for s in samples)
    sums = [sum(int(n) for n in s["prompt"].rstrip("=").split("+")) for s in samples]
    expected = [float(s["completion"].strip() == str(t)) for s, t in zip(samples, sums, strict=True)]
    assert [s["rewards"]["exact_sum"] for s in samples] == expected  # the shipped function's values
    report = Path(artifact(outputs, "trl-finetune-2", "report")["uri"]).read_text()
    assert "Sampled completions" in report and "<th>exact_sum</th>" in report
    card = Path(artifact(outputs, "promote-model", "card")["uri"]).read_text()
    assert f"| exact_match | {sft['exact_match']} | {grpo_eval['exact_match']} |" in card


@pytest.mark.slow
def test_llm_preference_runs_sft_then_dpo_with_trl_and_promotes_the_model_that_wins_more_held_out_pairs(tmp_path):
    outputs = run_pipeline("llm_preference", tmp_path / "run")
    sft, dpo = metric_values(outputs, "evaluate-preferences"), metric_values(outputs, "evaluate-preferences-2")
    assert dpo["win_rate"] >= sft["win_rate"] and outputs["evaluate-preferences-2"]["parameterValues"]["Output"] is True
    assert dpo["reward_margin"] > 0 and dpo["pairs"] == sft["pairs"] == 200 and 0 <= dpo["exact_match"] <= 1
    trained = {}
    for task, method in (("trl-finetune", "sft"), ("trl-finetune-2", "dpo")):
        meta = artifact(outputs, task, "output_model")["metadata"]
        assert (meta["method"], meta["trainer"], meta["runtime"]) == (method, "trl", "ClusterTrainingRuntime/kfp-trainer-trl")
        trained[method] = Path(artifact(outputs, task, "output_model")["uri"])
    assert artifact(outputs, "trl-finetune-2", "output_model")["metadata"]["merged_model"] is True
    assert (trained["dpo"] / "adapter" / "adapter_config.json").is_file() and (trained["dpo"] / "model.safetensors").is_file()
    assert "rewards/margins" in metric_values(outputs, "trl-finetune-2")
    # The TrainJobs the local backend ran: only the TRL arguments, the runtime's own torchrun command.
    jobs = {json.loads(p.read_text())["spec"]["trainer"]["args"][0]: p for p in (tmp_path / "run" / "trainjobs").glob("*/*/trainjob.json")}
    assert set(jobs) == {"sft", "dpo"}
    dpo_job = json.loads(jobs["dpo"].read_text())["spec"]
    assert dpo_job["runtimeRef"]["name"] == "kfp-trainer-trl" and "command" not in dpo_job["trainer"]
    assert dpo_job["trainer"]["args"][:4] == ["dpo", "--learning_rate", "0.002", "--per_device_train_batch_size"]
    assert "trl_train: dpo: 9500 records" in (jobs["dpo"].parent / "logs" / "node-0.log").read_text()  # the runtime's trainer ran
    approved = artifact(outputs, "promote-model", "approved_model")
    assert approved["metadata"]["approved"] is True and approved["metadata"]["eval_win_rate"] == dpo["win_rate"]
    card = Path(artifact(outputs, "promote-model", "card")["uri"]).read_text()
    assert "| win_rate | " in card and "SFT model | DPO model" in card
    assert_report_renders_with_its_plot(Path(artifact(outputs, "trl-finetune", "report")["uri"]), tmp_path)
