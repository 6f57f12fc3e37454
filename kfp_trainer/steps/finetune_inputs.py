"""The ``torchtune_finetune`` component's inputs: which are settings, sources and TrainJob inputs. Pure.

:func:`torchtune_settings` turns the component's flat inputs into the kubeflow SDK's
``TorchTuneConfig`` (:class:`~kfp_trainer.llm.inputs.TorchTuneSettings`), naming the component's
inputs in its errors; :func:`torchtune_finetune_arguments` sorts a task's input values into what
:func:`~kfp_trainer.steps.finetune.run_torchtune_finetune` takes; :func:`read_torchtune` reads
those arguments once -- settings, sources, dataset path, overrides -- with every problem. They
run in the step and, on literal arguments, when a pipeline is built (:mod:`.checks`).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
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
DATASET_ROOT = "/workspace/dataset"
REMOTE_SCHEMES = ("hf", "s3")
SOURCE_KINDS = ("dataset", "model")


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


def _scheme(uri: str) -> str:
    return uri.split("://", 1)[0].lower() if "://" in uri else "file"


def dataset_path_arg(path: str) -> str:
    """``dataset.data_dir``/``dataset.data_files`` for a path under ``/workspace/dataset``.

    Example:
        >>> dataset_path_arg("data"), dataset_path_arg("/workspace/dataset/train.json")
        ('dataset.data_dir=/workspace/dataset/data', 'dataset.data_files=/workspace/dataset/train.json')

    Raises:
        ValidationError: the path leaves ``/workspace/dataset`` or cannot be one override.
    """
    rel = path[len(DATASET_ROOT) :].lstrip("/") if path.startswith(DATASET_ROOT) else path
    parts = [p for p in rel.split("/") if p not in ("", ".")]
    if rel.startswith("/") or ".." in parts or any(ch in path for ch in "=,\n{}[]'\""):
        raise ValidationError("dataset_path", path, "a folder or file inside /workspace/dataset, e.g. data or train.json")
    full = "/".join([DATASET_ROOT, *parts])
    last = parts[-1] if parts else ""
    return f"dataset.data_files={full}" if "." in last else f"dataset.data_dir={full}"


def storage(kind: str, uri: str, secret: str = "", options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
    """(``StorageSource`` for the SDK renderer or None, TrainJob inputs for a local-only URI) of one source.

    Raises:
        InvalidSpecErrors: A secret or options without a URI, options for a local URI, a bad source.
    """
    from ..llm.inputs import StorageSource, parse

    if not uri:
        if options or secret:
            raise InvalidSpecErrors([ValidationError(f"{kind}_uri", "", f"a URI: {kind}_secret/{kind}_options need one")])
        return None, {}
    if _scheme(uri) in REMOTE_SCHEMES:
        return parse(StorageSource, f"{kind}_", storage_uri=uri, secret_ref=secret or None, **(options or {})), {}
    if options:
        raise InvalidSpecErrors([ValidationError(f"{kind}_options", options, f"nothing for {uri}: they apply to hf:// and s3://")])
    return None, {f"{kind}_uri": uri, **({f"{kind}_secret": secret} if secret else {})}  # builtin:// or file:// (local mode)


def extra_overrides(learning_rate: float | None, seed: int | None, overrides: list[str] | None) -> list[str]:
    """The overrides after the typed settings': ``optimizer.lr``, ``seed`` (a negative one: the runtime's), then ``overrides``.

    Example:
        >>> extra_overrides(0.001, -1, ["epochs=1"])
        ['optimizer.lr=0.001', 'epochs=1']
    """
    extra = [f"optimizer.lr={learning_rate:g}"] if learning_rate is not None else []
    return extra + ([f"seed={seed}"] if seed is not None and seed >= 0 else []) + list(overrides or [])


@dataclass
class TorchTuneArguments:
    """A fine-tune's arguments read once (:func:`read_torchtune`): what the step's trainer is made of."""

    settings: Any  # the SDK's TorchTuneConfig, None when its inputs are invalid
    sources: dict[str, tuple[str, str, dict[str, Any] | None]]  # kind -> (uri, secret, options)
    found: dict[str, Any] = field(default_factory=dict)  # kind -> StorageSource for the SDK renderer, or None
    local_inputs: dict[str, Any] = field(default_factory=dict)  # TrainJob inputs of local-only URIs
    errors: list[ValidationError] = field(default_factory=list)

    def source_inputs(self) -> dict[str, Any]:
        """The sources as the TrainJob will carry them (the initializers' URIs)."""
        out = dict(self.local_inputs)
        for kind in SOURCE_KINDS:
            out.setdefault(f"{kind}_uri", self.sources[kind][0] or None)
        return out


def read_torchtune(args: Mapping[str, Any]) -> TorchTuneArguments:
    """:func:`torchtune_finetune_arguments`' output read once: the settings, the sources, the dataset path, the overrides.

    Every problem is in ``errors``; what could be read is there even when some could not.
    """
    from ..llm.tune_output import check_overrides
    from ..spec import rules

    out = TorchTuneArguments(settings=None, sources={})
    try:
        out.settings = torchtune_settings(args.get("method", "full"), **(args.get("settings") or {}))
    except InvalidSpecErrors as e:
        out.errors += e.errors
    given = args.get("sources") or {}
    for kind in SOURCE_KINDS:
        out.sources[kind] = (given.get(f"{kind}_uri") or "", given.get(f"{kind}_secret") or "", given.get(f"{kind}_options"))
        try:
            out.found[kind], more = storage(kind, *out.sources[kind])
            out.local_inputs.update(more)
        except InvalidSpecErrors as e:
            out.errors += e.errors
    if args.get("dataset_path"):
        try:
            dataset_path_arg(args["dataset_path"])
        except ValidationError as e:
            out.errors.append(e)
    out.errors += check_overrides(extra_overrides(args.get("learning_rate"), args.get("seed"), args.get("overrides")), [])
    if isinstance(args.get("overrides"), list):
        out.errors += rules.check_args("overrides", args["overrides"])
    prompt = (args.get("settings") or {}).get("system_prompt")
    out.errors += rules.check_secret_text("system_prompt", prompt) if isinstance(prompt, str) else []
    return out
