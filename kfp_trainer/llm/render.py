"""Settings -> the TrainJob inputs that render to what the kubeflow SDK 0.5.0 creates for the same ``train()`` call. Pure.

``TrainerClient().train(runtime, initializer, trainer)`` fills three parts of ``spec``:
``runtimeRef`` (name and kind), ``trainer`` and ``initializer``. :func:`render_builtin` gives
the TrainJob inputs (``runtime``, ``command``, ``args``, ``num_nodes``, ``resources_per_node``,
``dataset_uri``, ...) for ``BuiltinTrainer(config=TorchTuneConfig(...))`` and
:func:`kfp_trainer.custom_trainer.render_function` for ``CustomTrainer(func=...)``; the one renderer
(:func:`kfp_trainer.spec.render`) turns them into those parts field for field and value for
value, so a job moved from the SDK into a pipeline runs the same. Checks come first: the runtime must be of the right kind
(torchtune for BuiltinTrainer, anything else for functions) and the TrainJob must pass the
Trainer v2.3 webhook's torchtune rules (supported model, node count, QLoRA limits).

Example:
    >>> from kfp_trainer.llm.inputs import TorchTuneSettings, LoraSettings, StorageSource
    >>> rt = {"kind": "ClusterTrainingRuntime",
    ...       "metadata": {"name": "torchtune-llama3.2-1b", "labels": {"trainer.kubeflow.org/framework": "torchtune"}},
    ...       "spec": {"mlPolicy": {"numNodes": 1, "torch": {}}, "template": {"spec": {"replicatedJobs": [
    ...           {"name": "node", "template": {"metadata": {"labels": {"trainer.kubeflow.org/trainjob-ancestor-step": "trainer"}},
    ...            "spec": {"template": {"spec": {"containers": [{"name": "node", "image": "tt", "command": ["tune", "run"],
    ...                "resources": {"limits": {"nvidia.com/gpu": 2}}}]}}}}}]}}}}
    >>> out = render_builtin(rt, TorchTuneSettings(epochs=2, peft_config=LoraSettings(lora_rank=8)),
    ...                      dataset=StorageSource(storage_uri="hf://tatsu-lab/alpaca/data"))
    >>> out.inputs["args"]
    ['epochs=2', 'dataset.data_dir=/workspace/dataset/data', 'model.lora_rank=8', 'model.lora_attn_modules=[q_proj,v_proj,output_proj]']
    >>> (out.recipe, out.config, out.adapter)
    ('lora_finetune_distributed', 'llama3_2/1B_lora', True)
"""

from __future__ import annotations

import copy
import posixpath
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlparse

from kfp_trainer.errors import InvalidSpecErrors, ValidationError
from kfp_trainer.spec.resources import MIG_PREFIX, flat_names, is_requirements

from .inputs import MODEL_IGNORE_PATTERNS, StorageSource, TorchTuneSettings
from .runtimes import FRAMEWORK_LABEL, TORCHTUNE, TORCHTUNE_ENTRYPOINT, RuntimeTrainer
from .tune_command import gpus_in, node_shape, recipe_and_config, uses_lora, uses_qlora, webhook_errors

DATASET_PATH = "/workspace/dataset"
INSTRUCT_DATASET = "torchtune.datasets.instruct_dataset"


@dataclass(frozen=True)
class Rendered:
    """The TrainJob inputs of an SDK ``train()`` call, and what the fine-tune will produce (torchtune only).

    ``recipe``/``config`` are what the Trainer controller will run; ``adapter`` is True when
    the output is a LoRA adapter (alongside the merged model), False for full weights.
    """

    inputs: dict[str, Any]
    recipe: str | None = None
    config: str | None = None
    adapter: bool = False

    def sdk_spec(self) -> dict[str, Any]:
        """The ``spec`` parts the SDK writes (``runtimeRef``, ``trainer``, ``initializer``), by the one renderer.

        Example:
            >>> Rendered({"runtime": "torch-distributed", "command": ["python", "t.py"]}).sdk_spec()["trainer"]
            {'command': ['python', 't.py']}
        """
        from kfp_trainer.spec import TrainJobInputs, render

        manifest = render(TrainJobInputs.parse(**self.inputs, run_id="sdk", task_name="train"))
        return {k: v for k, v in manifest["spec"].items() if k in ("runtimeRef", "trainer", "initializer")}


