"""Our LLM-path TrainJobs equal the kubeflow SDK 0.5.0's, as the API server stores them.

The SDK runs in its own virtualenv (hack/sdk/peer_sdk.py) and creates a TrainJob for each
case with ``TrainerClient().train(...)``; we render the same case with kfp_trainer.llm and
create ours; then both stored objects are compared field by field, apart from names and our
own labels. No controller runs: the comparison is of what was created.
"""

from __future__ import annotations

import copy
import importlib.util
import json
import subprocess
import sys
from pathlib import Path

import pytest
from kubernetes import client

from kfp_trainer.llm import inputs, render

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "hack" / "sdk"))
import peer_sdk  # noqa: E402  (hack/sdk/peer_sdk.py)

GROUP, VERSION = "trainer.kubeflow.org", "v1alpha1"
OUR_LABEL = "kfp-trainer.kubeflow.org/interop"
DRIVER = REPO / "hack" / "sdk" / "interop_driver.py"

# TorchTuneConfig / CustomTrainer fields as plain values: the same dict feeds both sides.
BUILTIN_CASES = {
    "full": {
        "runtime": "torchtune-qwen2.5-1.5b",
        "config": {"dtype": "bf16", "batch_size": 4, "epochs": 2, "loss": "torchtune.modules.loss.CEWithChunkedOutputLoss"},
        "dataset": {"storage_uri": "hf://tatsu-lab/alpaca"},
        "model": {"storage_uri": "hf://Qwen/Qwen2.5-1.5B-Instruct"},
    },
    "lora": {
        "runtime": "torchtune-llama3.2-1b",
        "config": {
            "epochs": 1,
            "peft_config": {
                "lora_rank": 8,
                "lora_alpha": 16,
                "lora_dropout": 0.05,
                "apply_lora_to_mlp": True,
                "apply_lora_to_output": False,
                "lora_attn_modules": ["q_proj", "k_proj", "v_proj", "output_proj"],
            },
        },
        "dataset": {"storage_uri": "hf://tatsu-lab/alpaca/data/train-00000-of-00001.parquet"},
        "model": {"storage_uri": "hf://meta-llama/Llama-3.2-1B-Instruct", "ignore_patterns": ["*.pth", "original/*"]},
    },
    "qlora": {
        "runtime": "torchtune-llama3.2-3b",
        "config": {
            "batch_size": 2,
            "peft_config": {"quantize_base": True, "lora_rank": 16, "lora_alpha": 32},
            "resources_per_node": {"gpu": 1},
        },
        "dataset": {"storage_uri": "hf://tatsu-lab/alpaca/data"},
        "model": {"storage_uri": "s3://models/llama-3.2-3b", "endpoint": "https://minio.example:9000", "region": "eu-west-1"},
    },
    "dora": {
        "runtime": "torchtune-llama3.2-1b",
        "config": {"peft_config": {"use_dora": True, "quantize_base": True, "lora_rank": 4, "lora_attn_modules": ["q_proj"]}},
    },
    "multi_node": {
        "runtime": "torchtune-llama3.3-70b",
        "config": {"num_nodes": 2, "dtype": "bf16", "epochs": 1, "resources_per_node": {"gpu": 8, "cpu": 64, "memory": "1Ti"}},
        "dataset": {"storage_uri": "hf://tatsu-lab/alpaca"},
    },
    "custom_preprocessing": {
        "runtime": "torchtune-qwen2.5-1.5b",
        "config": {
            "dataset_preprocess_config": {
                "source": "json",
                "split": "train[:90%]",
                "train_on_input": True,
                "new_system_prompt": "You are a careful math tutor. Answer with the number only.",
                "column_map": {"input": "question", "output": "answer"},
            }
        },
        "dataset": {"storage_uri": "s3://datasets/gsm8k", "endpoint": "http://minio.minio:9000", "ignore_patterns": ["*.md"]},
        "model": {"storage_uri": "hf://Qwen/Qwen2.5-1.5B-Instruct", "ignore_patterns": []},
    },
    "resources": {
        "runtime": "torchtune-llama3.2-1b",
        "config": {"dtype": "fp32", "resources_per_node": {"CPU": 8, "memory": "32Gi", "GPU": 2, "storage": "100Gi"}},
        "model": {"storage_uri": "hf://meta-llama/Llama-3.2-1B-Instruct"},
    },
    "defaults_only": {"runtime": "torchtune-qwen2.5-1.5b", "config": {}},
}
CUSTOM_CASES = {
    "torchrun_function": {
        "runtime": "torch-distributed",
        "func": "train_classifier",
        "trainer": {
            "func_args": {"lr": 0.05, "epochs": 3},
            "num_nodes": 2,
            "resources_per_node": {"cpu": 2, "memory": "4Gi"},
            "env": {"LOG_LEVEL": "debug"},
        },
    },
    "packages_and_image": {
        "runtime": "torch-distributed",
        "func": "fine_tune_with_packages",
        "trainer": {
            "packages_to_install": ["transformers>=4.45", "peft[torch]", "it's-quoted"],
            "pip_index_urls": ["https://pypi.org/simple", "https://download.pytorch.org/whl/cpu"],
            "image": "pytorch/pytorch:2.7.1-cuda12.8-cudnn9-runtime",
        },
        "dataset": {"storage_uri": "hf://tatsu-lab/alpaca"},
    },
    "mpi_function": {"runtime": "deepspeed-distributed", "func": "train_classifier", "trainer": {"packages_to_install": ["deepspeed"]}},
    "python_function": {"runtime": "jax-distributed", "func": "train_classifier", "trainer": {"func_args": {"lr": 0.1}}},
}


