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
constants its factory fixed; :func:`function_job_arguments` sorts them (so no parameter name of
the function can collide with a name of the body).

Locally the function runs in this environment: nothing is installed, and a package it needs
that is missing here fails the step before anything starts, naming it.
"""

from __future__ import annotations

import hashlib
from typing import Any

from ..errors import InvalidSpecErrors, ValidationError

#: The artifact parameters of a function and the placeholder each gets.
SPECIAL = {"dataset_dir": "{dataset}", "model_dir": "{model}", "output_dir": "{output_model}"}

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


class FunctionTrainer:
    """A :class:`~kfp_trainer.steps.train_job.TypedTrainer` for a Python function (see the module docstring)."""

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

    def configure(self, ctx: Any) -> dict[str, Any]:
        """Check the function, its packages and the runtime; name the artifact placeholders it uses."""
        from ..llm.runtimes import RuntimeTrainer

        settings = self._settings(self.func_args(SPECIAL), self.packages)  # every problem, now
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
            rt = RuntimeTrainer.from_runtime(ctx.runtime.document)
        except ValidationError as e:
            raise InvalidSpecErrors([e]) from None
        if rt.is_torchtune:
            raise InvalidSpecErrors([ValidationError(
                "runtime", rt.name, "a runtime that runs training functions (torch, MPI, ...); torchtune runtimes take "
                "torchtune settings (use torchtune_finetune)",
            )])  # fmt: skip
        return {"command": [SPECIAL[s] for s in self.specials]} if self.specials else {"command": ["python"]}

    def finalize(self, ctx: Any, paths: dict[str, str]) -> dict[str, Any]:
        """The SDK's command (with the artifact parameters' paths among the function's arguments) and resources."""
        from ..custom_trainer import render_function

        func_args = self.func_args({s: paths[SPECIAL[s][1:-1]] for s in self.specials})
        job = render_function(ctx.runtime.document, self._settings(func_args, [] if ctx.local else self.packages)).inputs
        # the SDK's flat resources, as the SDK maps them; the rest of the job is the step's own inputs
        return {k: job[k] for k in ("command", "resources_per_node") if k in job}

    def before_launch(self, ctx: Any) -> None:
        """Nothing to prepare."""

    def collect(self, ctx: Any, outcome: Any) -> None:
        """The function saved its model to ``output_dir``: nothing more to do."""


def run_function_job(
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
    **launch: Any,
) -> Any:
    """Run a ``trainjob_component`` component's function in one TrainJob.

    Args:
        source: The function's source (``def ...``, decorators included).
        function: Its name.
        func_file: The file name the SDK would give it (the file it was defined in).
        arguments: Its keyword arguments (``func_args``), the artifact parameters left out.
        specials: Which of ``dataset_dir``, ``model_dir``, ``output_dir`` it takes.
        packages_to_install: pip requirements installed in the trainer before the function runs.
        pip_index_urls: Package indexes (the first is the index, the others extra indexes).
        order: The function's parameter names in order (``func_args`` follows it). Without
            arguments and artifact parameters the function is called as ``func()``.
        resources_per_node: Resources of each node in the SDK's flat form (``{"gpu": 1}``).
        **launch: What :func:`~kfp_trainer.steps.train_job.run_train_job` takes besides ``trainer``.

    Returns:
        The launcher's ``Outcome``.
    """
    from .train_job import run_train_job

    trainer = FunctionTrainer(
        source=source, function=function, func_file=func_file, arguments=arguments, specials=specials,
        packages_to_install=packages_to_install, pip_index_urls=pip_index_urls,
        order=order if order is not None else [*arguments, *specials], resources_per_node=resources_per_node,
    )  # fmt: skip
    return run_train_job(trainer=trainer, **launch)


#: The launcher's own inputs of a ``trainjob_component`` component, handed to :func:`run_train_job` as they are.
_LAUNCH = ("backend", "workspace_path", "start_timeout", "run_timeout", "task_config")
_SECTIONS = ("limits", "requests", "claims")


def function_job_arguments(values: dict[str, Any], constants: dict[str, Any]) -> dict[str, Any]:
    """:func:`run_function_job`'s arguments from a ``trainjob_component`` component's input values.

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
    resources = constants.get("resources_per_node")
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
        **{k: values.get(k) for k in _LAUNCH}, "logs": "0", "delete_after_success": False,
        "dataset": values.get("dataset"), "model": values.get("model"), "output_model": values.get("output_model"),
        "metrics": values.get("metrics"), "report": values.get("report"), "trainjob_path": values.get("trainjob"),
    }  # fmt: skip


def _arguments(values: dict[str, Any], constants: dict[str, Any]) -> dict[str, Any]:
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


def run_function_component(values: dict[str, Any], constants: dict[str, Any]) -> Any:
    """The body of a ``trainjob_component`` component (see :func:`function_job_arguments`); exits on a user error."""
    from .common import exit_on_error

    return exit_on_error(lambda: run_function_job(**function_job_arguments(values, constants)))
