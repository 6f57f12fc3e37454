"""How the local backend runs a torchtune TrainJob's node and honours a host folder mounted under /workspace."""

from __future__ import annotations

import os
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
import yaml

from kfp_trainer.backends import local_torchtune
from kfp_trainer.backends.local_runtime import BUILTIN_RUNTIMES, link_mounts
from kfp_trainer.errors import InvalidSpecErrors
from kfp_trainer.llm import render, tiny_models
from kfp_trainer.llm.inputs import TorchTuneSettings
from kfp_trainer.spec import TrainJobInputs
from kfp_trainer.spec import render as render_manifest
from kfp_trainer.steps.function import FunctionTrainer, missing_packages

SHARED = Path(os.environ.get("KFP_TRAINER_CRDS_DIR", Path(__file__).resolve().parents[3] / "shared" / "kubeflow-trainer-v2.3.0"))


@pytest.mark.parametrize(("name", "file"), [("torchtune-qwen2.5-1.5b", "qwen2_5_1.5B.yaml"), ("torchtune-llama3.2-1b", "llama3_2_1B.yaml"),
                                            ("torchtune-llama3.2-3b", "llama3_2_3B.yaml")])
def test_the_builtin_torchtune_runtimes_say_what_the_trainers_do(name, file):
    ours, theirs = BUILTIN_RUNTIMES[name], yaml.safe_load((SHARED / "runtimes" / file).read_text())
    assert ours["metadata"] == {"name": theirs["metadata"]["name"], "labels": theirs["metadata"]["labels"]}
    assert ours["spec"]["mlPolicy"] == theirs["spec"]["mlPolicy"]

    def node(rt):
        job = next(j for j in rt["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")
        c = job["template"]["spec"]["template"]["spec"]["containers"][0]
        return c["command"], c["resources"], job["dependsOn"]

    assert node(ours) == node(theirs)
    names = [j["name"] for j in ours["spec"]["template"]["spec"]["replicatedJobs"]]
    assert names == [j["name"] for j in theirs["spec"]["template"]["spec"]["replicatedJobs"]]


def test_a_node_of_a_torchtune_trainjob_runs_the_completed_tune_command_with_the_tiny_models_size(tmp_path):
    rt = BUILTIN_RUNTIMES["torchtune-qwen2.5-1.5b"]
    trainer = render.render_builtin(rt, TorchTuneSettings(epochs=2)).sdk_spec()["trainer"]
    (tmp_path / "model").mkdir()
    (tmp_path / "model" / tiny_models.MARKER_FILE).write_text('{"model_key": "qwen2_5/1.5B"}')
    manifest = {"metadata": {"name": "j"}, "spec": {"trainer": trainer}}
    argv, env = local_torchtune.node_command(manifest, rt, tmp_path, node=0, master_port=29123)
    assert argv[:3] == [sys.executable, "-m", "torchtune._cli.tune"]
    assert argv[4:9] == ["--rdzv_endpoint=127.0.0.1:29123", "full_finetune_distributed", "--config", "qwen2_5/1.5B_full",
                         f"output_dir={tmp_path}/output"]  # fmt: skip
    assert "epochs=2" in argv and "device=cpu" in argv and "model._component_=torchtune.models.qwen2.qwen2" in argv
    assert (env["PET_NPROC_PER_NODE"], env["PET_NODE_RANK"], env["HF_HUB_OFFLINE"]) == ("2", "0", "1")


def test_a_host_folder_mounted_under_workspace_becomes_a_link_in_the_jobs_workspace(tmp_path):
    inputs = TrainJobInputs(
        runtime="torchtune-qwen2.5-1.5b", run_id="r", task_name="t",
        volumes=[{"name": "out", "hostPath": {"path": str(tmp_path / "durable")}}, {"name": "data", "emptyDir": {}}],
        volume_mounts=[{"name": "out", "mountPath": "/workspace/output"}, {"name": "data", "mountPath": "/workspace/data"},
                       {"name": "out", "mountPath": "/elsewhere"}],
    )  # fmt: skip
    manifest = render_manifest(inputs, local=True, allow_host_access=True)
    ws = tmp_path / "ws"
    (ws / "output").mkdir(parents=True)  # a folder the job's workspace had: replaced by the link
    assert link_mounts(manifest, ws) == [f"/workspace/output -> {tmp_path / 'durable'}"]
    (ws / "output" / "epoch_0").mkdir()
    assert (tmp_path / "durable" / "epoch_0").is_dir() and not (ws / "data").exists()


def test_the_function_runs_as_the_sdks_custom_trainer_with_its_source_verbatim(tmp_path):
    source = 'def fit(output_dir: str, lr: float = 0.1):\n    print(f"{output_dir} {lr} {{model}}")\n'
    fn = FunctionTrainer(source=source, function="fit", func_file="train.py", arguments={"lr": 0.5}, specials=["output_dir"],
                         packages_to_install=["definitely-not-installed-here==1.0"])  # fmt: skip
    doc = yaml.safe_load((SHARED / "runtimes" / "torch_distributed.yaml").read_text())
    ctx, runtime = SimpleNamespace(local=False), SimpleNamespace(document=doc)
    assert fn.configure(ctx, runtime, None) == {"command": ["{output_model}"]}
    command = fn.finalize(ctx, runtime, {"output_model": "/kfp-workspace/.kfp-trainer/k/output-model"})["command"]
    assert command[:2] == ["bash", "-c"]
    script = command[2]
    assert source in script and "fit(**{'lr': 0.5, 'output_dir': '/kfp-workspace/.kfp-trainer/k/output-model'})" in script
    assert "PACKAGES=(definitely-not-installed-here==1.0)" in script and 'torchrun "train.py"' in script
    with pytest.raises(InvalidSpecErrors, match="packages_to_install: .* installs nothing"):
        fn.configure(SimpleNamespace(local=True), runtime, None)
    tune = yaml.safe_load((SHARED / "runtimes" / "qwen2_5_1.5B.yaml").read_text())
    with pytest.raises(InvalidSpecErrors, match="use torchtune_finetune"):
        FunctionTrainer(source=source, function="fit", func_file="t.py", arguments={}, specials=[]).configure(
            SimpleNamespace(local=False), SimpleNamespace(document=tune), None
        )
    assert missing_packages(["pyyaml>=5", "pyyaml<1"]) == ["pyyaml<1"]
