"""Run-time work of the ``trl_finetune`` component: TRL's SFT or DPO in a TrainJob of a TRL runtime.

The TrainJob runs on a runtime labelled ``trainer.kubeflow.org/framework: trl`` (the project's
``kfp-trainer-trl``, :mod:`kfp_trainer.llm.trl_runtime`), whose node runs the trainer program
:mod:`kfp_trainer.trainers.trl_train`; the TrainJob carries only its arguments, the settings
rendered as KEP-626's ``TRLConfig.to_args()`` renders them plus the model, dataset and output
folders. The step builds on :func:`~kfp_trainer.steps.train_job.run_train_job`:

* **Model and dataset** come as artifacts (``model_initializer``/``dataset_initializer``
  outputs, or another step's model: DPO after SFT) or as URIs the step fetches itself (the
  storage schemes of :mod:`kfp_trainer.storage`; credentials from the task's env, e.g.
  ``kfp.kubernetes.use_secret_as_env``). On a cluster they are staged on the pipeline
  workspace, which the TrainJob's pods mount.
* **A retried step resumes.** The trainer writes checkpoints into its output folder, which on a
  cluster lies on the workspace under a name a retry of the step keeps: the retry's TrainJob
  resumes from the newest, and the report and the model's metadata say from which step.
* **The model** (full weights, or the merged model with the LoRA adapter in ``adapter/``; a
  QLoRA adapter alone) becomes the output ``dsl.Model`` with its metadata: base model, method,
  weights, format, TrainJob, runtime, the settings.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace
from typing import Any

from ..errors import InvalidSpecErrors, ValidationError
from .common import log


class TRLFinetune:
    """A :class:`~kfp_trainer.steps.train_job.TypedTrainer` for TRL runtimes (see the module docstring)."""

    def __init__(self, settings: Any, *, sources: dict[str, str] | None = None, merge_adapter: bool = True) -> None:
        self.settings = settings
        self.sources = dict(sources or {})
        self.merge_adapter = merge_adapter

    def identity(self) -> dict[str, Any]:
        """Everything that changes what is trained."""
        return {"settings": self.settings.summary(), "sources": self.sources, "merge_adapter": self.merge_adapter}

    def configure(self, ctx: Any) -> dict[str, Any]:
        """The TrainJob's arguments for the runtime, once it is known to be a TRL runtime."""
        from ..llm.trl_runtime import FRAMEWORK, FRAMEWORK_LABEL, RUNTIME_NAME, is_trl

        document = getattr(ctx.runtime, "document", None) or {}
        if not is_trl(document):
            found = ((document.get("metadata") or {}).get("labels") or {}).get(FRAMEWORK_LABEL, "")
            raise InvalidSpecErrors([ValidationError(
                "runtime", ctx.inputs.get("runtime"),
                f"a runtime labelled {FRAMEWORK_LABEL}: {FRAMEWORK} (e.g. {RUNTIME_NAME}, deploy/trl-runtime.yaml); "
                f"this one is labelled {found or 'with no framework'}",
            )])  # fmt: skip
        missing = [ValidationError(k, None, f"a {k} artifact or {k}_uri") for k in ("model", "dataset") if getattr(ctx, k) is None]
        if missing:
            raise InvalidSpecErrors(missing)
        if self.settings.load_in_4bit and ctx.local:
            _check_local_qlora()
        folders = ["--model_name_or_path", "{model}", "--dataset_name", "{dataset}", "--output_dir", "{output_model}"]
        args = self.settings.to_args() + folders
        if self.settings.adapter and not self.merge_adapter:
            args += ["--merge_adapter", "false"]
        ctx.report["TRL"] = f"{self.settings.method.upper()} ({'LoRA adapter' if self.settings.adapter else 'full weights'}"
        ctx.report["TRL"] += f"{', 4-bit base' if self.settings.load_in_4bit else ''}): {' '.join(self.settings.to_args())}"
        ctx.metadata.update(method=self.settings.method, trainer="trl", trl_settings=json.dumps(self.settings.summary(), sort_keys=True))
        return {"args": args}

    def finalize(self, ctx: Any, paths: dict[str, str]) -> dict[str, Any]:
        """Nothing more: the paths are in the arguments."""
        return {}

    def before_launch(self, ctx: Any) -> None:
        """Nothing to create: the launcher makes the output folder."""

    def collect(self, ctx: Any, outcome: Any) -> None:
        """The trainer's ``training_info.json`` into the model's metadata and the report."""
        info_file = Path(ctx.output_model.path) / "training_info.json"
        info = json.loads(info_file.read_text()) if info_file.is_file() else {}
        if info.get("resumed_from_step"):
            ctx.report["resumed"] = f"from the checkpoint at step {info['resumed_from_step']} of an earlier try"
        ctx.metadata.update(method=info.get("method", self.settings.method), merged_model=bool(info.get("merged_model")))
        if info.get("weights") == "adapter":
            ctx.metadata["weights"] = "adapter"  # what was trained; a merged model is there too when merged_model