def _driver_functions():
    spec = importlib.util.spec_from_file_location("interop_driver", DRIVER)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def sdk_python() -> Path:
    try:
        return peer_sdk.python(create=True)
    except peer_sdk.PeerSdkUnavailable as e:
        pytest.skip(f"kubeflow SDK virtualenv unavailable: {e}")


@pytest.fixture(scope="module")
def llama70b_runtime(api_client):
    """A torchtune runtime for Llama 3.3 70B (the only model the Trainer lets run multi-node)."""
    co = client.CustomObjectsApi(api_client)
    body = copy.deepcopy(co.get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", "torchtune-llama3.2-1b"))
    body["metadata"] = {"name": "torchtune-llama3.3-70b", "labels": body["metadata"]["labels"]}
    node = next(j for j in body["spec"]["template"]["spec"]["replicatedJobs"] if j["name"] == "node")
    cmd = node["template"]["spec"]["template"]["spec"]["containers"][0]["command"]
    cmd[cmd.index("--config") + 1] = "llama3_3/70B_full_multinode"
    co.create_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", body)
    yield body["metadata"]["name"]
    co.delete_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", body["metadata"]["name"])


def _sdk_create(sdk_python: Path, kubeconfig: str, namespace: str, cases: list[dict]) -> dict[str, str]:
    request = json.dumps({"kubeconfig": kubeconfig, "namespace": namespace, "cases": cases})
    done = subprocess.run([str(sdk_python), str(DRIVER)], input=request, capture_output=True, text=True, timeout=300, check=False)
    assert done.returncode == 0, f"the SDK failed:\n{done.stderr[-4000:]}"
    return json.loads(done.stdout)


def _runtime(api_client, name: str) -> dict:
    return client.CustomObjectsApi(api_client).get_cluster_custom_object(GROUP, VERSION, "clustertrainingruntimes", name)


def _source(spec: dict | None) -> inputs.StorageSource | None:
    return None if spec is None else inputs.parse(inputs.StorageSource, **spec)


def _create_ours(api_client, namespace: str, name: str, spec: dict) -> None:
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "labels": {OUR_LABEL: "ours"}},
        "spec": spec,
    }
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", body, field_validation="Strict"
    )


def _stored(api_client, namespace: str, name: str) -> dict:
    return client.CustomObjectsApi(api_client).get_namespaced_custom_object(GROUP, VERSION, namespace, "trainjobs", name)