def resources_per_node(resources: dict[str, Any]) -> dict[str, Any]:
    """The SDK's ``resources_per_node`` mapping: aliases (gpu, storage, mig-*), requests = limits.

    A ResourceRequirements dict (``{"limits": {...}}``) is taken as it is.

    Example:
        >>> resources_per_node({"CPU": 4, "GPU": 1})
        {'requests': {'cpu': 4, 'nvidia.com/gpu': 1}, 'limits': {'cpu': 4, 'nvidia.com/gpu': 1}}
        >>> resources_per_node({"limits": {"nvidia.com/gpu": 2}})
        {'limits': {'nvidia.com/gpu': 2}}

    Raises:
        ValidationError: more than one MIG profile, or GPUs and MIG slices together.
    """
    if is_requirements(resources):
        return copy.deepcopy(resources)
    out = flat_names(resources)
    mig = [k for k in out if k.startswith(MIG_PREFIX)]
    if len(mig) > 1:
        raise ValidationError("resources_per_node", resources, f"at most one MIG profile, not {mig}")
    if mig and "nvidia.com/gpu" in out:
        raise ValidationError("resources_per_node", resources, f"either nvidia.com/gpu or a MIG slice ({mig[0]}), not both")
    return {"requests": dict(out), "limits": dict(out)}


def _initializer_env(source: StorageSource, *, model: bool) -> list[dict[str, str]]:
    """Optional initializer settings as env, in the SDK's field order (secrets only by reference)."""
    patterns = source.ignore_patterns
    if patterns is None and model and "ignore_patterns" not in source.model_fields_set:  # the SDK's default; None given: none
        patterns = list(MODEL_IGNORE_PATTERNS)
    values: list[tuple[str, Any]] = [("IGNORE_PATTERNS", None if patterns is None else ",".join(patterns))]
    if source.scheme == "s3":
        values += [("ENDPOINT", source.endpoint), ("REGION", source.region), ("ROLE_ARN", source.role_arn)]
    return [{"name": k, "value": v} for k, v in values if v is not None]


def initializer_inputs(dataset: StorageSource | None, model: StorageSource | None) -> dict[str, Any]:
    """``dataset_uri``/``dataset_env``/``dataset_secret`` and the same for ``model`` (credentials only by reference).

    Example:
        >>> initializer_inputs(StorageSource(storage_uri="hf://org/data"), None)
        {'dataset_uri': 'hf://org/data', 'dataset_env': []}
    """
    out: dict[str, Any] = {}
    for key, source in (("dataset", dataset), ("model", model)):
        if source is None:
            continue
        out[f"{key}_uri"] = source.storage_uri
        out[f"{key}_env"] = _initializer_env(source, model=key == "model")
        if source.secret_ref:
            out[f"{key}_secret"] = source.secret_ref
    return out


def _hf_dataset_arg(uri: str) -> str:
    """``dataset.data_dir``/``dataset.data_files`` for the files an ``hf://`` dataset put in /workspace/dataset."""
    parts = urlparse(uri).path.strip("/").split("/")
    relative = "/".join(parts[1:]) if len(parts) > 1 else "."
    if relative != "." and "." in relative:
        return f"dataset.data_files={posixpath.join(DATASET_PATH, relative)}"
    return f"dataset.data_dir={posixpath.join(DATASET_PATH, relative)}"


