"""Run-time work of ``trainjob_component`` components: a Python function run as the SDK's ``CustomTrainer`` runs it.

The TrainJob is the one the kubeflow SDK 0.5.0 creates for ``CustomTrainer(func, func_args,
packages_to_install, pip_index_urls, image, num_nodes, resources_per_node, env)``: its command
(:func:`kfp_trainer.custom_trainer.render_function`) is a shell script that installs the packages,
writes the function's source (decorators included) to its file name and starts it with the
runtime's launcher (``torchrun`` for torch runtimes, ``mpirun`` for MPI, ``python`` otherwise),
calling ``func(**func_args)`` -- or ``func()`` when there are no arguments; the image and node
count are the runtime's unless set; flat resources are mapped as the SDK maps them. So a
function moved from ``train()`` into a pipeline step runs unchanged. Three parameter names get
paths instead of values: ``dataset_dir`` and ``model_dir`` (the input artifacts) and
``output_dir`` (where to save the model, which becomes the output artifact); they are resolved
before the command is rendered, so the function's source is carried verbatim.

A component's body hands every input, by name, to :func:`run_function_component`, with the
constants its factory fixed; :func:`~.arguments.function_job_arguments` sorts them (so no
parameter name of the function can collide with a name of the body).

Locally the function runs in this environment: nothing is installed, and a package it needs
that is missing here fails the step before anything starts, naming it.
"""

from __future__ import annotations

import hashlib
from typing import TYPE_CHECKING, Any

from ..errors import InvalidSpecErrors, ValidationError
from .arguments import SPECIAL, function_job_arguments
from .common import run_step
from .step_types import StepArtifacts, StepOptions, TrainerContext, TypedTrainer
from .train_job import run_train_job

if TYPE_CHECKING:
    from ..backends.base import RuntimeInfo
    from ..cancel import Stop
    from ..spec import TrainJobInputs

__all__ = ["SPECIAL", "FunctionTrainer", "function_job_arguments", "missing_packages", "run_function_component", "run_function_job"]


def missing_packages(requirements: list[str]) -> list[str]:
    """The requirements this environment does not satisfy (name and version specifier).

    Example:
        >>> missing_packages(["pip", "surely-not-installed-pkg>=1"])
        ['surely-not-installed-pkg>=1']
    """
    from importlib import metadata

    from packaging.requirements import InvalidRequirement, Requirement

    missing = []
    for text in requirements:
        try:
            req = Requirement(text)
        except InvalidRequirement:
            missing.append(text)
            continue
        try:
            version = metadata.version(req.name)
        except metadata.PackageNotFoundError:
            missing.append(text)
            continue
        if req.specifier and not req.specifier.contains(version, prereleases=True):
            missing.append(text)
    return missing


