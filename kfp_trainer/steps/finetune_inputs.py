"""The ``torchtune_finetune`` component's inputs: which are settings, sources and TrainJob inputs. Pure.

:func:`torchtune_settings` turns the component's flat inputs into the kubeflow SDK's
``TorchTuneConfig`` (:class:`~kfp_trainer.llm.inputs.TorchTuneSettings`), naming the component's
inputs in its errors; :func:`torchtune_finetune_arguments` sorts a task's input values into what
:func:`~kfp_trainer.steps.finetune.run_torchtune_finetune` takes. Both run in the step and, on
literal arguments, when a pipeline is built (:mod:`.checks`).
"""

from __future__ import annotations

from typing import Any

from ..errors import InvalidSpecErrors, ValidationError

# Component input -> (settings section, SDK field name).
_LORA_INPUTS = {
    "lora_rank": "lora_rank", "lora_alpha": "lora_alpha", "lora_dropout": "lora_dropout", "lora_target_modules": "lora_attn_modules",
    "lora_apply_to_mlp": "apply_lora_to_mlp", "lora_apply_to_output": "apply_lora_to_output", "use_dora": "use_dora",
    "quantize_base": "quantize_base",
}  # fmt: skip
_DATASET_INPUTS = {
    "dataset_source": "source", "dataset_split": "split", "train_on_input": "train_on_input", "system_prompt": "new_system_prompt",
    "column_map": "column_map",
}  # fmt: skip
_TOP_INPUTS = ("dtype", "batch_size", "epochs", "loss", "num_nodes", "resources_per_node")
METHODS = ("full", "lora", "qlora")


def torchtune_settings(method: str = "full", **inputs: Any) -> Any:
    """The SDK's ``TorchTuneConfig`` from the component's flat inputs (``None`` = the runtime's config value).

    ``method`` is ``full``, ``lora`` or ``qlora`` (LoRA on a 4-bit quantized base, the SDK's
    ``quantize_base=True``); the LoRA inputs apply to the last two only. ``quantize_base=False``
    with ``lora`` sends the SDK's explicit ``model.quantize_base=False``. Errors name the
    component's inputs.

    Example:
        >>> s = torchtune_settings("lora", epochs=2, lora_rank=8, dataset_source="parquet")
        >>> (s.epochs, s.peft_config.lora_rank, s.dataset_preprocess_config.source)
        (2, 8, 'parquet')
        >>> torchtune_settings("full", lora_rank=8)
        Traceback (most recent call last):
        ...
        kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
          - lora_rank: got 8; expected nothing with method='full' (set method='lora' or 'qlora')
    """
    from ..llm.inputs import TorchTuneSettings, parse

    inputs = {k: (None if v == "" else v) for k, v in inputs.items()}  # a pipeline's "" means: the runtime's value
    unknown = sorted(set(inputs) - set(_LORA_INPUTS) - set(_DATASET_INPUTS) - set(_TOP_INPUTS))
    if unknown:
        raise TypeError(f"unknown torchtune inputs: {unknown}")
    errors: list[ValidationError] = []
    if method not in METHODS:
        errors.append(ValidationError("method", method, " or ".join(METHODS)))
    lora = {sdk: inputs[name] for name, sdk in _LORA_INPUTS.items() if inputs.get(name) is not None}
    alpha = lora.get("lora_alpha")
    if isinstance(alpha, float) and alpha.is_integer():  # KFP hands a float input over as 16.0; the SDK writes 16
        lora["lora_alpha"] = int(alpha)
    if method == "full":
        errors += [ValidationError(n, inputs[n], "nothing with method='full' (set method='lora' or 'qlora')") for n in _LORA_INPUTS
                   if inputs.get(n) is not None]  # fmt: skip
    quantize = lora.get("quantize_base")
    if method == "lora" and quantize is True:
        errors.append(ValidationError("quantize_base", True, "False or unset with method='lora' (method='qlora' quantizes the base)"))
    if method == "qlora" and quantize is False:
        errors.append(ValidationError("quantize_base", False, "True or unset with method='qlora' (method='lora' leaves the base as it is)"))
    if errors:
        raise InvalidSpecErrors(errors)
    values: dict[str, Any] = {k: inputs.get(k) for k in _TOP_INPUTS}
    if method in ("lora", "qlora"):
        values["peft_config"] = {**lora, **({"quantize_base": True} if method == "qlora" else {})}
    pre = {sdk: inputs[name] for name, sdk in _DATASET_INPUTS.items() if inputs.get(name) is not None}
    if pre:
        values["dataset_preprocess_config"] = pre
    names = {f"peft_config.{sdk}": n for n, sdk in _LORA_INPUTS.items()}
    names.update({f"dataset_preprocess_config.{sdk}": n for n, sdk in _DATASET_INPUTS.items()})
    try:
        return parse(TorchTuneSettings, **values)
    except InvalidSpecErrors as e:
        renamed = [ValidationError(_rename(err.field, names), err.value, err.allowed) for err in e.errors]
        raise InvalidSpecErrors(renamed) from None


def _rename(field: str, names: dict[str, str]) -> str:
    for prefix, name in names.items():
        if field == prefix or field.startswith(prefix + "."):
            return name + field[len(prefix) :]
    return field


_SOURCE_INPUTS = ("dataset_uri", "dataset_secret", "dataset_options", "model_uri", "model_secret", "model_options")
_JOB_INPUTS = (
    "runtime", "runtime_kind", "name", "name_prefix", "namespace", "run_id", "task_name", "task_id", "pipeline_name", "labels",
    "pod_labels", "pod_annotations", "node_selector", "tolerations", "service_account", "active_deadline_seconds", "queue_name",
    "priority_class",
)  # fmt: skip
_ZERO_UNSET = ("batch_size", "epochs", "num_nodes", "lora_rank", "active_deadline_seconds")  # 0 means: the runtime's value


def torchtune_finetune_arguments(values: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_torchtune_finetune`'s arguments (launch options left out) from a ``torchtune_finetune`` task's input values.

    The component passes its ``locals()``; the same mapping checks literal arguments when a
    pipeline is built.

    Example:
        >>> args = torchtune_finetune_arguments({"method": "lora", "epochs": 0, "lora_rank": 8, "runtime": "r", "model_uri": "hf://a/b"})
        >>> args["settings"]["epochs"], args["settings"]["lora_rank"], args["sources"]["model_uri"], args["inputs"]["runtime"]
        (None, 8, 'hf://a/b', 'r')
    """

    def get(name: str) -> Any:
        value = values.get(name)
        return None if name in _ZERO_UNSET and value == 0 else value

    return {
        "method": values.get("method", "full"),
        "settings": {name: get(name) for name in (*_TOP_INPUTS, *_LORA_INPUTS, *_DATASET_INPUTS)},
        "sources": {name: values.get(name) for name in _SOURCE_INPUTS},
        "inputs": {name: get(name) for name in _JOB_INPUTS},
        "dataset_path": values.get("dataset_path"),
        "learning_rate": values.get("learning_rate"),
        "seed": values.get("seed"),
        "overrides": values.get("overrides"),
    }
