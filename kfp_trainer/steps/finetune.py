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
from typing import Any

from ..errors import InvalidSpecErrors, UserError, ValidationError
from .common import copy_dir, log, shared_dir
from .finetune_inputs import METHODS, torchtune_finetune_arguments, torchtune_settings  # noqa: F401 - also imported from here

OUTPUT_MOUNT = "/workspace/output"
DATASET_ROOT = "/workspace/dataset"
OUTPUT_VOLUME = "kfp-trainer-output"
REMOTE_SCHEMES = ("hf", "s3")


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


class TorchTuneFinetune:
    """A :class:`~kfp_trainer.steps.train_job.TypedTrainer` for the torchtune runtimes (see the module docstring)."""

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
    def storage(self, kind: str) -> tuple[Any, dict[str, Any]]:
        """(StorageSource for the SDK renderer or None, TrainJob inputs for a local-only URI)."""
        from ..llm.inputs import StorageSource, parse

        uri, secret, options = self.sources[kind]
        if not uri:
            if options or secret:
                raise InvalidSpecErrors([ValidationError(f"{kind}_uri", "", f"a URI: {kind}_secret/{kind}_options need one")])
            return None, {}
        if _scheme(uri) in REMOTE_SCHEMES:
            return parse(StorageSource, f"{kind}_", storage_uri=uri, secret_ref=secret or None, **(options or {})), {}
        if options:
            raise InvalidSpecErrors([ValidationError(f"{kind}_options", options, f"nothing for {uri}: they apply to hf:// and s3://")])
        return None, {f"{kind}_uri": uri, **({f"{kind}_secret": secret} if secret else {})}  # builtin:// or file:// (local mode)

    def source_inputs(self) -> dict[str, Any]:
        """The sources as the TrainJob will carry them (checked with the step's inputs before the runtime is read).

        Raises:
            InvalidSpecErrors: A secret or options without a URI, options for a local URI.
        """
        out: dict[str, Any] = {}
        for kind in ("dataset", "model"):
            out.update(self.storage(kind)[1])
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
        extra = [f"optimizer.lr={self.learning_rate:g}"] if self.learning_rate is not None else []
        return extra + ([f"seed={self.seed}"] if self.seed is not None else []) + self.overrides

    def _output(self, ctx: Any) -> tuple[Path, list[dict[str, Any]], list[dict[str, Any]]]:
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
        mount = mount_covering(str(host), ctx.inputs.get("volume_mounts"))
        if mount is None:  # choose_shared_root found it among the mounts: cannot happen
            raise ValidationError("volume_mounts", ctx.inputs.get("volume_mounts"), f"a mount covering {ctx.shared_root}")
        rel = str(host)[len(mount["mountPath"].rstrip("/")) :].lstrip("/")
        sub = "/".join(p for p in (str(mount.get("subPath") or "").strip("/"), rel) if p)
        # The same volume once more under a name of its own: the Trainer's runtimePatches key a
        # container's mounts by volume name, so one volume cannot be mounted twice there.
        source = next((v for v in ctx.inputs.get("volumes") or [] if v.get("name") == mount["name"]), None)
        if source is None:
            raise ValidationError("volumes", ctx.inputs.get("volumes"), f"the volume {mount['name']!r} that holds {ctx.shared_root}")
        volume = {**{k: v for k, v in source.items() if k != "name"}, "name": OUTPUT_VOLUME}
        return host, [volume], [{"name": OUTPUT_VOLUME, "mountPath": OUTPUT_MOUNT, "subPath": sub}]

    def configure(self, ctx: Any) -> dict[str, Any]:
        """The SDK's TrainJob for these settings, with the output mount and, on a retry, the resume overrides."""
        from ..llm import checkpoints, render, tune_command
        from ..llm.runtimes import RuntimeTrainer

        errors: list[ValidationError] = []
        found: dict[str, Any] = {}
        local_inputs: dict[str, Any] = {}
        for kind in ("dataset", "model"):
            try:
                found[kind], more = self.storage(kind)
                local_inputs.update(more)
            except InvalidSpecErrors as e:
                errors += e.errors
        if errors:
            raise InvalidSpecErrors(errors)
        self.rendered = render.render_builtin(ctx.runtime.document, self.settings, dataset=found["dataset"], model=found["model"])
        args = self._args(list(self.rendered.inputs["args"]))
        self.output_dir, volumes, mounts = self._output(ctx)
        plan = checkpoints.resume_plan(checkpoints.scan(self.output_dir), total_epochs=self.settings.epochs, adapter=self.rendered.adapter)
        resume: list[str] = []
        if plan.epochs_done and not plan.finished:
            self.resumed = plan
            resume = list(plan.overrides)
            log(f"resuming from {plan.checkpoint.folder} in {self.output_dir}: {plan.epochs_done} epoch(s) done by an earlier try")
        elif plan.finished:
            log(f"an earlier try saved every epoch in {self.output_dir} but its TrainJob failed; training again")
        out: dict[str, Any] = {
            **self.rendered.inputs,  # the SDK's job: runtime, command, nodes, resources, initializers
            "args": args,
            "resume_args": resume,  # the same job continued: the retry replaces the failed try's TrainJob
            "volumes": list(ctx.inputs.get("volumes") or []) + volumes,
            "volume_mounts": [m for m in ctx.inputs.get("volume_mounts") or [] if m.get("mountPath") != OUTPUT_MOUNT] + mounts,
            **local_inputs,
        }
        # The Trainer's rules once more, on the final overrides and the node shape the task's settings give.
        rt = RuntimeTrainer.from_runtime(ctx.runtime.document)
        nodes, nproc, gpus = tune_command.node_shape(
            runtime_resources=rt.resources, runtime_num_nodes=rt.num_nodes,
            job_trainer={"numNodes": out.get("num_nodes") or ctx.inputs.get("num_nodes"),
                         "resourcesPerNode": out.get("resources_per_node") or ctx.inputs.get("resources_per_node")},
        )  # fmt: skip
        refused = tune_command.webhook_errors(rt.name, args + resume, num_nodes=nodes, num_proc_per_node=nproc, gpus_per_node=gpus)
        if refused:
            raise InvalidSpecErrors([ValidationError(f, v, a) for f, v, a in refused])
        recipe, config = tune_command.recipe_and_config(rt.name, args, num_nodes=nodes, num_proc_per_node=nproc, gpus_per_node=gpus)
        ctx.report["fine-tune"] = f"tune run {recipe} --config {config} ({'LoRA adapter' if self.rendered.adapter else 'full weights'})"
        ctx.metadata.update(recipe=recipe, config=config)
        if self.resumed is not None:
            done = f"{plan.epochs_done} of {self.settings.epochs}" if self.settings.epochs else str(plan.epochs_done)
            ctx.report["resumed"] = f"from {plan.checkpoint.folder} of an earlier try ({done} epochs done): {' '.join(plan.overrides)}"
            ctx.metadata["resumed_from"] = plan.checkpoint.folder
        return out

    def finalize(self, ctx: Any, paths: dict[str, str]) -> dict[str, Any]:
        """Nothing more: the runtime's command names no artifact paths."""
        return {}

    def before_launch(self, ctx: Any) -> None:
        """Create the output folder, writable by the trainer's user."""
        if self.output_dir is not None:
            shared_dir(self.output_dir)

    # ------------------------------------------------------------------ after the job
    def collect(self, ctx: Any, outcome: Any) -> None:
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
    dataset_path: str = "",
    learning_rate: float | None = None,
    seed: int | None = None,
    overrides: list[str] | None = None,
    **launch: Any,
) -> Any:
    """Run the ``torchtune_finetune`` component: validate the settings, then one TrainJob (see the module docstring).

    Args:
        method: ``full``, ``lora`` or ``qlora``.
        settings: The component's torchtune inputs (see :func:`torchtune_settings`).
        sources: ``dataset_uri``, ``dataset_secret``, ``dataset_options`` and the same for ``model``.
        dataset_path: Where the dataset's files are under ``/workspace/dataset``.
        learning_rate: ``optimizer.lr``, when set.
        seed: torchtune's ``seed``, when set (``None`` or negative: the runtime config's).
        overrides: More ``key=value`` overrides of the runtime's torchtune config.
        **launch: What :func:`~kfp_trainer.steps.train_job.run_train_job` takes besides ``trainer``.

    Returns:
        The launcher's ``Outcome``.
    """
    from .checks import torchtune_errors
    from .train_job import run_train_job

    arguments = {"method": method, "settings": settings, "sources": sources, "dataset_path": dataset_path,
                 "learning_rate": learning_rate, "seed": seed, "overrides": overrides, "inputs": launch.get("inputs")}  # fmt: skip
    # What a built pipeline checked too, the TrainJob inputs left to run_train_job (checked once there).
    errors = torchtune_errors(arguments, local=True, trainjob=False)
    if errors:
        raise InvalidSpecErrors(errors)
    trainer = TorchTuneFinetune(
        torchtune_settings(method, **settings),
        dataset_path=dataset_path or "",
        learning_rate=learning_rate,
        seed=seed,
        overrides=overrides,
        **{k: v for k, v in sources.items() if v is not None},
    )
    return run_train_job(trainer=trainer, **launch)
