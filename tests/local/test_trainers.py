"""Tests of the training programs in kfp_trainer.trainers (local, CPU only)."""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from kfp_trainer.trainers import builtin
from tests.our_warnings import SHOW_ALL, ours

REPO_ROOT = Path(__file__).resolve().parents[2]


def _env() -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(REPO_ROOT), env.get("PYTHONPATH", "")) if p)
    env.setdefault("HF_HUB_OFFLINE", "1")
    return env


def _run(args: list[str], timeout: float = 240) -> subprocess.CompletedProcess[str]:
    done = subprocess.run(
        [sys.executable, *args],
        cwd=REPO_ROOT,
        env=_env() | {"PYTHONWARNINGS": SHOW_ALL},
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    assert ours(done.stdout + done.stderr) == [], "a warning of ours in the trainer's output"
    return done


def _torchrun(nproc: int, module: str, *args: str, timeout: float = 240) -> subprocess.CompletedProcess[str]:
    return _run(
        ["-m", "torch.distributed.run", "--standalone", "--nnodes", "1", "--nproc-per-node", str(nproc), "-m", module, *args],
        timeout=timeout,
    )


def _sft(model_dir: Path, dataset_dir: Path, output_dir: Path, *flags: str) -> subprocess.CompletedProcess[str]:
    """The SFT trainer in one process, on the tiny model."""
    dirs = ["--model-dir", str(model_dir), "--dataset-dir", str(dataset_dir), "--output-dir", str(output_dir)]
    return _run(["-m", "kfp_trainer.trainers.sft", *dirs, *flags])


def _json_lines(text: str) -> list[dict[str, Any]]:
    lines = []
    for line in text.splitlines():
        line = line.strip()
        if line.startswith("{"):
            lines.append(json.loads(line))
    return lines


@pytest.fixture(scope="session")
def dataset_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builtin.materialize("builtin://datasets/addition", tmp_path_factory.mktemp("addition"))


@pytest.fixture(scope="session")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return builtin.materialize("builtin://models/tiny-char-lm", tmp_path_factory.mktemp("tiny-char-lm"))


@pytest.fixture(scope="session")
def trained(tmp_path_factory: pytest.TempPathFactory, model_dir: Path, dataset_dir: Path) -> tuple[Path, str]:
    out = tmp_path_factory.mktemp("sft-out")
    proc = _torchrun(
        2,
        "kfp_trainer.trainers.sft",
        "--model-dir", str(model_dir),
        "--dataset-dir", str(dataset_dir),
        "--output-dir", str(out),
        "--max-steps", "60",
        "--logging-steps", "10",
        "--batch-size", "16",
        "--time-budget-seconds", "0",  # bound by steps alone: the same model on a busy machine
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return out, proc.stdout


def test_list_builtin() -> None:
    listing = builtin.list_builtin()
    assert "addition" in listing["datasets"]
    assert "tiny-char-lm" in listing["models"]


def test_addition_dataset(dataset_dir: Path) -> None:
    train = [json.loads(line) for line in (dataset_dir / "train.jsonl").read_text().splitlines()]
    test = [json.loads(line) for line in (dataset_dir / "test.jsonl").read_text().splitlines()]
    info = json.loads((dataset_dir / "dataset_info.json").read_text())
    assert info["name"] == "addition"
    assert info["splits"] == {"train": len(train), "test": len(test)}
    assert set(info["fields"]) == {"prompt", "completion"}
    assert len(train) >= 5000 and len(test) >= 200
    for record in train[:50] + test[:50]:
        a, b = record["prompt"].removesuffix("=").split("+")
        assert record["prompt"].endswith("=")
        assert record["completion"] == str(int(a) + int(b))
    assert not {r["prompt"] for r in train} & {r["prompt"] for r in test}


def test_addition_dataset_is_deterministic(tmp_path: Path, dataset_dir: Path) -> None:
    again = builtin.materialize("builtin://datasets/addition", tmp_path)
    for name in ("train.jsonl", "test.jsonl", "dataset_info.json"):
        assert (again / name).read_bytes() == (dataset_dir / name).read_bytes()


@pytest.mark.parametrize(
    "uri",
    ["builtin://datasets/nope", "builtin://models/nope", "builtin://things/addition", "s3://bucket/x", "builtin://datasets/"],
)
def test_unknown_builtin_lists_available(tmp_path: Path, uri: str) -> None:
    with pytest.raises(ValueError) as excinfo:
        builtin.materialize(uri, tmp_path / "x")
    message = str(excinfo.value)
    assert uri in message
    assert "builtin://datasets/addition" in message
    assert "builtin://models/tiny-char-lm" in message
    assert not (tmp_path / "x").exists()


def test_builtin_module_imports_no_torch() -> None:
    code = "import sys, kfp_trainer.trainers.builtin, kfp_trainer.trainers.sft; print('torch' in sys.modules)"
    proc = _run(["-c", code])
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "False"


def test_tiny_model_loads_offline(model_dir: Path) -> None:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        assert (model_dir / name).is_file(), name
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir)
    params = sum(p.numel() for p in model.parameters())
    assert 300_000 <= params <= 1_000_000
    assert model.config.model_type == "llama"

    ids = tokenizer("12+7=")["input_ids"]
    assert ids[0] == tokenizer.bos_token_id
    assert tokenizer.convert_ids_to_tokens(ids[1:]) == ["1", "2", "+", "7", "="]
    text = "Hello, World! {x: 3.14}"
    encoded = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.unk_token_id not in encoded
    assert tokenizer.decode(encoded) == text
    assert {tokenizer.pad_token, tokenizer.eos_token, tokenizer.bos_token, tokenizer.unk_token} == {
        "<pad>",
        "<eos>",
        "<bos>",
        "<unk>",
    }
    with torch.no_grad():
        logits = model(torch.tensor([ids])).logits
    assert logits.shape == (1, len(ids), len(tokenizer))


def test_tiny_model_is_deterministic(tmp_path: Path, model_dir: Path) -> None:
    again = builtin.materialize("builtin://models/tiny-char-lm", tmp_path)
    assert (again / "model.safetensors").read_bytes() == (model_dir / "model.safetensors").read_bytes()


def test_allreduce_two_processes() -> None:
    proc = _torchrun(2, "kfp_trainer.trainers.allreduce", timeout=120)
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = _json_lines(proc.stdout)
    assert sorted(line["rank"] for line in lines) == [0, 1]
    for line in lines:
        assert line["world_size"] == 2
        assert line["sum"] == 3
        assert line["node_rank"] == 0
        assert line["local_rank"] == line["rank"]


def test_sft_two_processes(trained: tuple[Path, str], model_dir: Path) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out, stdout = trained
    lines = _json_lines(stdout)
    metrics = [line for line in lines if "step" in line]
    summary = [line for line in lines if "train_loss" in line]
    assert [m["step"] for m in metrics] == [10, 20, 30, 40, 50, 60]
    for m in metrics:
        assert set(m) == {"step", "epoch", "loss", "learning_rate"}
        assert math.isfinite(m["loss"]) and m["learning_rate"] > 0
    assert metrics[-1]["loss"] < metrics[0]["loss"]
    assert metrics[-1]["epoch"] > metrics[0]["epoch"] > 0
    assert len(summary) == 1
    assert summary[0]["train_steps"] == 60
    assert summary[0]["world_size"] == 2
    assert summary[0]["train_runtime"] > 0

    info = json.loads((out / "training_info.json").read_text())
    assert info["base_model"] == str(model_dir)
    assert info["weights"] == "full"
    assert info["format"] == "safetensors"
    assert info["steps"] == 60
    assert info["world_size"] == 2
    assert (out / "model.safetensors").is_file()
    model = AutoModelForCausalLM.from_pretrained(out)
    AutoTokenizer.from_pretrained(out)
    base = AutoModelForCausalLM.from_pretrained(model_dir)
    changed = [
        name
        for (name, p), (_, q) in zip(model.named_parameters(), base.named_parameters(), strict=True)
        if not p.detach().equal(q.detach())
    ]
    assert changed


def test_evaluate(trained: tuple[Path, str], model_dir: Path, dataset_dir: Path) -> None:
    from kfp_trainer.trainers.evaluate import evaluate

    out, _ = trained
    base = evaluate(model_dir, dataset_dir, max_examples=64)
    tuned = evaluate(out, dataset_dir, max_examples=64, max_new_tokens=4)
    for result in (base, tuned):
        assert set(result) >= {"loss", "perplexity", "exact_match", "examples"}
        assert result["examples"] == 64
        assert 0.0 <= result["exact_match"] <= 1.0
        assert result["perplexity"] == pytest.approx(math.exp(result["loss"]), rel=1e-3)
    assert base["exact_match"] < 0.05
    assert base["loss"] > 3.0  # about log(vocabulary size) before training
    assert tuned["loss"] < base["loss"]


def test_evaluate_cli(trained: tuple[Path, str], dataset_dir: Path, tmp_path: Path) -> None:
    out, _ = trained
    result_file = tmp_path / "metrics.json"
    proc = _run(
        [
            "-m", "kfp_trainer.trainers.evaluate",
            "--model-dir", str(out),
            "--dataset-dir", str(dataset_dir),
            "--max-examples", "16",
            "--output", str(result_file),
        ]
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    (line,) = _json_lines(proc.stdout)
    assert line["examples"] == 16
    assert json.loads(result_file.read_text()) == line


def test_sft_on_a_fixed_seed_and_step_count_trains_the_same_model_every_time(model_dir: Path, dataset_dir: Path, tmp_path: Path) -> None:
    """The quality figures the tests check come from runs bound by steps: a busy machine must not move them."""
    runs = []
    for i in range(2):
        out = tmp_path / f"run-{i}"
        flags = ("--max-steps", "12", "--logging-steps", "4", "--batch-size", "8", "--time-budget-seconds", "0")
        proc = _sft(model_dir, dataset_dir, out, *flags)
        assert proc.returncode == 0, proc.stderr[-4000:]
        lines = _json_lines(proc.stdout)
        runs.append(([line["loss"] for line in lines[:-1]], lines[-1]["train_loss"], (out / "model.safetensors").read_bytes()))
    assert runs[0] == runs[1]
    assert len(runs[0][0]) == 3 and runs[0][0][-1] < runs[0][0][0]  # it learned, the same way twice


def test_sft_single_process_without_launcher_stops_on_time_budget(model_dir: Path, dataset_dir: Path, tmp_path: Path) -> None:
    proc = _sft(
        model_dir, dataset_dir, tmp_path,
        "--max-steps", "100000",
        "--time-budget-seconds", "2",
        "--logging-steps", "2",
        "--batch-size", "8",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = _json_lines(proc.stdout)
    summary = lines[-1]
    assert summary["world_size"] == 1
    assert summary["stopped_by"] == "time_budget"
    assert 0 < summary["train_steps"] < 100000
    assert 2 <= summary["train_runtime"] < 30
    assert [line["step"] for line in lines[:-1]] == list(range(2, summary["train_steps"] + 1, 2))
    info = json.loads((tmp_path / "training_info.json").read_text())
    assert info["world_size"] == 1 and info["steps"] == summary["train_steps"]


def test_sft_trains_on_through_several_epochs_to_max_steps(model_dir: Path, dataset_dir: Path, tmp_path: Path) -> None:
    small = tmp_path / "small"
    small.mkdir()
    rows = (dataset_dir / "train.jsonl").read_text().splitlines()[:40]  # 5 steps per epoch at batch size 8
    (small / "train.jsonl").write_text("\n".join(rows) + "\n")
    proc = _sft(
        model_dir, small, tmp_path / "out",
        "--max-steps", "12",
        "--logging-steps", "2",
        "--batch-size", "8",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    lines = _json_lines(proc.stdout)
    summary = lines[-1]
    assert (summary["train_steps"], summary["stopped_by"]) == (12, "max_steps")
    assert [line["step"] for line in lines[:-1]] == [2, 4, 6, 8, 10, 12]
    assert lines[-2]["epoch"] > 2


def test_lr_schedule() -> None:
    from kfp_trainer.trainers.sft import lr_at

    assert lr_at(0, 0.0, 1.0, 10, 0.1) == pytest.approx(0.1)
    assert lr_at(9, 0.0, 1.0, 10, 0.1) == pytest.approx(1.0)
    assert lr_at(50, 0.5, 1.0, 10, 0.1) == pytest.approx(0.55)
    assert lr_at(99, 1.0, 1.0, 10, 0.1) == pytest.approx(0.1)
    assert lr_at(99, 2.0, 1.0, 10, 0.1) == pytest.approx(0.1)


def test_sft_lora(model_dir: Path, dataset_dir: Path, tmp_path: Path) -> None:
    import peft  # noqa: F401  (installed by make setup: a missing one fails here)

    from kfp_trainer.trainers.evaluate import evaluate

    proc = _sft(
        model_dir, dataset_dir, tmp_path,
        "--max-steps", "4",
        "--logging-steps", "2",
        "--lora",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    info = json.loads((tmp_path / "training_info.json").read_text())
    assert info["weights"] == "adapter" and info["format"] == "safetensors"
    assert (tmp_path / "adapter_model.safetensors").is_file()
    result = evaluate(tmp_path, dataset_dir, max_examples=8, max_new_tokens=2)
    assert result["examples"] == 8


def test_sft_lora_without_peft_fails_clearly(model_dir: Path, dataset_dir: Path, tmp_path: Path) -> None:
    # peft is installed here; the trainer process gets a "peft" that fails to import the way a
    # missing package does (ModuleNotFoundError), first on its path.
    shadow = tmp_path / "no-peft"
    (shadow / "peft").mkdir(parents=True)
    (shadow / "peft" / "__init__.py").write_text("raise ModuleNotFoundError(\"No module named 'peft'\", name='peft')\n")
    dirs = ["--model-dir", str(model_dir), "--dataset-dir", str(dataset_dir), "--output-dir", str(tmp_path / "out")]
    env = _env()
    env["PYTHONPATH"] = os.pathsep.join(p for p in (str(shadow), env.get("PYTHONPATH", "")) if p)
    proc = subprocess.run(
        [sys.executable, "-m", "kfp_trainer.trainers.sft", *dirs, "--max-steps", "1", "--lora"],
        cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=240, check=False,
    )  # fmt: skip
    assert proc.returncode != 0
    assert "peft" in proc.stderr and "Traceback" not in proc.stderr, proc.stderr[-2000:]
    assert not (tmp_path / "out" / "adapter_model.safetensors").exists()


def test_sft_reports_its_progress_to_the_trainer_status_server_from_rank_zero_only(
    model_dir: Path, dataset_dir: Path, tmp_path: Path
) -> None:
    """With the variables the Trainer injects under TrainJobStatus, the trainer posts its progress (rank 0 only)."""
    import threading
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    posts: list[tuple[str, str, dict[str, Any]]] = []

    class StatusServer(BaseHTTPRequestHandler):
        def do_POST(self) -> None:  # noqa: N802 - the http.server API
            body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
            posts.append((self.path, self.headers.get("Authorization", ""), body))
            self.send_response(200)
            self.end_headers()
            self.wfile.write(b"{}")

        def log_message(self, *args: Any) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), StatusServer)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    (tmp_path / "token").write_text("projected-token\n")
    path = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/ns/trainjobs/job/status"
    os.environ.update({
        "KUBEFLOW_TRAINER_SERVER_URL": f"http://127.0.0.1:{server.server_address[1]}{path}",
        "KUBEFLOW_TRAINER_SERVER_TOKEN": str(tmp_path / "token"),
    })  # fmt: skip
    try:
        proc = _torchrun(
            2, "kfp_trainer.trainers.sft", "--model-dir", str(model_dir), "--dataset-dir", str(dataset_dir),
            "--output-dir", str(tmp_path / "out"), "--max-steps", "12", "--logging-steps", "3", "--batch-size", "8",
        )  # fmt: skip
    finally:
        for name in ("KUBEFLOW_TRAINER_SERVER_URL", "KUBEFLOW_TRAINER_SERVER_TOKEN"):
            os.environ.pop(name, None)
        server.shutdown()
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert {(p, auth) for p, auth, _ in posts} == {(path, "Bearer projected-token")}
    statuses = [body["trainerStatus"] for _, _, body in posts]
    assert statuses[0]["progressPercentage"] == 25 and {m["name"] for m in statuses[0]["metrics"]} == {"loss", "learning_rate"}
    assert [s["progressPercentage"] for s in statuses].count(100) == 1  # one final report: rank 1 sent nothing
    final = statuses[-1]
    assert final["progressPercentage"] == 100 and final["estimatedRemainingSeconds"] == 0
    summary = _json_lines(proc.stdout)[-1]
    assert {m["name"]: m["value"] for m in final["metrics"]}["train_steps"] == str(summary["train_steps"]) == "12"
