"""The components' TrainJobs equal the kubeflow SDK 0.5.0's, as the API server stores them.

``trainjob_component``: each case is a ``CustomTrainer(func, ...)`` the SDK creates with
``train()``, and the same function made a component with ``trainjob_component(func, ...)``
whose step runs through KFP's own executor against the API server (as in a pipeline, the
function's arguments are the task's inputs). The TrainJob the step created (seen by a watch:
the step deletes it when its short start limit passes) and the SDK's are compared field by
field: the spec, with our own ``runtimePatches`` (the pods' lineage labels, and a node selector
that keeps the pods from starting) set aside.

``torchtune_finetune``: each case is the component's inputs and the ``TorchTuneConfig`` /
initializers the SDK gets for the same fine-tune; the step's TrainJob (rendered from the
component's inputs as the step renders it) and the SDK's are compared the same way.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path

import pytest
import yaml
from kfp import compiler

from kfp_trainer.backends.kubernetes import KubernetesBackend
from kfp_trainer.errors import InvalidSpecErrors
from tests.entry_points import executor_input

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
import sdk_functions  # noqa: E402  (tests/integration/sdk_functions.py: the functions both sides run)
from test_pipeline_trainjobs import StoredTrainJobs  # noqa: E402
from test_sdk_interop import (  # noqa: E402
    CUSTOM_CASES,
    _differences,
    _driver_functions,
    _quantities_as_text,
    _sdk_create,
    _stored,
    create_step_trainjob,
    sdk_python,  # noqa: F401  (fixture)
)

FUNCTIONS = str(HERE / "sdk_functions.py")
NO_NODE = "kfp-trainer.test/no-such-node"
MODULE_NAMES = {"steps": 3, "inputs": "in", "kfp": 7, "dsl": "x", "os": "linux", "sys": True, "json": {"a": [1, 2]}, "self": 0.25,
                "values": ["v"], "module": "y"}  # fmt: skip

# CustomTrainer fields (func by name in sdk_functions.py). func_args are the task's arguments too:
# the step passes the function the values that differ from its defaults, as SDK users write func_args.
FUNCTION_CASES = {
    "no_parameters": {"runtime": "torch-distributed", "func": "no_parameters", "trainer": {}},
    "no_parameters_image_nodes": {
        "runtime": "torch-distributed", "func": "no_parameters", "trainer": {"image": "python:3.12-slim", "num_nodes": 3},
    },
    "no_parameters_python_launcher": {"runtime": "jax-distributed", "func": "no_parameters", "trainer": {}},
    "one_node": {"runtime": "torch-distributed", "func": "decorated", "trainer": {"num_nodes": 1, "func_args": {"epochs": 5}}},
    "flat_resources": {
        "runtime": "torch-distributed", "func": "unannotated",
        "trainer": {"resources_per_node": {"cpu": 4, "memory": "8Gi", "gpu": 1},
                    "func_args": {"lr": 0.02, "verbose": True}},
    },
    "mig_and_aliases": {
        "runtime": "torch-distributed", "func": "no_parameters",
        "trainer": {"resources_per_node": {"CPU": 2, "Memory": "4Gi", "mig-1g.5gb": 1, "storage": "20Gi"}},
    },
    "module_names": {"runtime": "torch-distributed", "func": "module_names", "trainer": {"func_args": MODULE_NAMES}},
    "module_names_mpi": {
        "runtime": "deepspeed-distributed", "func": "module_names", "trainer": {"func_args": MODULE_NAMES, "num_nodes": 2},
    },
    "decorated": {"runtime": "torch-distributed", "func": "decorated", "trainer": {"func_args": {"lr": 0.5, "epochs": 4}}},
    "unannotated": {
        "runtime": "jax-distributed", "func": "unannotated",
        "trainer": {"func_args": {"lr": 0.2, "epochs": 1, "name": "a b", "verbose": True}, "env": {"B": "2", "A": "1"}},
    },
    "subset_of_defaults": {"runtime": "torch-distributed", "func": "unannotated", "trainer": {"func_args": {"name": "b"}}},
    "keyword_only": {"runtime": "torch-distributed", "func": "keyword_only", "trainer": {"func_args": {"lr": 0.3, "tags": ["x", "y"]}}},
    "with_kwargs": {
        "runtime": "torch-distributed", "func": "with_kwargs",
        "trainer": {"func_args": {"lr": 0.4}, "packages_to_install": ["numpy<3"], "pip_index_urls": ["https://example.org/simple"]},
    },
    "quoting": {
        "runtime": "deepspeed-distributed", "func": "quoting",
        "trainer": {"func_args": {"message": "it's \"q\" $HOME `x` {b}", "table": {"k": "v'"}}, "packages_to_install": ["a[b]"]},
    },
}
_FACTORY = ("num_nodes", "image", "resources_per_node", "env", "packages_to_install", "pip_index_urls")


def _executor_input(component, params: dict, root: Path) -> dict:
    """What KFP's launcher hands the component's container: every input (defaults included) and the output URIs."""
    path = root / "component.yaml"
    compiler.Compiler().compile(component, str(path))
    spec = yaml.safe_load(path.read_text())
    declared, outputs = spec["root"]["inputDefinitions"]["parameters"], spec["root"]["outputDefinitions"]
    values = {k: d["defaultValue"] for k, d in declared.items() if "defaultValue" in d}
    # a node selector no node matches (a runtime patch of ours): the pods stay Pending and the step stops at its start limit
    values.update({k: {"nodeSelector": {NO_NODE: "none"}} for k, d in declared.items() if d["parameterType"] == "TASK_CONFIG"})
    values.update(params)
    values = json.loads(json.dumps(values), parse_float=_protojson_number)
    return executor_input(values, outputs, root)


def _protojson_number(text: str) -> float | int:
    """A JSON number as the KFP driver writes it (protojson): a whole number without ``.0``."""
    value = float(text)
    return int(value) if value.is_integer() else value


def _step_trainjob(api_client, kube_client, namespace: str, component, params: dict, root: Path, monkeypatch) -> dict:
    """The TrainJob a component's step creates, as the API server stored it."""
    from kfp.dsl import executor as kfp_executor

    monkeypatch.setattr(
        "kfp_trainer.backends.select_backend",
        lambda kind="auto", **kw: KubernetesBackend(kube_client, namespace=namespace, watch_timeout=2),
    )
    context = {"run_id": str(uuid.uuid4()), "task_name": "fn", "task_id": "4711", "backend": "kubernetes", "start_timeout": 1.0}
    body = _executor_input(component, {**params, **context}, root)
    with StoredTrainJobs(api_client, namespace) as stored:
        try:
            kfp_executor.Executor(executor_input=body, function_to_execute=component.python_func).execute()
        except SystemExit:  # no pod is scheduled: the step ends at its start limit and deletes its TrainJob
            pass
    assert len(stored.added) == 1, [o["metadata"]["name"] for o in stored.added]
    return stored.added[0]