def _comparable(obj: dict) -> dict:
    """The stored object without what differs by nature: identity, server bookkeeping, our labels."""
    meta = obj["metadata"]
    labels = {k: v for k, v in (meta.get("labels") or {}).items() if k != OUR_LABEL}
    return {
        "apiVersion": obj["apiVersion"],
        "kind": obj["kind"],
        "metadata": {"labels": labels, "annotations": meta.get("annotations") or {}, "namespace": meta["namespace"]},
        "spec": obj["spec"],
    }


def _differences(a, b, path="") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        out = []
        for k in sorted(set(a) | set(b)):
            if k not in a or k not in b:
                out.append(f"{path}.{k}: {'missing in ours' if k not in a else 'missing in the SDK one'}")
            else:
                out += _differences(a[k], b[k], f"{path}.{k}")
        return out
    if isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in _differences(x, y, f"{path}[{i}]")]
    return [] if a == b and type(a) is type(b) else [f"{path}: ours {a!r} != SDK {b!r}"]


def _assert_same(ours: dict, theirs: dict, case: str) -> None:
    diffs = _differences(_comparable(ours), _comparable(theirs))
    assert not diffs, f"case {case}: our TrainJob differs from the SDK's:\n" + "\n".join(diffs)


def test_builtin_trainer_trainjobs_equal_the_sdks(api_client, cluster, namespace, sdk_python, llama70b_runtime):
    cases = [{"id": cid, "kind": "builtin", **case} for cid, case in BUILTIN_CASES.items()]
    sdk_names = _sdk_create(sdk_python, cluster.kubeconfig, namespace, cases)
    assert set(sdk_names) == set(BUILTIN_CASES)
    for cid, case in BUILTIN_CASES.items():
        settings = inputs.parse(inputs.TorchTuneSettings, **case["config"])
        rendered = render.render_builtin(
            _runtime(api_client, case["runtime"]), settings, dataset=_source(case.get("dataset")), model=_source(case.get("model"))
        )
        ours = f"ours-{cid.replace('_', '-')}"
        _create_ours(api_client, namespace, ours, rendered.spec)
        _assert_same(_stored(api_client, namespace, ours), _stored(api_client, namespace, sdk_names[cid]), cid)


def test_custom_trainer_trainjobs_equal_the_sdks(api_client, cluster, namespace, sdk_python):
    functions = _driver_functions()
    cases = [{"id": cid, "kind": "custom", **case} for cid, case in CUSTOM_CASES.items()]
    sdk_names = _sdk_create(sdk_python, cluster.kubeconfig, namespace, cases)
    for cid, case in CUSTOM_CASES.items():
        settings = inputs.FunctionTrainerSettings.from_function(getattr(functions, case["func"]), **case["trainer"])
        rendered = render.render_function(_runtime(api_client, case["runtime"]), settings, dataset=_source(case.get("dataset")))
        ours = f"ours-{cid.replace('_', '-')}"
        _create_ours(api_client, namespace, ours, rendered.spec)
        _assert_same(_stored(api_client, namespace, ours), _stored(api_client, namespace, sdk_names[cid]), cid)


def test_the_comparison_notices_a_single_changed_override(api_client, cluster, namespace, sdk_python):
    case = {"id": "lora", "kind": "builtin", **BUILTIN_CASES["lora"]}
    sdk_name = _sdk_create(sdk_python, cluster.kubeconfig, namespace, [case])["lora"]
    settings = inputs.parse(inputs.TorchTuneSettings, **{**case["config"], "epochs": 3})
    rendered = render.render_builtin(
        _runtime(api_client, case["runtime"]), settings, dataset=_source(case["dataset"]), model=_source(case["model"])
    )
    _create_ours(api_client, namespace, "ours-changed", rendered.spec)
    with pytest.raises(AssertionError, match=r"\.spec\.trainer\.args\[0\]: ours 'epochs=3' != SDK 'epochs=1'"):
        _assert_same(_stored(api_client, namespace, "ours-changed"), _stored(api_client, namespace, sdk_name), "lora")
