"""The components under ``kfp.local`` (SubprocessRunner, this venv): real training on CPU, real artifacts.

``kfp.local`` deletes its ``workspace_root`` when a run ends and needs it to exist, so each
test makes a fresh one.
"""

import json
import os
import tempfile
from pathlib import Path

import pytest
from kfp import dsl, local

from kfp_trainer.components import dataset_initializer, trainjob_component


@pytest.fixture
def kfp_local(tmp_path, monkeypatch):
    monkeypatch.setenv("KFP_TRAINER_BACKEND", "local")
    monkeypatch.setenv("KFP_TRAINER_LOCAL_ROOT", str(tmp_path / "trainjobs"))
    root = tmp_path / "pipeline-root"
    local.init(
        runner=local.SubprocessRunner(use_venv=False),
        pipeline_root=str(root),
        workspace_root=tempfile.mkdtemp(prefix="ws-", dir=tmp_path),
    )
    return root


def only(root: Path, pattern: str) -> Path:
    found = sorted(root.glob(pattern))
    assert len(found) == 1, (pattern, found)
    return found[0]


@pytest.mark.slow
def test_trainjob_component_runs_a_python_function_on_two_local_nodes(kfp_local):
    @trainjob_component(num_nodes=2, num_proc_per_node=1)
    def fit(output_dir: str, epochs: int = 2):
        """Writes one file per rank and prints a loss per epoch."""
        import json
        import os

        rank = int(os.environ.get("RANK", "0"))
        for epoch in range(epochs):
            if rank == 0:
                print(json.dumps({"epoch": epoch, "loss": 1.0 / (epoch + 1)}), flush=True)
        os.makedirs(output_dir, exist_ok=True)
        with open(os.path.join(output_dir, f"rank-{rank}.txt"), "w") as f:
            f.write(os.environ.get("WORLD_SIZE", "?"))

    @dsl.pipeline(name="fn-local")
    def fn_local():
        fit(epochs=3)

    fn_local()
    out = only(kfp_local, "*/fit/output_model")
    assert sorted(p.name for p in out.iterdir()) == ["rank-0.txt", "rank-1.txt"]
    assert (out / "rank-1.txt").read_text() == "2"
    metrics = json.loads(only(kfp_local, "*/fit/executor_output.json").read_text())["artifacts"]["metrics"]["artifacts"][0]
    assert metrics["metadata"]["loss"] == pytest.approx(1 / 3)


def test_dataset_initializer_under_kfp_local_and_a_clear_offline_failure(kfp_local, monkeypatch):
    task = dataset_initializer(uri="builtin://datasets/addition")
    data = Path(task.outputs["dataset"].path)
    assert (data / "train.jsonl").is_file() and task.outputs["dataset"].metadata["splits"] == "test,train"
    monkeypatch.setenv("HF_ENDPOINT", "http://127.0.0.1:9")
    with pytest.raises(RuntimeError):
        dataset_initializer(uri="hf://org/some-dataset")
    assert os.environ["KFP_TRAINER_BACKEND"] == "local"
