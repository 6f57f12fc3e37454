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
import os
import subprocess
import sys
import threading
from http.server import BaseHTTPRequestHandler, HTTPServer
from pathlib import Path

import pytest
from kubernetes import client

from kfp_trainer import custom_trainer
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
        # no initializer: the Trainer v2.3 webhook refuses a dataset for a runtime without a dataset-initializer job
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


def create_step_trainjob(api_client, namespace: str, cid: str, step, runtime: str) -> str:
    """The TrainJob a torchtune fine-tune step (``TorchTuneFinetune``) renders for ``runtime``, created
    on the API server as the step creates it (on the run's workspace claim); returns its name."""
    from types import SimpleNamespace

    from kfp_trainer.spec import TrainJobInputs
    from kfp_trainer.spec import render as render_trainjob
    from kfp_trainer.steps.step_types import TrainerContext

    workspace = {"name": "kfp-workspace", "persistentVolumeClaim": {"claimName": "run-kfp-workspace"}}
    ctx = TrainerContext(
        local=False, shared_root="/kfp-workspace", key=f"step-{cid}", workspace_path="/kfp-workspace",
        output_model=SimpleNamespace(path="/tmp/unused"),
    )  # fmt: skip
    name = f"step-{cid.replace('_', '-')}"
    given = TrainJobInputs.parse(volumes=[workspace], volume_mounts=[{"name": "kfp-workspace", "mountPath": "/kfp-workspace"}],
                                 name=name, run_id="run", task_name="finetune", namespace=namespace)  # fmt: skip
    inputs = given.updated(**step.configure(ctx, SimpleNamespace(document=_runtime(api_client, runtime)), given))
    manifest = render_trainjob(inputs, runtime_jobs=["dataset-initializer", "model-initializer", "node"])
    client.CustomObjectsApi(api_client).create_namespaced_custom_object(
        GROUP, VERSION, namespace, "trainjobs", manifest, field_validation="Strict"
    )
    return name


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
    # Our renderer writes quantities as the API stores them after the Trainer webhook (8 -> "8"), as the steps send them.
    mine, sdk = _comparable(ours), _comparable(theirs)
    mine["spec"], sdk["spec"] = _quantities_as_text(mine["spec"]), _quantities_as_text(sdk["spec"])
    diffs = _differences(mine, sdk)
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
        _create_ours(api_client, namespace, ours, rendered.sdk_spec())
        _assert_same(_stored(api_client, namespace, ours), _stored(api_client, namespace, sdk_names[cid]), cid)


def test_custom_trainer_trainjobs_equal_the_sdks(api_client, cluster, namespace, sdk_python):
    functions = _driver_functions()
    cases = [{"id": cid, "kind": "custom", **case} for cid, case in CUSTOM_CASES.items()]
    sdk_names = _sdk_create(sdk_python, cluster.kubeconfig, namespace, cases)
    for cid, case in CUSTOM_CASES.items():
        settings = inputs.FunctionTrainerSettings.from_function(getattr(functions, case["func"]), **case["trainer"])
        rendered = custom_trainer.render_function(_runtime(api_client, case["runtime"]), settings, dataset=_source(case.get("dataset")))
        ours = f"ours-{cid.replace('_', '-')}"
        _create_ours(api_client, namespace, ours, rendered.sdk_spec())
        _assert_same(_stored(api_client, namespace, ours), _stored(api_client, namespace, sdk_names[cid]), cid)


def test_the_comparison_notices_a_single_changed_override(api_client, cluster, namespace, sdk_python):
    case = {"id": "lora", "kind": "builtin", **BUILTIN_CASES["lora"]}
    sdk_name = _sdk_create(sdk_python, cluster.kubeconfig, namespace, [case])["lora"]
    settings = inputs.parse(inputs.TorchTuneSettings, **{**case["config"], "epochs": 3})
    rendered = render.render_builtin(
        _runtime(api_client, case["runtime"]), settings, dataset=_source(case["dataset"]), model=_source(case["model"])
    )
    _create_ours(api_client, namespace, "ours-changed", rendered.sdk_spec())
    with pytest.raises(AssertionError, match=r"\.spec\.trainer\.args\[0\]: ours 'epochs=3' != SDK 'epochs=1'"):
        _assert_same(_stored(api_client, namespace, "ours-changed"), _stored(api_client, namespace, sdk_name), "lora")


# --- progress reports ----------------------------------------------------------------------------


class _StatusCapture(BaseHTTPRequestHandler):
    """Stands in for the Trainer's status server: records each request, answers 200 with the body."""

    seen: list = []

    def do_POST(self):  # noqa: N802
        body = self.rfile.read(int(self.headers["Content-Length"]))
        type(self).seen.append((self.path, self.headers.get("Authorization"), json.loads(body)))
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args):
        pass