def _check_local_qlora() -> None:
    import importlib.util

    problems = []
    if importlib.util.find_spec("bitsandbytes") is None:
        problems.append("the bitsandbytes package")
    try:
        import torch

        if not torch.cuda.is_available():
            problems.append("CUDA (a GPU)")
    except ImportError:
        problems.append("torch")
    if problems:
        raise InvalidSpecErrors([ValidationError(
            "load_in_4bit", True, f"false on this machine: QLoRA needs {' and '.join(problems)}; train a LoRA adapter (use_peft) instead",
        )])  # fmt: skip


def _fetched(kind: str, uri: str, where: Path) -> Any:
    """``uri`` fetched into ``where``, as an artifact-like object the launcher stages like any input."""
    from ..storage import fetch, redact

    log(f"fetching {kind} {redact(uri)}")
    info = fetch(uri, where, kind=kind)
    log(f"fetched {info['files']} files, {info['bytes']} bytes")
    return SimpleNamespace(path=str(where), uri=str(where), metadata={"source_uri": info.get("source_uri", redact(uri))})


_SETTINGS = (
    "learning_rate", "per_device_train_batch_size", "num_train_epochs", "max_steps", "bf16", "use_peft", "lora_r",
    "lora_alpha", "lora_dropout", "lora_target_modules", "load_in_4bit", "beta", "max_length", "save_steps",
    "logging_steps", "seed",
)  # fmt: skip
_JOB_INPUTS = (
    "runtime", "runtime_kind", "num_nodes", "num_proc_per_node", "resources_per_node", "name", "name_prefix", "namespace",
    "run_id", "task_name", "task_id", "pipeline_name", "labels", "pod_labels", "pod_annotations", "node_selector",
    "tolerations", "service_account", "active_deadline_seconds", "queue_name", "priority_class",
)  # fmt: skip


def trl_arguments(values: dict[str, Any]) -> dict[str, Any]:
    """The ``trl_finetune`` component's inputs sorted into :func:`run_trl_finetune`'s arguments.

    ``values`` are the component's inputs by name; 0 / False for an unset setting or TrainJob
    input become ``None`` (TRL's or the runtime's default). Used by the component and by the
    check run when a pipeline is built, so both read the inputs the same way.

    Example:
        >>> trl_arguments({"method": "dpo", "beta": 0.1, "use_peft": False, "num_nodes": 0})["settings"]
        {'use_peft': None, 'beta': 0.1}
    """
    settings = {k: values[k] for k in _SETTINGS if k in values}
    for flag in ("use_peft", "load_in_4bit"):
        if flag in settings:
            settings[flag] = settings[flag] or None
    inputs = {k: values[k] for k in _JOB_INPUTS if k in values}
    for name in ("num_nodes", "active_deadline_seconds"):
        if name in inputs:
            inputs[name] = inputs[name] or None
    return {
        "method": values.get("method", "sft"), "settings": settings, "extra_args": values.get("extra_args"),
        "merge_adapter": values.get("merge_adapter", True), "dataset_uri": values.get("dataset_uri") or "",
        "model_uri": values.get("model_uri") or "", "inputs": inputs,
    }  # fmt: skip


def run_trl_finetune(
    *,
    method: str,
    settings: dict[str, Any],
    extra_args: list[str] | None = None,
    merge_adapter: bool = True,
    dataset_uri: str = "",
    model_uri: str = "",
    dataset: Any = None,
    model: Any = None,
    **launch: Any,
) -> Any:
    """Run the ``trl_finetune`` component: check the settings, fetch URI sources, then one TrainJob.

    Args:
        method: ``sft`` or ``dpo``.
        settings: The component's TRL inputs (:func:`~kfp_trainer.llm.trl_config.trl_settings`).
        extra_args: More TRL flags.
        merge_adapter: LoRA: save the merged model at the top and the adapter in ``adapter/``.
        dataset_uri: Dataset to fetch when no ``dataset`` artifact is given.
        model_uri: Model to fetch when no ``model`` artifact is given.
        dataset: The dataset artifact, or ``None``.
        model: The model artifact, or ``None``.
        **launch: What :func:`~kfp_trainer.steps.train_job.run_train_job` takes besides ``trainer``.

    Returns:
        The launcher's ``Outcome``.
    """
    from ..llm.trl_config import trl_settings
    from .train_job import run_train_job

    checked = trl_settings(method=method, extra_args=extra_args, **settings)
    errors = []
    for kind, artifact, uri in (("dataset", dataset, dataset_uri), ("model", model, model_uri)):
        if artifact is not None and uri:
            errors.append(ValidationError(f"{kind}_uri", uri, f"nothing when the {kind} artifact is given (one source per input)"))
        elif artifact is None and not uri:
            errors.append(ValidationError(kind, None, f"a {kind} artifact (e.g. {kind}_initializer's output) or {kind}_uri"))
    if errors:
        raise InvalidSpecErrors(errors)
    output = Path(launch["output_model"].path)
    sources = {"dataset_uri": dataset_uri, "model_uri": model_uri}
    if dataset is None:
        dataset = _fetched("dataset", dataset_uri, output.with_name(output.name + ".trl-dataset"))
    if model is None:
        model = _fetched("model", model_uri, output.with_name(output.name + ".trl-model"))
    trainer = TRLFinetune(checked, sources={k: v for k, v in sources.items() if v}, merge_adapter=merge_adapter)
    return run_train_job(trainer=trainer, dataset=dataset, model=model, **launch)
