"""A launcher component's input values sorted into its step's arguments. Pure: no I/O.

The component passes its ``locals()``; the same mapping checks literal arguments when a
pipeline is built (:mod:`.checks`), so both read the inputs the same way:

* :func:`train_job_inputs` -- the TrainJob inputs among a ``train_job`` task's values;
* :func:`trl_arguments` -- ``trl_finetune``'s values as :func:`~kfp_trainer.steps.trl.run_trl_finetune`'s arguments;
* :func:`function_job_arguments` -- a ``trainjob_component`` component's values as
  :func:`~kfp_trainer.steps.function.run_function_job`'s arguments.

(``torchtune_finetune``'s are in :mod:`.finetune_inputs`.)
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from .step_types import StepArtifacts, StepOptions

# Integer inputs that mean "unset" at these values (kfp.local cannot hand None to an int input).
_UNSET = {"num_nodes": 0, "active_deadline_seconds": 0, "termination_grace_period_seconds": -1}
#: The ``train_job`` component's inputs that are the launcher's own options, not TrainJob inputs.
LAUNCH_OPTIONS = (
    "backend", "workspace_path", "start_timeout", "queue_timeout", "run_timeout", "logs", "delete_after_success", "metric_names",
)  # fmt: skip
#: The inputs that say where the step tracks its training (:mod:`kfp_trainer.tracking`).
TRACKING_OPTIONS = ("mlflow_tracking_uri", "mlflow_experiment")
_NOT_TRAINJOB = {"output_model", "metrics", "report", "trainjob", "dataset", "model", "task_config", *LAUNCH_OPTIONS, *TRACKING_OPTIONS}
#: The artifact parameters of a function and the placeholder each gets.
SPECIAL = {"dataset_dir": "{dataset}", "model_dir": "{model}", "output_dir": "{output_model}"}


def train_job_inputs(values: Mapping[str, Any]) -> dict[str, Any]:
    """The TrainJob inputs among a ``train_job`` task's input values (``None`` = unset).

    Example:
        >>> train_job_inputs({"runtime": "torch-distributed", "num_nodes": 0, "logs": "all", "termination_grace_period_seconds": 30})
        {'runtime': 'torch-distributed', 'num_nodes': None, 'termination_grace_period_seconds': 30}
    """
    return {k: (None if k in _UNSET and v == _UNSET[k] else v) for k, v in values.items() if k not in _NOT_TRAINJOB}


_TRL_SETTINGS = (
    "learning_rate", "per_device_train_batch_size", "num_train_epochs", "max_steps", "bf16", "use_peft", "lora_r",
    "lora_alpha", "lora_dropout", "lora_target_modules", "load_in_4bit", "beta", "max_length", "save_steps",
    "logging_steps", "seed", "gradient_accumulation_steps", "num_generations", "max_completion_length", "temperature",
    "loss_type", "use_vllm", "vllm_mode", "rewards",
)  # fmt: skip
_TRL_JOB_INPUTS = (
    "runtime", "runtime_kind", "num_nodes", "num_proc_per_node", "resources_per_node", "name", "name_prefix", "namespace",
    "run_id", "task_name", "task_id", "pipeline_name", "labels", "pod_labels", "pod_annotations", "node_selector",
    "tolerations", "service_account", "active_deadline_seconds", "queue_name", "priority_class",
)  # fmt: skip


def trl_arguments(values: Mapping[str, Any]) -> dict[str, Any]:
    """The ``trl_finetune`` component's inputs sorted into :func:`~kfp_trainer.steps.trl.run_trl_finetune`'s arguments.

    0 / False for an unset setting or TrainJob input become ``None`` (TRL's or the runtime's
    default). The step's artifacts and options are left out (:class:`StepArtifacts`, :class:`StepOptions`).

    Example:
        >>> trl_arguments({"method": "dpo", "beta": 0.1, "use_peft": False, "num_nodes": 0})["settings"]
        {'use_peft': None, 'beta': 0.1}
    """
    settings = {k: values[k] for k in _TRL_SETTINGS if k in values}
    for flag in ("use_peft", "load_in_4bit", "use_vllm"):
        if flag in settings:
            settings[flag] = settings[flag] or None
    inputs = {k: values[k] for k in _TRL_JOB_INPUTS if k in values}
    for name in ("num_nodes", "active_deadline_seconds"):
        if name in inputs:
            inputs[name] = inputs[name] or None
    return {
        "method": values.get("method", "sft"), "settings": settings, "extra_args": values.get("extra_args"),
        "merge_adapter": values.get("merge_adapter", True), "dataset_uri": values.get("dataset_uri") or "",
        "model_uri": values.get("model_uri") or "", "inputs": inputs,
    }  # fmt: skip


_SECTIONS = ("limits", "requests", "claims")
#: The launcher's own inputs of a ``trainjob_component`` component (any other name may be the function's).
_FUNCTION_LAUNCH = ("backend", "workspace_path", "start_timeout", "run_timeout", "task_config")


def function_job_arguments(values: Mapping[str, Any], constants: Mapping[str, Any]) -> dict[str, Any]:
    """:func:`~kfp_trainer.steps.function.run_function_job`'s arguments from a ``trainjob_component`` component's input values.

    ``values`` maps every input and output of the component by name (the function's own
    parameters among them, whatever their names); ``constants`` holds what the factory fixed:
    ``source``, ``function``, ``func_file``, ``parameters`` (the function's parameter names in
    order), ``num_proc_per_node``, ``resources_per_node`` and ``env``. A ``num_nodes`` of 0 and
    an empty ``image`` leave the runtime's, as the SDK does; resources in the SDK's flat form go
    to the trainer, which maps them as the SDK does, a ResourceRequirements dict to the TrainJob
    inputs.

    Example:
        >>> args = function_job_arguments(
        ...     {"steps": 3, "inputs": "x", "runtime": "torch-distributed", "num_nodes": 0, "image": "", "output_model": None},
        ...     {"source": "def f(steps, inputs): pass", "function": "f", "func_file": "f.py", "parameters": ["steps", "inputs"],
        ...      "resources_per_node": {"gpu": 1}})
        >>> args["arguments"], args["inputs"]["num_nodes"], args["inputs"]["image"], args["resources_per_node"]
        ({'steps': 3, 'inputs': 'x'}, None, None, {'gpu': 1})
    """
    parameters = list(constants.get("parameters") or [])
    resources: Any = constants.get("resources_per_node")
    flat = bool(resources) and not all(key in _SECTIONS for key in resources)
    inputs = {
        "runtime": values.get("runtime"), "image": values.get("image") or None, "num_nodes": values.get("num_nodes") or None,
        "run_id": values.get("run_id"), "task_name": values.get("task_name"), "task_id": values.get("task_id"),
        "num_proc_per_node": constants.get("num_proc_per_node"), "resources_per_node": None if flat else resources,
        "env": constants.get("env"),
    }  # fmt: skip
    return {
        "source": constants["source"], "function": constants["function"], "func_file": constants["func_file"],
        "arguments": _arguments(values, constants), "specials": [p for p in parameters if p in SPECIAL],
        "order": parameters, "packages_to_install": values.get("packages_to_install"),
        "pip_index_urls": values.get("pip_index_urls"), "resources_per_node": resources if flat else None, "inputs": inputs,
        "artifacts": _function_artifacts(values, parameters),
        "options": StepOptions(**{k: values[k] for k in _FUNCTION_LAUNCH if k in values}),
    }  # fmt: skip


def _function_artifacts(values: Mapping[str, Any], parameters: list[str]) -> StepArtifacts:
    """The step's artifacts; ``dataset`` and ``model`` only for a function that takes ``dataset_dir`` / ``model_dir``.

    (Otherwise ``dataset`` or ``model`` may be the name of one of the function's own parameters.)
    """
    artifacts = StepArtifacts.of(values)
    artifacts.dataset = values.get("dataset") if "dataset_dir" in parameters else None
    artifacts.model = values.get("model") if "model_dir" in parameters else None
    return artifacts


def _arguments(values: Mapping[str, Any], constants: Mapping[str, Any]) -> dict[str, Any]:
    """The function's ``func_args`` among a task's input values: those that differ from the function's defaults.

    So the task ``train(lr=0.1)`` of a ``def train(lr=0.01, epochs=1)`` calls ``train(**{'lr': 0.1})``
    as ``CustomTrainer(train, func_args={"lr": 0.1})`` does, and a task with every default calls
    ``train()``. Numbers get their parameter's type (KFP hands JSON numbers over: ``1.0`` for an
    ``int`` 1, ``1`` for a ``float`` 1.0).
    """
    defaults, types = constants.get("defaults") or {}, constants.get("types") or {}
    out = {}
    for name in constants.get("parameters") or []:
        if name in SPECIAL:
            continue
        value = values.get(name)
        if types.get(name) == "int" and isinstance(value, float) and value.is_integer():
            value = int(value)
        elif types.get(name) == "float" and isinstance(value, int) and not isinstance(value, bool):
            value = float(value)
        if name in defaults and value == defaults[name] and type(value) is type(defaults[name]):
            continue
        out[name] = value
    return out
