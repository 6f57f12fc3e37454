"""Run-time work of the ``torchtune_finetune`` component: a BuiltinTrainer fine-tune in a torchtune runtime.

The TrainJob is the one the kubeflow SDK 0.5.0 creates for ``TrainerClient().train(runtime,
Initializer(dataset, model), BuiltinTrainer(TorchTuneConfig(...)))`` (its inputs given by
:func:`kfp_trainer.llm.render.render_builtin`, which also refuses a runtime that is not a
torchtune runtime; the step renders them once), plus what a pipeline step needs around it:

* **The model gets out.** The runtimes write to ``/workspace/output`` on their ``initializer``
  volume, which is deleted with the TrainJob. The step mounts a folder of the volume it shares
  with the TrainJob there instead: on a cluster a ``subPath`` mount of the pipeline workspace
  (or another PVC mounted on the task; as a second volume of the same claim, since the
  Trainer's patches key a container's mounts by volume name) on the trainer container, ``<shared>/.kfp-trainer/<task
  folder>/output``; locally a ``hostPath`` folder next to the output artifact,
  ``<artifact>.torchtune-output`` (the local backend links it into the job's workspace). ``output_dir`` itself is the runtime's to set: the
  Trainer's webhook refuses an override. After success the last complete epoch folder (full
  weights, or the merged model with the LoRA adapter in ``adapter/``) becomes the output
  ``dsl.Model``.
* **A retried step resumes.** The folder is named by the run, the task and its settings (locally:
  by the output artifact, whose path a retry keeps), so a
  KFP retry of the step finds the epoch checkpoints its failed TrainJob left there
  (:mod:`kfp_trainer.llm.checkpoints`) and its replacement TrainJob resumes after the last
  complete epoch whose recipe state was saved, instead of starting at step 0. The log and the
  report say where it resumed. (A trainer pod restarted *inside* one TrainJob runs the same
  command again and starts over: the command of a TrainJob cannot change.)
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import InvalidSpecErrors, UserError, ValidationError
from .common import copy_dir, log, shared_dir
from .finetune_inputs import (  # noqa: F401 - also imported from here
    DATASET_ROOT,
    METHODS,
    SOURCE_KINDS,
    TorchTuneArguments,
    dataset_path_arg,
    extra_overrides,
    read_torchtune,
    storage,
    torchtune_finetune_arguments,
    torchtune_settings,
)
from .step_types import StepArtifacts, StepOptions, TrainerContext, TypedTrainer
from .train_job import run_train_job

if TYPE_CHECKING:
    from ..backends.base import RuntimeInfo
    from ..cancel import Stop
    from ..spec import TrainJobInputs

OUTPUT_MOUNT = "/workspace/output"
OUTPUT_VOLUME = "kfp-trainer-output"


class TorchTuneFinetune(TypedTrainer):
    """A :class:`~kfp_trainer.steps.step_types.TypedTrainer` for the torchtune runtimes (see the module docstring)."""

    def __init__(
        self,
        settings: Any,
        *,
        dataset_uri: str = "",
        dataset_secret: str = "",
        dataset_options: dict[str, Any] | None = None,
        model_uri: str = "",
        model_secret: str = "",
        model_options: dict[str, Any] | None = None,
        dataset_path: str = "",
        learning_rate: float | None = None,
        seed: int | None = None,
        overrides: list[str] | None = None,
    ) -> None:
        self.settings = settings
        self.sources = {"dataset": (dataset_uri, dataset_secret, dataset_options), "model": (model_uri, model_secret, model_options)}
        self.dataset_path = dataset_path
        self.learning_rate = learning_rate
        self.seed = seed if seed is not None and seed >= 0 else None
        self.overrides = list(overrides or [])
        self.output_dir: Path | None = None
        self.rendered: Any = None
        self.resumed: Any = None
        self._storage: tuple[dict[str, Any], dict[str, Any]] | None = None  # (StorageSource by kind, local-only inputs)

    @classmethod
    def of(cls, read: TorchTuneArguments, *, dataset_path: str = "", learning_rate: float | None = None, seed: int | None = None,
           overrides: list[str] | None = None) -> TorchTuneFinetune:  # fmt: skip
        """The trainer of arguments :func:`~.finetune_inputs.read_torchtune` read without a problem (nothing read twice)."""
        (dataset_uri, dataset_secret, dataset_options), (model_uri, model_secret, model_options) = (read.sources[k] for k in SOURCE_KINDS)
        trainer = cls(
            read.settings, dataset_uri=dataset_uri, dataset_secret=dataset_secret, dataset_options=dataset_options, model_uri=model_uri,
            model_secret=model_secret, model_options=model_options, dataset_path=dataset_path, learning_rate=learning_rate,
            seed=seed, overrides=overrides,
        )  # fmt: skip
        trainer._storage = (dict(read.found), dict(read.local_inputs))
        return trainer

    def identity(self) -> dict[str, Any]:
        """Everything that changes what is trained."""
        return {
            "settings": self.settings.model_dump(),
            "sources": self.sources,
            "dataset_path": self.dataset_path,
            "learning_rate": self.learning_rate,
            "seed": self.seed,
            "overrides": self.overrides,
        }

    # ------------------------------------------------------------------ before the job
    def storage(self) -> tuple[dict[str, Any], dict[str, Any]]:
        """(StorageSource for the SDK renderer or None, by kind; TrainJob inputs of local-only URIs), read once.

        Raises:
            InvalidSpecErrors: A secret or options without a URI, options for a local URI (every problem).
        """
        if self._storage is None:
            found: dict[str, Any] = {}
            local: dict[str, Any] = {}
            errors: list[ValidationError] = []
            for kind in SOURCE_KINDS:
                try:
                    found[kind], more = storage(kind, *self.sources[kind])
                    local.update(more)
                except InvalidSpecErrors as e:
                    errors += e.errors
            if errors:
                raise InvalidSpecErrors(errors)
            self._storage = (found, local)
        return self._storage

    def source_inputs(self) -> dict[str, Any]:
        """The sources as the TrainJob will carry them (checked with the step's inputs before the runtime is read).

        Raises:
            InvalidSpecErrors: A secret or options without a URI, options for a local URI.
        """
        out = dict(self.storage()[1])
        for kind in SOURCE_KINDS:
            out.setdefault(f"{kind}_uri", self.sources[kind][0] or None)  # the initializer's URI
        return out

    def _args(self, args: list[str]) -> list[str]:
        if self.dataset_path:
            arg = dataset_path_arg(self.dataset_path)
            kept = [a for a in args if not a.startswith(("dataset.data_dir=", "dataset.data_files="))]
            at = next((i for i, a in enumerate(args) if a.startswith(("dataset.data_dir=", "dataset.data_files="))), None)
            if at is None:  # where the SDK puts the path of an hf:// dataset: after dtype, batch_size, epochs, loss
                at = sum(1 for a in args if a.split("=", 1)[0] in ("dtype", "batch_size", "epochs", "loss"))
            args = kept[:at] + [arg] + kept[at:]
        extra = self.extra_overrides()
        from ..llm.tune_output import check_overrides

        errors = check_overrides(extra, args)
        if errors:
            raise InvalidSpecErrors(errors)
        return args + extra

    def extra_overrides(self) -> list[str]:
        """The overrides after the typed settings': ``optimizer.lr``, ``seed``, then ``overrides``."""
        return extra_overrides(self.learning_rate, self.seed, self.overrides)

    def _output(self, ctx: TrainerContext, inputs: TrainJobInputs) -> tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]:
        """Where the output goes on this side, and the volume + mount that put it at /workspace/output."""
        from ..taskconfig import mount_covering

        folder = f".kfp-trainer/{ctx.key}/output"
        if ctx.local:  # beside the output artifact: kfp.local keeps its path across retries (its task id changes)
            artifact = Path(ctx.output_model.path).resolve()
            host = artifact.with_name(artifact.name + ".torchtune-output")
            return host, [{"name": OUTPUT_VOLUME, "hostPath": {"path": str(host)}}], [{"name": OUTPUT_VOLUME, "mountPath": OUTPUT_MOUNT}]
        if not ctx.shared_root:
            raise ValidationError(
                "workspace_path", "", "a volume shared by this step and the TrainJob, to carry the fine-tuned model out of the "
                "TrainJob (the runtime's own volume is deleted with it): configure the pipeline workspace "
                "(dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size=...))) or mount a PVC on the task",
            )  # fmt: skip
        host = Path(ctx.shared_root) / folder
        mount = mount_covering(str(host), inputs.volume_mounts)
        if mount is None:  # choose_shared_root found it among the mounts: cannot happen
            raise ValidationError("volume_mounts", inputs.volume_mounts, f"a mount covering {ctx.shared_root}")
        rel = str(host)[len(mount["mountPath"].rstrip("/")) :].lstrip("/")
        sub = "/".join(p for p in (str(mount.get("subPath") or "").strip("/"), rel) if p)
        # The same volume once more under a name of its own: the Trainer's runtimePatches key a
        # container's mounts by volume name, so one volume cannot be mounted twice there.
        source = next((v for v in inputs.volumes if v.get("name") == mount["name"]), None)
        if source is None:
            raise ValidationError("volumes", inputs.volumes, f"the volume {mount['name']!r} that holds {ctx.shared_root}")
        volume = {**{k: v for k, v in source.items() if k != "name"}, "name": OUTPUT_VOLUME}
        return host, [volume], [{"name": OUTPUT_VOLUME, "mountPath": OUTPUT_MOUNT, "subPath": sub}]

    def configure(self, ctx: TrainerContext, runtime: RuntimeInfo, inputs: TrainJobInputs) -> dict[str, Any]:
        """The SDK's TrainJob for these settings, with the output mount and, on a retry, the resume overrides."""
        from ..llm import checkpoints, render, tune_command
        from ..llm.runtimes import RuntimeTrainer

        found, local_inputs = self.storage()
        self.rendered = render.render_builtin(runtime.document, self.settings, dataset=found["dataset"], model=found["model"])
        args = self._args(list(self.rendered.inputs["args"]))
        self.output_dir, volumes, mounts = self._output(ctx, inputs)
        plan = checkpoints.resume_plan(checkpoints.scan(self.output_dir), total_epochs=self.settings.epochs, adapter=self.rendered.adapter)
        resume: list[str] = []
        if plan.checkpoint is not None and not plan.finished:  # epochs_done > 0
            self.resumed = plan
            resume = list(plan.overrides)
            log(f"resuming from {plan.checkpoint.folder} in {self.output_dir}: {plan.epochs_done} epoch(s) done by an earlier try")
        elif plan.finished:
            log(f"an earlier try saved every epoch in {self.output_dir} but its TrainJob failed; training again")
        out: dict[str, Any] = {
            **self.rendered.inputs,  # the SDK's job: runtime, command, nodes, resources, initializers
            "args": args,
            "resume_args": resume,  # the same job continued: the retry replaces the failed try's TrainJob
            "volumes": list(inputs.volumes) + volumes,
            "volume_mounts": [m for m in inputs.volume_mounts if m.get("mountPath") != OUTPUT_MOUNT] + mounts,
            **local_inputs,
        }
        # The Trainer's rules once more, on the final overrides and the node shape the task's settings give.
        rt = RuntimeTrainer.from_runtime(runtime.document)
        nodes, nproc, gpus = tune_command.node_shape(
            runtime_resources=rt.resources, runtime_num_nodes=rt.num_nodes,
            job_trainer={"numNodes": out.get("num_nodes") or inputs.num_nodes,
                         "resourcesPerNode": out.get("resources_per_node") or inputs.resources_per_node or None},
        )  # fmt: skip
        refused = tune_command.webhook_errors(rt.name, args + resume, num_nodes=nodes, num_proc_per_node=nproc, gpus_per_node=gpus)
        if refused:
            raise InvalidSpecErrors([ValidationError(f, v, a) for f, v, a in refused])
        recipe, config = tune_command.recipe_and_config(rt.name, args, num_nodes=nodes, num_proc_per_node=nproc, gpus_per_node=gpus)
        ctx.report["fine-tune"] = f"tune run {recipe} --config {config} ({'LoRA adapter' if self.rendered.adapter else 'full weights'})"
        ctx.metadata.update(recipe=recipe, config=config)
        if self.resumed is not None and plan.checkpoint is not None:
            done = f"{plan.epochs_done} of {self.settings.epochs}" if self.settings.epochs else str(plan.epochs_done)
            ctx.report["resumed"] = f"from {plan.checkpoint.folder} of an earlier try ({done} epochs done): {' '.join(plan.overrides)}"
            ctx.metadata["resumed_from"] = plan.checkpoint.folder
        return out

    def before_launch(self, ctx: TrainerContext) -> None:
        """Create the output folder, writable by the trainer's user."""
        if self.output_dir is not None:
            shared_dir(self.output_dir)

    # ------------------------------------------------------------------ after the job
    def collect(self, ctx: TrainerContext, outcome: Any) -> None:
        """The last complete epoch becomes the output model; the loss log becomes metrics."""
        from ..llm import checkpoints, tune_output

        assert self.output_dir is not None and self.rendered is not None
        epochs = checkpoints.complete_epochs(checkpoints.scan(self.output_dir), adapter=self.rendered.adapter)
        if not epochs:
            raise UserError(
                f"TrainJob {outcome.ref} succeeded but left no complete epoch checkpoint in {OUTPUT_MOUNT} "
                f"({self.output_dir}): did the trainer write to output_dir?"
            )
        final = epochs[-1]
        log(f"copying {final.folder} of {self.output_dir} -> output artifact")
        copy_dir(self.output_dir / final.folder, ctx.output_model.path)
        model_dir = Path(ctx.output_model.path)
        merged = any(model_dir.glob("model-*.safetensors"))
        if final.adapter and merged:
            # torchtune saves the merged model next to the adapter: the merged model at the top (what
            # from_pretrained loads), the adapter (torchtune's adapter_config.json, not peft's full one) in adapter/.
            (model_dir / "adapter").mkdir(exist_ok=True)
            for path in model_dir.glob("adapter_*"):
                if path.is_file():
                    path.rename(model_dir / "adapter" / path.name)
        config_file = self.output_dir / "torchtune_config.yaml"
        if config_file.is_file():  # the config the run resolved, next to the weights
            shutil.copy2(config_file, Path(ctx.output_model.path) / config_file.name)
        outcome.metrics.extend(tune_output.log_points(self.output_dir))
        ctx.metadata.update(
            epochs=final.epoch + 1, torchtune_output=str(self.output_dir),
            merged_model=bool(final.adapter and merged),
        )  # fmt: skip
        if final.adapter:
            ctx.metadata["weights"] = "adapter"  # what was trained; the merged model is there too (merged_model)


