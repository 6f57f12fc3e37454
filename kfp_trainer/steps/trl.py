"""Run-time work of the ``trl_finetune`` component: TRL's SFT, DPO or GRPO in a TrainJob of a TRL runtime.

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
* **GRPO** is checked further before any TrainJob exists: the dataset must have the ``prompt``
  column and every column the rewards read, and the generation batch (with the world size, once
  the runtime is read) must hold whole groups of ``num_generations``. Its sampled completions
  with their rewards go to the report and, as ``completions.jsonl``, to the step's MLflow run.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from types import SimpleNamespace
from typing import TYPE_CHECKING, Any

from ..errors import InvalidSpecErrors, ValidationError
from .arguments import trl_arguments  # noqa: F401 - also imported from here
from .common import log
from .step_types import StepArtifacts, StepOptions, TrainerContext, TypedTrainer
from .train_job import run_train_job

if TYPE_CHECKING:
    from ..backends.base import RuntimeInfo
    from ..cancel import Stop
    from ..spec import TrainJobInputs


class TRLFinetune(TypedTrainer):
    """A :class:`~kfp_trainer.steps.step_types.TypedTrainer` for TRL runtimes (see the module docstring)."""

    def __init__(self, settings: Any, *, sources: dict[str, str] | None = None, merge_adapter: bool = True) -> None:
        self.settings = settings
        self.sources = dict(sources or {})
        self.merge_adapter = merge_adapter

    def identity(self) -> dict[str, Any]:
        """Everything that changes what is trained."""
        return {"settings": self.settings.summary(), "sources": self.sources, "merge_adapter": self.merge_adapter}

    def configure(self, ctx: TrainerContext, runtime: RuntimeInfo, inputs: TrainJobInputs) -> dict[str, Any]:
        """The TrainJob's arguments for the runtime, once it is known to be a TRL runtime."""
        from ..llm.trl_runtime import FRAMEWORK, FRAMEWORK_LABEL, RUNTIME_NAME, is_trl

        document = runtime.document
        if not is_trl(document):
            found = ((document.get("metadata") or {}).get("labels") or {}).get(FRAMEWORK_LABEL, "")
            raise InvalidSpecErrors([ValidationError(
                "runtime", inputs.runtime,
                f"a runtime labelled {FRAMEWORK_LABEL}: {FRAMEWORK} (e.g. {RUNTIME_NAME}, deploy/trl-runtime.yaml); "
                f"this one is labelled {found or 'with no framework'}",
            )])  # fmt: skip
        missing = [ValidationError(k, None, f"a {k} artifact or {k}_uri") for k in ("model", "dataset") if getattr(ctx, k) is None]
        if missing:
            raise InvalidSpecErrors(missing)
        if self.settings.load_in_4bit and ctx.local:
            _check_local_qlora()
        if self.settings.method == "grpo":
            from ..llm.trl_config import grpo_batch_errors

            batch = grpo_batch_errors(self.settings, _world_size(runtime, inputs))
            if batch:
                raise InvalidSpecErrors(batch)
        folders = ["--model_name_or_path", "{model}", "--dataset_name", "{dataset}", "--output_dir", "{output_model}"]
        args = self.settings.to_args() + folders
        if self.settings.adapter and not self.merge_adapter:
            args += ["--merge_adapter", "false"]
        ctx.report["TRL"] = f"{self.settings.method.upper()} ({'LoRA adapter' if self.settings.adapter else 'full weights'}"
        ctx.report["TRL"] += f"{', 4-bit base' if self.settings.load_in_4bit else ''}): {' '.join(self.settings.to_args())}"
        ctx.metadata.update(method=self.settings.method, trainer="trl", trl_settings=json.dumps(self.settings.summary(), sort_keys=True))
        return {"args": args}

    def collect(self, ctx: TrainerContext, outcome: Any) -> None:
        """The trainer's ``training_info.json`` into the model's metadata and the report."""
        info_file = Path(ctx.output_model.path) / "training_info.json"
        info = json.loads(info_file.read_text()) if info_file.is_file() else {}
        if info.get("resumed_from_step"):
            ctx.report["resumed"] = f"from the checkpoint at step {info['resumed_from_step']} of an earlier try"
        ctx.metadata.update(method=info.get("method", self.settings.method), merged_model=bool(info.get("merged_model")))
        if info.get("weights") == "adapter":
            ctx.metadata["weights"] = "adapter"  # what was trained; a merged model is there too when merged_model
        samples_file = Path(ctx.output_model.path) / "completions.jsonl"
        if self.settings.method == "grpo" and samples_file.is_file():
            _completions_table(ctx, samples_file)


def _completions_table(ctx: TrainerContext, samples_file: Path) -> None:
    """GRPO's last scored batch: a table in the report, the file in the step's MLflow run."""
    samples = [json.loads(line) for line in samples_file.read_text().splitlines() if line.strip()]
    names = sorted({name for sample in samples for name in sample.get("rewards", {})})
    rows = [[sample.get("prompt", ""), sample.get("completion", ""), *(sample.get("rewards", {}).get(n, "") for n in names)]
            for sample in samples]  # fmt: skip
    note = "The last batch the trainer scored, with each reward's value (completions.jsonl in the model folder)."
    ctx.tables.append({"title": "Sampled completions", "headers": ["prompt", "completion", *names], "rows": rows, "note": note})
    ctx.tracked_files["completions.jsonl"] = str(samples_file)