def _function_spec(job: dict) -> dict:
    """A step's spec without what is ours alone: the runtimePatches (pods' lineage labels, the test's node selector)."""
    spec = json.loads(json.dumps(job["spec"]))
    patches = spec.pop("runtimePatches", [])
    assert [p["manager"] for p in patches] in ([], ["kfp-trainer.kubeflow.org/launcher"]), patches
    return spec


def _component_for(func, runtime: str, trainer: dict):
    from kfp_trainer.components import trainjob_component

    return trainjob_component(func, runtime=runtime, **{k: trainer[k] for k in _FACTORY if k in trainer})


@pytest.mark.parametrize("cases", [FUNCTION_CASES, CUSTOM_CASES], ids=["new", "test_sdk_interop"])
def test_trainjob_component_steps_create_the_sdks_custom_trainer_trainjob(
    kube_client, api_client, cluster, namespace, sdk_python, tmp_path, monkeypatch, cases  # noqa: F811
):
    driver = _driver_functions()
    request = [{"id": cid, "kind": "custom", **({"module": FUNCTIONS} if cases is FUNCTION_CASES else {}), **case}
               for cid, case in cases.items()]  # fmt: skip
    sdk_names = _sdk_create(sdk_python, cluster.kubeconfig, namespace, request)
    failures = []
    for cid, case in cases.items():
        func = getattr(sdk_functions if cases is FUNCTION_CASES else driver, case["func"])
        (tmp_path / cid).mkdir()
        try:
            component = _component_for(func, case["runtime"], case["trainer"])
            args = case["trainer"].get("func_args") or {}
            job = _step_trainjob(api_client, kube_client, namespace, component, args, tmp_path / cid, monkeypatch)
        except (TypeError, ValueError, AssertionError) as e:  # the component cannot be made, or its step created no TrainJob
            failures.append(f"case {cid}: {type(e).__name__}: {e}")
            continue
        theirs = _stored(api_client, namespace, sdk_names[cid])["spec"]
        diffs = _differences(_quantities_as_text(_function_spec(job)), _quantities_as_text(theirs), ".spec")
        if diffs:
            failures.append(f"case {cid}:\n  " + "\n  ".join(diffs))
    assert not failures, "the step's TrainJob differs from the SDK's:\n" + "\n".join(failures)


