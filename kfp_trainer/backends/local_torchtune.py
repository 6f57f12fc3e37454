"""Local runs of the Trainer's torchtune runtimes: their definitions, and what each local node runs.

A TrainJob of a torchtune runtime carries only ``tune run`` and overrides; the Trainer
controller completes the command (recipe, ``--config``, the runtime's own overrides). Here the
same completion is done by :func:`kfp_trainer.llm.local_tune.local_tune_command`, and each local
node runs the result with torchrun's ``PET_*`` environment on 127.0.0.1, the CPU compatibility
layer switched on and, when the model initializer fetched one of the tiny offline models
(:mod:`kfp_trainer.llm.tiny_models`), the overrides that build that model's size.

:data:`TORCHTUNE_RUNTIMES` describes the Trainer v2.3 torchtune ClusterTrainingRuntimes (their
commands, initializer jobs and GPU limits), so local mode has them without a runtimes folder.

Example:
    >>> sorted(TORCHTUNE_RUNTIMES)
    ['torchtune-llama3.2-1b', 'torchtune-llama3.2-3b', 'torchtune-qwen2.5-1.5b']
    >>> is_torchtune(TORCHTUNE_RUNTIMES["torchtune-qwen2.5-1.5b"])
    True
"""

from __future__ import annotations

import importlib.util
import os
import sys
from pathlib import Path
from typing import Any

from ..errors import ValidationError

FRAMEWORK_LABEL = "trainer.kubeflow.org/framework"
ANCESTOR_LABEL = "trainer.kubeflow.org/trainjob-ancestor-step"
#: Trainer processes per local node when the TrainJob does not say (the runtimes ask for 2 GPUs).
DEFAULT_PROCS_PER_NODE = 2

_BPE_TOKENIZER = ("tokenizer.path=/workspace/model/vocab.json", "tokenizer.merges_file=/workspace/model/merges.txt")
_TIKTOKEN = ("tokenizer.path=/workspace/model/original/tokenizer.model",)


def _runtime(name: str, config: str, tokenizer: tuple[str, ...], model_uri: str) -> dict[str, Any]:
    """A torchtune ClusterTrainingRuntime as Trainer v2.3 ships it (the parts a local run reads)."""

    def initializer(kind: str, uri: str) -> dict[str, Any]:
        container = {"name": kind, "image": f"ghcr.io/kubeflow/trainer/{kind}", "env": [{"name": "STORAGE_URI", "value": uri}]}
        return {
            "name": kind,
            "template": {"metadata": {"labels": {ANCESTOR_LABEL: kind}}, "spec": {"template": {"spec": {"containers": [container]}}}},
        }

    command = [
        "tune", "run", "--rdzv_endpoint=localhost:29500", "full_finetune_distributed", "--config", config,
        "dataset=torchtune.datasets.instruct_dataset", "dataset.source=parquet", "dataset.data_dir=/workspace/dataset/data",
        "output_dir=/workspace/output", *tokenizer, "checkpointer.checkpoint_dir=/workspace/model",
    ]  # fmt: skip
    node = {
        "name": "node",
        "dependsOn": [{"name": "dataset-initializer", "status": "Complete"}, {"name": "model-initializer", "status": "Complete"}],
        "template": {
            "metadata": {"labels": {ANCESTOR_LABEL: "trainer"}},
            "spec": {"template": {"spec": {"containers": [{
                "name": "node", "image": "ghcr.io/kubeflow/trainer/torchtune-trainer", "command": command,
                "resources": {"limits": {"nvidia.com/gpu": 2}},
            }]}}},
        },
    }  # fmt: skip
    return {
        "apiVersion": "trainer.kubeflow.org/v1alpha1",
        "kind": "ClusterTrainingRuntime",
        "metadata": {"name": name, "labels": {FRAMEWORK_LABEL: "torchtune"}},
        "spec": {
            "mlPolicy": {"numNodes": 1, "torch": {}},
            "template": {
                "spec": {
                    "replicatedJobs": [
                        initializer("dataset-initializer", "hf://tatsu-lab/alpaca"),
                        initializer("model-initializer", model_uri),
                        node,
                    ]
                }
            },
        },
    }


TORCHTUNE_RUNTIMES: dict[str, dict[str, Any]] = {
    "torchtune-llama3.2-1b": _runtime("torchtune-llama3.2-1b", "llama3_2/1B_full", _TIKTOKEN, "hf://meta-llama/Llama-3.2-1B-Instruct"),
    "torchtune-llama3.2-3b": _runtime("torchtune-llama3.2-3b", "llama3_2/3B_full", _TIKTOKEN, "hf://meta-llama/Llama-3.2-3B-Instruct"),
    "torchtune-qwen2.5-1.5b": _runtime("torchtune-qwen2.5-1.5b", "qwen2_5/1.5B_full", _BPE_TOKENIZER, "hf://Qwen/Qwen2.5-1.5B-Instruct"),
}


def is_torchtune(runtime: dict[str, Any]) -> bool:
    """True for a runtime labelled ``trainer.kubeflow.org/framework: torchtune``."""
    return ((runtime.get("metadata") or {}).get("labels") or {}).get(FRAMEWORK_LABEL) == "torchtune"


def check_available(runtime_name: str) -> None:
    """Fail before anything starts when torchtune is not installed here.

    Raises:
        ValidationError: torchtune (the ``[llm]`` extra) is missing.
    """
    if importlib.util.find_spec("torchtune") is None:
        raise ValidationError(
            "runtime",
            runtime_name,
            "a runtime this machine can run: torchtune runtimes need torchtune locally (pip install 'kfp-trainer[local,llm]')",
        )


def _procs_per_node(trainer: dict[str, Any]) -> int:
    value = trainer.get("numProcPerNode")
    if isinstance(value, int) and not isinstance(value, bool) and value > 0:
        return value
    if isinstance(value, str) and value.isascii() and value.isdecimal() and int(value) > 0:
        return int(value)
    return DEFAULT_PROCS_PER_NODE


def node_command(
    manifest: dict[str, Any], runtime: dict[str, Any], workspace: Path, *, node: int, master_port: int
) -> tuple[list[str], dict[str, str]]:
    """Argv and full environment of local node ``node`` of a torchtune TrainJob.

    Runs after the initializers: a tiny offline model in ``<workspace>/model`` adds the
    overrides that build its size (a real model adds none).
    """
    from ..llm import local_tune, tiny_models

    trainer = (manifest.get("spec") or {}).get("trainer") or {}
    name = (manifest.get("metadata") or {}).get("name") or "local"
    common: dict[str, Any] = {"procs_per_node": _procs_per_node(trainer), "master_port": master_port, "job_name": name}
    probe = local_tune.local_tune_command(runtime, trainer, str(workspace), **common)
    extra = tiny_models.overrides_for(workspace / "model", probe.config)
    cmd = local_tune.local_tune_command(
        runtime, trainer, str(workspace), node_rank=node, extra_overrides=extra, python_path=os.environ.get("PYTHONPATH", ""), **common
    )
    env = {**os.environ, **cmd.env}
    env["PATH"] = str(Path(sys.executable).parent) + os.pathsep + env.get("PATH", "")
    env["KFP_TRAINER_WORKSPACE"] = str(workspace)
    return cmd.argv, env
