"""The SFT trainer and evaluate_model on datasets as users bring them (local, CPU, the tiny builtin model).

An Alpaca-shaped parquet dataset laid out as a Hugging Face Hub snapshot (what
``dataset_initializer("hf://tatsu-lab/alpaca")`` stores: ``data/train-00000-of-00001-*.parquet``,
no test split) and a chat ``messages`` JSONL dataset.
"""

import json
import math
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from kfp import dsl, local

from kfp_trainer.data.splits import holdout
from kfp_trainer.trainers import builtin

REPO_ROOT = Path(__file__).resolve().parents[2]
ROWS = 64


def _sft(model_dir: Path, dataset_dir: Path, output_dir: Path) -> subprocess.CompletedProcess[str]:
    env = dict(os.environ, HF_HUB_OFFLINE="1")
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    args = ["--model-dir", str(model_dir), "--dataset-dir", str(dataset_dir), "--output-dir", str(output_dir),
            "--max-steps", "3", "--batch-size", "4", "--logging-steps", "1", "--max-length", "320"]  # fmt: skip
    return subprocess.run(
        [sys.executable, "-m", "kfp_trainer.trainers.sft", *args],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip


def _summary(proc: subprocess.CompletedProcess[str]) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr[-4000:]
    return [json.loads(line) for line in proc.stdout.splitlines() if line.startswith("{")][-1]


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builtin.materialize("builtin://models/tiny-char-lm", tmp_path_factory.mktemp("tiny-char-lm"))


def alpaca_rows() -> list[dict[str, str]]:
    return [
        {"instruction": f"Add {i} and {i + 3}.", "input": "" if i % 2 else "Use digits.", "output": str(2 * i + 3), "text": "unused"}
        for i in range(ROWS)
    ]


@pytest.fixture(scope="module")
def alpaca_snapshot(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("alpaca")
    (root / "data").mkdir()
    pq.write_table(pa.Table.from_pylist(alpaca_rows()), root / "data" / "train-00000-of-00001-a09b74b3ef9c3b56.parquet")
    (root / "README.md").write_text("---\nlicense: cc-by-nc-4.0\n---\n")
    (root / ".gitattributes").write_text("*.parquet filter=lfs diff=lfs merge=lfs -text\n")
    (root / ".cache" / "huggingface").mkdir(parents=True)
    (root / ".cache" / "huggingface" / ".gitignore").write_text("*\n")
    return root


@pytest.fixture(scope="module")
def chat_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("chat")
    for split, numbers in (("train", range(40)), ("test", range(40, 46))):
        with open(root / f"{split}.jsonl", "w") as f:
            for i in numbers:
                turns = [{"role": "system", "content": "Answer with a number."}, {"role": "user", "content": f"{i}+1?"},
                         {"role": "assistant", "content": str(i + 1)}]  # fmt: skip
                f.write(json.dumps({"messages": turns}) + "\n")
    return root


def test_sft_trains_on_an_alpaca_hub_snapshot_without_the_held_out_slice(model_dir: Path, alpaca_snapshot: Path, tmp_path: Path) -> None:
    from kfp_trainer.trainers.evaluate import evaluate

    proc = _sft(model_dir, alpaca_snapshot, tmp_path)
    summary = _summary(proc)
    held = len(holdout(alpaca_rows()))
    assert (summary["train_steps"], held) == (3, 3)
    assert f"examples: {ROWS - held}," in proc.stderr and "holding out a slice of train" in proc.stderr
    info = json.loads((tmp_path / "training_info.json").read_text())
    assert info["steps"] == 3 and math.isfinite(info["train_loss"])

    predictions: list[dict[str, str]] = []
    result = evaluate(tmp_path, alpaca_snapshot, split="test", max_new_tokens=2, predictions=predictions)
    assert result["examples"] == held and math.isfinite(result["loss"])
    held_rows = [alpaca_rows()[i] for i in sorted(holdout(alpaca_rows()))]
    assert [p["completion"] for p in predictions] == [r["output"] for r in held_rows]
    assert all(p["prompt"].startswith("Below is an instruction") and p["prompt"].endswith("### Response:\n") for p in predictions)


def test_sft_trains_on_chat_messages_and_evaluate_reads_them(model_dir: Path, chat_dataset: Path, tmp_path: Path) -> None:
    from kfp_trainer.trainers.evaluate import evaluate

    proc = _sft(model_dir, chat_dataset, tmp_path)
    assert _summary(proc)["train_steps"] == 3
    assert "examples: 40," in proc.stderr and "(chat)" in proc.stderr
    predictions: list[dict[str, str]] = []
    result = evaluate(tmp_path, chat_dataset, split="test", max_new_tokens=2, predictions=predictions)
    assert result["examples"] == 6 and math.isfinite(result["loss"])
    assert predictions[0]["prompt"] == "<|system|>\nAnswer with a number.\n<|user|>\n40+1?\n<|assistant|>\n"
    assert [p["completion"] for p in predictions] == [str(i + 1) for i in range(40, 46)]


def test_evaluate_model_under_kfp_local_reads_the_hub_snapshot(model_dir: Path, alpaca_snapshot: Path, tmp_path: Path) -> None:
    from kfp_trainer.components import dataset_initializer, evaluate_model, model_initializer

    root = tmp_path / "root"
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(root),
        workspace_root=tempfile.mkdtemp(prefix="ws-", dir=tmp_path),
    )

    @dsl.pipeline(name="evaluate-hub-snapshot")
    def evaluate_snapshot(dataset_uri: str, model_uri: str):
        data = dataset_initializer(uri=dataset_uri)
        model = model_initializer(uri=model_uri)
        evaluate_model(model=model.outputs["model"], dataset=data.outputs["dataset"], split="test")

    evaluate_snapshot(dataset_uri=str(alpaca_snapshot), model_uri=str(model_dir))
    (data_out,) = root.glob("*/dataset-initializer/executor_output.json")
    assert json.loads(data_out.read_text())["artifacts"]["dataset"]["artifacts"][0]["metadata"]["splits"] == "train"
    (eval_out,) = root.glob("*/evaluate-model/executor_output.json")
    outputs = json.loads(eval_out.read_text())
    metrics = outputs["artifacts"]["metrics"]["artifacts"][0]["metadata"]
    assert metrics["examples"] == len(holdout(alpaca_rows())) and math.isfinite(metrics["loss"])
    assert outputs["parameterValues"]["Output"] is True


def test_real_save_to_disk_folders_are_read_without_the_datasets_package_at_read_time(tmp_path: Path) -> None:
    import datasets

    from kfp_trainer.data import load_split

    rows = alpaca_rows()
    whole = datasets.Dataset.from_list(rows)
    datasets.DatasetDict({"train": whole.select(range(60)), "test": whole.select(range(60, ROWS))}).save_to_disk(str(tmp_path / "dict"))
    whole.save_to_disk(str(tmp_path / "lone"))
    test = load_split(tmp_path / "dict", "test", log=print)
    assert [e["completion"] for e in test] == [r["output"] for r in rows[60:]]
    assert len(load_split(tmp_path / "dict", "train", log=print)) == 60
    assert len(load_split(tmp_path / "lone", "train", log=print)) == ROWS - len(holdout(rows))