def _world_size(runtime: RuntimeInfo, inputs: TrainJobInputs) -> int | None:
    """Processes over all nodes, when known before the job runs (``auto`` without GPUs is one per node)."""
    from ..dicts import dig

    nodes = dict(runtime.replicated_jobs).get("node")
    procs: Any = getattr(inputs, "num_proc_per_node", None)
    if procs in (None, ""):
        procs = dig(runtime.document, "spec", "mlPolicy", "torch", "numProcPerNode")
    if procs in (None, "", "auto"):
        resources = getattr(inputs, "resources_per_node", None) or {}
        sections = (resources, resources.get("limits") or {}, resources.get("requests") or {}) if isinstance(resources, dict) else ()
        wanted = [key for section in sections for key in section]  # flat ({"gpu": 1}) or ResourceRequirements
        if any("gpu" in str(k) for k in wanted):
            return None  # torchrun's auto: one process per GPU, which the nodes report only when they run
        procs = 1
    try:
        return int(nodes) * int(procs) if nodes else None
    except (TypeError, ValueError):
        return None


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


def _check_prompts(settings: Any, dataset: str) -> None:
    """GRPO's dataset has the prompt column and what the rewards read, before any TrainJob exists."""
    from ..data import DatasetError
    from ..llm.rewards import check_rewards, prompt_records

    try:
        prompt_records(dataset, "train", check_rewards(settings.rewards), log=lambda line: log(f"dataset: {line}"))
    except DatasetError as e:
        raise InvalidSpecErrors([ValidationError("dataset", Path(dataset).name, f"a prompt dataset for GRPO: {e}")]) from None


def _fetched(kind: str, uri: str, where: Path) -> Any:
    """``uri`` fetched into ``where``, as an artifact-like object the launcher stages like any input."""
    from ..storage import fetch, redact

    log(f"fetching {kind} {redact(uri)}")
    info = fetch(uri, where, kind=kind)
    log(f"fetched {info['files']} files, {info['bytes']} bytes")
    return SimpleNamespace(path=str(where), uri=str(where), metadata={"source_uri": info.get("source_uri", redact(uri))})


def run_trl_finetune(
    *,
    method: str,
    settings: dict[str, Any],
    inputs: dict[str, Any],
    artifacts: StepArtifacts,
    options: StepOptions,
    extra_args: list[str] | None = None,
    merge_adapter: bool = True,
    dataset_uri: str = "",
    model_uri: str = "",
    stop: Stop | None = None,
) -> Any:
    """Run the ``trl_finetune`` component: check the settings, fetch URI sources, then one TrainJob.

    Args:
        method: ``sft`` or ``dpo``.
        settings: The component's TRL inputs (:func:`~kfp_trainer.llm.trl_config.trl_settings`).
        inputs: The TrainJob inputs (runtime, nodes, names, labels, scheduling, ...).
        artifacts: The step's artifacts; ``dataset`` and ``model`` are the input artifacts, or ``None``.
        options: The launcher's own inputs.
        extra_args: More TRL flags.
        merge_adapter: LoRA: save the merged model at the top and the adapter in ``adapter/``.
        dataset_uri: Dataset to fetch when no ``dataset`` artifact is given.
        model_uri: Model to fetch when no ``model`` artifact is given.
        stop: The step's stop token.

    Returns:
        The launcher's ``Outcome``.
    """
    from ..llm.trl_config import trl_settings

    checked = trl_settings(method=method, extra_args=extra_args, **settings)
    errors = []
    for kind, artifact, uri in (("dataset", artifacts.dataset, dataset_uri), ("model", artifacts.model, model_uri)):
        if artifact is not None and uri:
            errors.append(ValidationError(f"{kind}_uri", uri, f"nothing when the {kind} artifact is given (one source per input)"))
        elif artifact is None and not uri:
            errors.append(ValidationError(kind, None, f"a {kind} artifact (e.g. {kind}_initializer's output) or {kind}_uri"))
    if errors:
        raise InvalidSpecErrors(errors)
    output = Path(artifacts.output_model.path)
    sources = {"dataset_uri": dataset_uri, "model_uri": model_uri}
    fetched: dict[str, Any] = {}
    for kind, artifact, uri in (("dataset", artifacts.dataset, dataset_uri), ("model", artifacts.model, model_uri)):
        if artifact is None:
            fetched[kind] = _fetched(kind, uri, output.with_name(f"{output.name}.trl-{kind}"))
        if kind == "dataset" and checked.method == "grpo":  # before the model is fetched: a dataset GRPO cannot read ends the step
            _check_prompts(checked, (fetched.get("dataset") or artifacts.dataset).path)
    trainer = TRLFinetune(checked, sources={k: v for k, v in sources.items() if v}, merge_adapter=merge_adapter)
    return run_train_job(inputs, dataclasses.replace(artifacts, **fetched), options, trainer, stop=stop)