# torchtune_finetune inputs -> the SDK's TorchTuneConfig and initializers for the same fine-tune.
TORCHTUNE_CASES = {
    "integer_dropout": {
        "runtime": "torchtune-llama3.2-1b",
        "inputs": {"method": "lora", "lora_rank": 8, "lora_dropout": 0},
        "config": {"peft_config": {"lora_rank": 8, "lora_dropout": 0}},
    },
    "no_ignore_patterns": {
        "runtime": "torchtune-qwen2.5-1.5b",
        "inputs": {"epochs": 1, "model_uri": "hf://Qwen/Qwen2.5-1.5B-Instruct", "model_options": {"ignore_patterns": None}},
        "config": {"epochs": 1},
        "model": {"storage_uri": "hf://Qwen/Qwen2.5-1.5B-Instruct", "ignore_patterns": None},
    },
    "lora_unquantized": {
        "runtime": "torchtune-llama3.2-1b",
        "inputs": {"method": "lora", "quantize_base": False, "lora_alpha": 16},
        "config": {"peft_config": {"quantize_base": False, "lora_alpha": 16}},
    },
    "no_overrides": {"runtime": "torchtune-llama3.2-3b", "inputs": {}, "config": {}},
    "resources_only": {
        "runtime": "torchtune-llama3.2-1b",
        "inputs": {"resources_per_node": {"gpu": 1, "cpu": 4}},
        "config": {"resources_per_node": {"gpu": 1, "cpu": 4}},
    },
}


def test_torchtune_finetune_steps_create_the_sdks_builtin_trainer_trainjob(api_client, cluster, namespace, sdk_python):  # noqa: F811
    from kfp_trainer.steps.finetune import TorchTuneFinetune, torchtune_settings

    request = [{"id": cid, "kind": "builtin", **{k: v for k, v in case.items() if k != "inputs"}} for cid, case in TORCHTUNE_CASES.items()]
    sdk_names = _sdk_create(sdk_python, cluster.kubeconfig, namespace, request)
    failures = []
    for cid, case in TORCHTUNE_CASES.items():
        given = dict(case["inputs"])
        sources = {k: given.pop(k) for k in list(given) if k.startswith(("dataset_", "model_"))}
        try:
            step = TorchTuneFinetune(torchtune_settings(given.pop("method", "full"), **given), **sources)
        except (TypeError, InvalidSpecErrors) as e:  # an input the component does not take or refuses
            failures.append(f"case {cid}: {type(e).__name__}: {e}")
            continue
        name = create_step_trainjob(api_client, namespace, cid, step, case["runtime"])
        ours = _stored(api_client, namespace, name)["spec"]
        ours.pop("runtimePatches")  # the output folder's mount (test_sdk_interop checks it)
        theirs = _stored(api_client, namespace, sdk_names[cid])["spec"]
        diffs = _differences(_quantities_as_text(ours), _quantities_as_text(theirs), ".spec")
        if diffs:
            failures.append(f"case {cid}:\n  " + "\n  ".join(diffs))
    assert not failures, "the step's TrainJob differs from the SDK's:\n" + "\n".join(failures)