class FunctionTrainer(TypedTrainer):
    """A :class:`~kfp_trainer.steps.step_types.TypedTrainer` for a Python function (see the module docstring)."""

    def __init__(
        self,
        *,
        source: str,
        function: str,
        func_file: str,
        arguments: dict[str, Any],
        specials: list[str],
        packages_to_install: list[str] | None = None,
        pip_index_urls: list[str] | None = None,
        order: list[str] | None = None,
        resources_per_node: dict[str, Any] | None = None,
    ) -> None:
        self.source, self.function, self.func_file = source, function, func_file
        self.arguments, self.specials = dict(arguments), list(specials)
        self.packages = list(packages_to_install or [])
        self.index_urls = list(pip_index_urls or [])
        self.order = list(order or [])
        self.resources = dict(resources_per_node) if resources_per_node else None
        self.settings: Any = None  # FunctionTrainerSettings, read once by configure

    def func_args(self, paths: dict[str, str]) -> dict[str, Any] | None:
        """The SDK's ``func_args``: the arguments and artifact paths in the function's parameter order.

        ``None`` when there are none: the SDK then calls ``func()``.
        """
        values = {**self.arguments, **{s: paths[s] for s in self.specials}}
        if not values:
            return None
        rank = {name: i for i, name in enumerate(self.order)}
        return dict(sorted(values.items(), key=lambda item: rank.get(item[0], len(rank))))

    def identity(self) -> dict[str, Any]:
        """The function, its arguments and packages."""
        digest = hashlib.sha256(self.source.encode()).hexdigest()[:16]
        out = {"source": digest, "function": self.function, "arguments": self.arguments, "packages": self.packages}
        return {**out, "resources": self.resources} if self.resources else out

    def _settings(self, func_args: dict[str, Any] | None, packages: list[str]) -> Any:
        from ..llm.inputs import FunctionTrainerSettings, parse

        extra = {"pip_index_urls": self.index_urls} if self.index_urls else {}
        return parse(
            FunctionTrainerSettings, func_source=self.source, func_name=self.function, func_file=self.func_file,
            func_args=func_args, packages_to_install=packages or None, resources_per_node=self.resources, **extra,
        )  # fmt: skip

    def read(self) -> Any:
        """The function's settings (``FunctionTrainerSettings``), read once, with the placeholders for its artifact parameters.

        Raises:
            InvalidSpecErrors: Every problem of the function, its arguments and packages.
        """
        if self.settings is None:
            self.settings = self._settings(self.func_args(SPECIAL), self.packages)
        return self.settings

    def configure(self, ctx: TrainerContext, runtime: RuntimeInfo, inputs: TrainJobInputs) -> dict[str, Any]:
        """Check the function, its packages and the runtime; name the artifact placeholders it uses."""
        from ..llm.runtimes import RuntimeTrainer

        settings = self.read()
        if settings.resources_per_node:
            from ..llm.render import resources_per_node

            try:
                resources_per_node(settings.resources_per_node)
            except ValidationError as e:
                raise InvalidSpecErrors([e]) from None
        if ctx.local and self.packages:
            missing = missing_packages(self.packages)
            if missing:
                raise InvalidSpecErrors([ValidationError(
                    "packages_to_install", missing, "packages installed here: a local run starts the function in this "
                    f"environment and installs nothing (pip install {' '.join(missing)})",
                )])  # fmt: skip
        try:
            rt = RuntimeTrainer.from_runtime(runtime.document)
        except ValidationError as e:
            raise InvalidSpecErrors([e]) from None
        if rt.is_torchtune:
            raise InvalidSpecErrors([ValidationError(
                "runtime", rt.name, "a runtime that runs training functions (torch, MPI, ...); torchtune runtimes take "
                "torchtune settings (use torchtune_finetune)",
            )])  # fmt: skip
        return {"command": [SPECIAL[s] for s in self.specials]} if self.specials else {"command": ["python"]}

    def finalize(self, ctx: TrainerContext, runtime: RuntimeInfo, paths: dict[str, str]) -> dict[str, Any]:
        """The SDK's command (with the artifact parameters' paths among the function's arguments) and resources."""
        from ..custom_trainer import render_function

        func_args = self.func_args({s: paths[SPECIAL[s][1:-1]] for s in self.specials})
        # The settings configure read, with the paths (text, as the placeholders were) and, locally, nothing to install.
        read = self.read()
        settings = read.model_copy(update={"func_args": func_args, "packages_to_install": None if ctx.local else read.packages_to_install})
        job = render_function(runtime.document, settings).inputs
        # the SDK's flat resources, as the SDK maps them; the rest of the job is the step's own inputs
        return {k: job[k] for k in ("command", "resources_per_node") if k in job}


def run_function_job(
    *,
    source: str,
    function: str,
    func_file: str,
    arguments: dict[str, Any],
    specials: list[str],
    inputs: dict[str, Any],
    artifacts: StepArtifacts,
    options: StepOptions,
    packages_to_install: list[str] | None = None,
    pip_index_urls: list[str] | None = None,
    order: list[str] | None = None,
    resources_per_node: dict[str, Any] | None = None,
    stop: Stop | None = None,
) -> Any:
    """Run a ``trainjob_component`` component's function in one TrainJob.

    Args:
        source: The function's source (``def ...``, decorators included).
        function: Its name.
        func_file: The file name the SDK would give it (the file it was defined in).
        arguments: Its keyword arguments (``func_args``), the artifact parameters left out.
        specials: Which of ``dataset_dir``, ``model_dir``, ``output_dir`` it takes.
        inputs: The TrainJob inputs (runtime, image, nodes, names, env, ...).
        artifacts: The step's artifacts.
        options: The launcher's own inputs.
        packages_to_install: pip requirements installed in the trainer before the function runs.
        pip_index_urls: Package indexes (the first is the index, the others extra indexes).
        order: The function's parameter names in order (``func_args`` follows it). Without
            arguments and artifact parameters the function is called as ``func()``.
        resources_per_node: Resources of each node in the SDK's flat form (``{"gpu": 1}``).
        stop: The step's stop token.

    Returns:
        The launcher's ``Outcome``.
    """
    trainer = FunctionTrainer(
        source=source, function=function, func_file=func_file, arguments=arguments, specials=specials,
        packages_to_install=packages_to_install, pip_index_urls=pip_index_urls,
        order=order if order is not None else [*arguments, *specials], resources_per_node=resources_per_node,
    )  # fmt: skip
    return run_train_job(inputs, artifacts, options, trainer, stop=stop)


def run_function_component(values: dict[str, Any], constants: dict[str, Any]) -> Any:
    """The body of a ``trainjob_component`` component (:func:`~.arguments.function_job_arguments`), run as a step (:func:`.run_step`)."""
    return run_step(lambda stop: run_function_job(**function_job_arguments(values, constants), stop=stop))