def torchtune_args(settings: TorchTuneSettings, dataset: StorageSource | None = None) -> list[str]:
    """The ``tune run`` overrides (``spec.trainer.args``), in the SDK's order and spelling.

    Example:
        >>> from kfp_trainer.llm.inputs import InstructDatasetSettings
        >>> torchtune_args(TorchTuneSettings(dtype="bf16", dataset_preprocess_config=InstructDatasetSettings(
        ...     source="json", column_map={"input": "question"})))
        ['dtype=bf16', 'dataset=torchtune.datasets.instruct_dataset', 'dataset.source=json', "dataset.column_map={'input': 'question'}"]
    """
    s = settings
    args = [f"{k}={v}" for k, v in (("dtype", s.dtype), ("batch_size", s.batch_size), ("epochs", s.epochs), ("loss", s.loss)) if v]
    if dataset is not None and dataset.scheme == "hf":
        args.append(_hf_dataset_arg(dataset.storage_uri))
    lora = s.peft_config
    if lora is not None:
        for name in ("apply_lora_to_mlp", "apply_lora_to_output", "lora_rank", "lora_alpha", "lora_dropout", "quantize_base", "use_dora"):
            value = getattr(lora, name)
            if value is not None:
                args.append(f"model.{name}={value}")
        if lora.lora_attn_modules:
            args.append(f"model.lora_attn_modules=[{','.join(lora.lora_attn_modules)}]")
    pre = s.dataset_preprocess_config
    if pre is not None:
        args.append(f"dataset={INSTRUCT_DATASET}")
        if pre.source:
            args.append(f"dataset.source={pre.source}")
        if pre.split:
            args.append(f"dataset.split={pre.split}")
        if pre.train_on_input is not None:
            args.append(f"dataset.train_on_input={pre.train_on_input}")
        if pre.new_system_prompt:
            args.append(f"dataset.new_system_prompt={pre.new_system_prompt}")
        if pre.column_map:
            args.append(f"dataset.column_map={pre.column_map}")
    return args


def runtime_trainer(runtime: dict[str, Any] | RuntimeTrainer) -> RuntimeTrainer:
    """The trainer side of a runtime object (or the one given), its problems as :class:`InvalidSpecErrors`."""
    if isinstance(runtime, RuntimeTrainer):
        return runtime
    try:
        return RuntimeTrainer.from_runtime(runtime)
    except ValidationError as e:
        raise InvalidSpecErrors([e]) from None


def render_builtin(
    runtime: dict[str, Any] | RuntimeTrainer,
    settings: TorchTuneSettings,
    *,
    dataset: StorageSource | None = None,
    model: StorageSource | None = None,
) -> Rendered:
    """The TrainJob inputs of ``train(runtime, Initializer(dataset, model), BuiltinTrainer(TorchTuneConfig(...)))``.

    Raises:
        InvalidSpecErrors: the runtime is not a torchtune runtime, or the Trainer's webhook would
            refuse the job (each problem with its field, value and what is allowed).
    """
    rt = runtime_trainer(runtime)
    if not rt.is_torchtune:
        raise InvalidSpecErrors(
            [
                ValidationError(
                    "runtime",
                    rt.name,
                    f"a torchtune runtime ({FRAMEWORK_LABEL}: {TORCHTUNE}); {rt.name} is a {rt.framework} runtime,"
                    " which runs a training function instead",
                )
            ]
        )
    errors: list[ValidationError] = []
    job: dict[str, Any] = {"runtime": rt.name, "runtime_kind": rt.kind}
    if settings.num_nodes:
        job["num_nodes"] = settings.num_nodes
    if settings.resources_per_node:
        try:
            job["resources_per_node"] = resources_per_node(settings.resources_per_node)
        except ValidationError as e:
            errors.append(e)
    args = torchtune_args(settings, dataset)
    job.update(command=list(TORCHTUNE_ENTRYPOINT), args=args)
    gpus = gpus_in(job.get("resources_per_node", rt.resources))
    refused = webhook_errors(rt.name, args, num_nodes=settings.num_nodes or 1, num_proc_per_node="auto", gpus_per_node=gpus)
    errors += [ValidationError(f, v, a) for f, v, a in refused]
    if errors:
        raise InvalidSpecErrors(errors)
    shape = {"numNodes": job.get("num_nodes"), "resourcesPerNode": job.get("resources_per_node")}
    nodes, nproc, gpus = node_shape(runtime_resources=rt.resources, runtime_num_nodes=rt.num_nodes, job_trainer=shape)
    recipe, config = recipe_and_config(rt.name, args, num_nodes=nodes, num_proc_per_node=nproc, gpus_per_node=gpus)
    job.update(initializer_inputs(dataset, model))
    return Rendered(inputs=job, recipe=recipe, config=config, adapter=uses_lora(args) or uses_qlora(args))
