"""Creates TrainJobs with the kubeflow SDK (run with the peer SDK's python, see peer_sdk.py).

Reads a JSON request on stdin and prints ``{case id: TrainJob name}`` as JSON:

    {"kubeconfig": "...", "namespace": "...",
     "cases": [{"id": "lora", "kind": "builtin", "runtime": "torchtune-llama3.2-1b",
                "config": {"epochs": 2, "peft_config": {"lora_rank": 8}},
                "dataset": {"storage_uri": "hf://org/data"}, "model": {"storage_uri": "hf://org/model"}},
               {"id": "fn", "kind": "custom", "runtime": "torch-distributed", "func": "train_classifier",
                "trainer": {"func_args": {"lr": 0.1}, "num_nodes": 2}}]}

``{"progress": {"progress_percent": 40, "estimated_remaining_seconds": 60, "metrics": {...}}}``
instead sends one ``update_trainjob_status`` report (to the URL, CA and token named by the
``KUBEFLOW_TRAINER_SERVER_*`` environment variables) and prints ``{"sent": true|false}``.

``config`` holds TorchTuneConfig's fields with plain values (enums by value); ``trainer`` holds
CustomTrainer's fields except ``func``, which names one of the functions below, or a function
of the Python file named by the case's ``module``. The functions are also imported by the
interop tests, so both sides read the same source file.
"""

from __future__ import annotations

import json
import sys


def train_classifier(lr: float = 0.01, epochs: int = 1):
    """A small torch training function, as users hand to CustomTrainer."""
    import torch

    model = torch.nn.Linear(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=lr)
    for epoch in range(epochs):
        x, y = torch.randn(32, 4), torch.randint(0, 2, (32,))
        loss = torch.nn.functional.cross_entropy(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"epoch={epoch} loss={loss.item():.4f}")


def fine_tune_with_packages():
    """Uses packages installed by the TrainJob ('packages_to_install')."""
    import transformers  # noqa: F401

    print("packages are there", {"quoted": "yes", "braces": "{}"})


def _function(case: dict):
    """The case's training function: one of this file's, or ``func`` of the Python file ``module`` names."""
    if not case.get("module"):
        return globals()[case["func"]]
    import importlib.util
    from pathlib import Path

    spec = importlib.util.spec_from_file_location(Path(case["module"]).stem, case["module"])
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return getattr(module, case["func"])


def _sdk_types(case: dict):
    import kubeflow.trainer as types

    def source(spec: dict | None, model: bool):
        if spec is None:
            return None
        if spec["storage_uri"].startswith("s3://"):
            cls = types.S3ModelInitializer if model else types.S3DatasetInitializer
        else:
            cls = types.HuggingFaceModelInitializer if model else types.HuggingFaceDatasetInitializer
        return cls(**spec)

    initializer = None
    if case.get("dataset") or case.get("model"):
        initializer = types.Initializer(dataset=source(case.get("dataset"), False), model=source(case.get("model"), True))
    if case["kind"] == "builtin":
        cfg = dict(case.get("config") or {})
        if "dtype" in cfg:
            cfg["dtype"] = types.DataType(cfg["dtype"])
        if "loss" in cfg:
            cfg["loss"] = types.Loss(cfg["loss"])
        if "peft_config" in cfg:
            cfg["peft_config"] = types.LoraConfig(**cfg["peft_config"])
        if "dataset_preprocess_config" in cfg:
            pre = dict(cfg["dataset_preprocess_config"])
            if "source" in pre:
                pre["source"] = types.DataFormat(pre["source"])
            cfg["dataset_preprocess_config"] = types.TorchTuneInstructDataset(**pre)
        trainer = types.BuiltinTrainer(config=types.TorchTuneConfig(**cfg))
    else:
        trainer = types.CustomTrainer(func=_function(case), **(case.get("trainer") or {}))
    return initializer, trainer


def main() -> int:
    from kubeflow.common.types import KubernetesBackendConfig
    from kubeflow.trainer import TrainerClient

    request = json.load(sys.stdin)
    if "progress" in request:
        from kubeflow.trainer import update_trainjob_status

        json.dump({"sent": update_trainjob_status(**request["progress"])}, sys.stdout)
        return 0
    client = TrainerClient(KubernetesBackendConfig(namespace=request["namespace"], config_file=request["kubeconfig"]))
    names = {}
    for case in request["cases"]:
        initializer, trainer = _sdk_types(case)
        names[case["id"]] = client.train(runtime=case["runtime"], initializer=initializer, trainer=trainer)
    json.dump(names, sys.stdout)
    return 0


if __name__ == "__main__":
    sys.exit(main())