def _apply_trainer_status(api_client, namespace: str, name: str, trainer_status: dict) -> dict:
    """Store a report as the status server does: server-side apply of status.trainerStatus."""
    body = {
        "apiVersion": f"{GROUP}/{VERSION}",
        "kind": "TrainJob",
        "metadata": {"name": name, "namespace": namespace},
        "status": {"trainerStatus": trainer_status},
    }
    api_client.call_api(
        f"/apis/{GROUP}/{VERSION}/namespaces/{namespace}/trainjobs/{name}/status",
        "PATCH",
        query_params=[("fieldManager", "trainer-status"), ("force", "true")],
        header_params={"Content-Type": "application/apply-patch+yaml", "Accept": "application/json"},
        body=body,
        auth_settings=["BearerToken"],
        response_type="object",
        _return_http_data_only=True,
    )
    return _stored(api_client, namespace, name)["status"]["trainerStatus"]


def test_progress_reports_are_stored_like_the_sdks(api_client, cluster, namespace, sdk_python, tmp_path):
    from kfp_trainer import progress

    _StatusCapture.seen = []
    server = HTTPServer(("127.0.0.1", 0), _StatusCapture)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    token = tmp_path / "token"
    token.write_text("projected-token")
    for name in ("sdk-progress", "our-progress"):
        _create_ours(api_client, namespace, name, {"runtimeRef": {"name": "torch-distributed"}})
    path = progress.STATUS_PATH.format(namespace=namespace, name="job")
    env = {progress.ENV_URL: f"http://127.0.0.1:{server.server_address[1]}{path}", progress.ENV_TOKEN: str(token)}
    report = {"progress_percent": 40, "estimated_remaining_seconds": 75, "metrics": {"loss": 0.4321, "accuracy": 0.9, "step": 120}}
    try:
        done = subprocess.run(
            [str(sdk_python), str(DRIVER)],
            input=json.dumps({"progress": report}),
            env={**os.environ, **env},
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        assert done.returncode == 0 and json.loads(done.stdout) == {"sent": True}, done.stderr[-2000:]
        reporter = progress.ProgressReporter(env=env)
        assert reporter.report(report["progress_percent"], report["estimated_remaining_seconds"], report["metrics"]), reporter.last_error
    finally:
        server.shutdown()
    (sdk_path, sdk_auth, sdk_body), (our_path, our_auth, our_body) = _StatusCapture.seen
    assert (our_path, our_auth) == (sdk_path, sdk_auth) == (path, "Bearer projected-token")
    assert list(our_body) == list(sdk_body) == ["trainerStatus"]
    stored = {
        "sdk": _apply_trainer_status(api_client, namespace, "sdk-progress", sdk_body["trainerStatus"]),
        "ours": _apply_trainer_status(api_client, namespace, "our-progress", our_body["trainerStatus"]),
    }
    for side in stored.values():
        assert side.pop("lastUpdatedTime")  # both accepted by the CRD's date-time format and CEL rule
    assert (
        stored["ours"]
        == stored["sdk"]
        == {
            "progressPercentage": 40,
            "estimatedRemainingSeconds": 75,
            "metrics": [{"name": "loss", "value": "0.4321"}, {"name": "accuracy", "value": "0.9"}, {"name": "step", "value": "120"}],
        }
    )


def test_the_finetune_components_trainjob_is_the_sdks_plus_the_output_mount(api_client, cluster, namespace, sdk_python, llama70b_runtime):
    """What the torchtune_finetune step creates for each case: the SDK's spec, plus one runtime patch of ours."""
    from kfp_trainer.steps.finetune import TorchTuneFinetune

    cases = [{"id": cid, "kind": "builtin", **case} for cid, case in BUILTIN_CASES.items()]
    sdk_names = _sdk_create(sdk_python, cluster.kubeconfig, namespace, cases)
    for cid, case in BUILTIN_CASES.items():
        sources = {}
        for kind in ("dataset", "model"):
            source = dict(case.get(kind) or {})
            if source:
                sources[f"{kind}_uri"] = source.pop("storage_uri")
                sources[f"{kind}_options"] = source or None
        step = TorchTuneFinetune(inputs.parse(inputs.TorchTuneSettings, **case["config"]), **sources)
        ours = create_step_trainjob(api_client, namespace, cid, step, case["runtime"])
        stored, theirs = _stored(api_client, namespace, ours), _stored(api_client, namespace, sdk_names[cid])
        patches = stored["spec"].pop("runtimePatches")
        assert [p["manager"] for p in patches] == ["kfp-trainer.kubeflow.org/launcher"]
        node = patches[0]["trainingRuntimeSpec"]["template"]["spec"]["replicatedJobs"][0]["template"]["spec"]["template"]["spec"]
        assert node["containers"][0]["volumeMounts"][-1]["mountPath"] == "/workspace/output"
        diffs = _differences(_quantities_as_text(stored["spec"]), _quantities_as_text(theirs["spec"]), ".spec")
        assert not diffs, f"case {cid}: the step's TrainJob differs from the SDK's:\n" + "\n".join(diffs)


def _quantities_as_text(spec: dict) -> dict:
    """``resourcesPerNode`` quantities as strings.

    The Trainer's webhook stores the quantities of a TrainJob that has runtimePatches as strings
    (``1`` becomes ``'1'``; seen here): the same quantity, written another way.
    """
    out = copy.deepcopy(spec)
    for section in ((out.get("trainer") or {}).get("resourcesPerNode") or {}).values():
        for name, value in section.items():
            section[name] = str(value)
    return out