def run_torchtune_finetune(
    *,
    method: str,
    settings: dict[str, Any],
    sources: dict[str, Any],
    inputs: dict[str, Any],
    artifacts: StepArtifacts,
    options: StepOptions,
    dataset_path: str | None = "",
    learning_rate: float | None = None,
    seed: int | None = None,
    overrides: list[str] | None = None,
    stop: Stop | None = None,
) -> Any:
    """Run the ``torchtune_finetune`` component: read the settings once, then one TrainJob (see the module docstring).

    Args:
        method: ``full``, ``lora`` or ``qlora``.
        settings: The component's torchtune inputs (see :func:`torchtune_settings`).
        sources: ``dataset_uri``, ``dataset_secret``, ``dataset_options`` and the same for ``model``.
        inputs: The TrainJob inputs (runtime, names, labels, scheduling, ...).
        artifacts: The step's output artifacts.
        options: The launcher's own inputs.
        dataset_path: Where the dataset's files are under ``/workspace/dataset``.
        learning_rate: ``optimizer.lr``, when set.
        seed: torchtune's ``seed``, when set (``None`` or negative: the runtime config's).
        overrides: More ``key=value`` overrides of the runtime's torchtune config.
        stop: The step's stop token.

    Returns:
        The launcher's ``Outcome``.
    """
    # What a built pipeline checked too; the TrainJob inputs are checked once, by prepare.
    read = read_torchtune({"method": method, "settings": settings, "sources": sources, "dataset_path": dataset_path,
                           "learning_rate": learning_rate, "seed": seed, "overrides": overrides})  # fmt: skip
    if read.errors:
        raise InvalidSpecErrors(read.errors)
    trainer = TorchTuneFinetune.of(read, dataset_path=dataset_path or "", learning_rate=learning_rate, seed=seed, overrides=overrides)
    return run_train_job(inputs, artifacts, options, trainer, stop=stop)
