# ruff: noqa: UP045 - the generated component signature needs Optional[...] (KFP does not read X | None).
"""``trainjob_component``: turn a Python training function into a component that runs it in a TrainJob.

It is the pipeline form of the kubeflow SDK's ``TrainerClient().train(trainer=CustomTrainer(func,
func_args, packages_to_install, ...))``: the TrainJob runs the function exactly as the SDK's
does (the same command: packages installed, the source written to its file name, started by
the runtime's launcher -- ``torchrun`` on every node of a torch runtime -- and called as
``func(**func_args)``), so a function moved from ``train()`` into a pipeline changes nothing.
The function's parameters become the component's inputs (``func_args``). Its source travels
inside the component, so it must be self-contained like any KFP lightweight component:
imports inside its body, parameters annotated with ``str``, ``int``, ``float``, ``bool``,
``dict`` or ``list``. Three parameter names are special: ``dataset_dir`` and ``model_dir`` add
``dataset`` / ``model`` artifact inputs and receive their paths; ``output_dir`` receives the
directory to save the model to, which becomes the ``output_model`` artifact. Everything the
function prints as metrics (JSON lines, ``name=value``) becomes the ``metrics`` output and
the report's curves.

Only the standard library and ``kfp`` are imported here.

Example:
    >>> def train(output_dir: str, epochs: int = 2):
    ...     import json, os
    ...     os.makedirs(output_dir, exist_ok=True)
    ...     for epoch in range(epochs):
    ...         print(json.dumps({"epoch": epoch, "loss": 1.0 / (epoch + 1)}))
    ...     open(os.path.join(output_dir, "weights.txt"), "w").write("ok")
    >>> component = trainjob_component(train, num_nodes=2)
    >>> sorted(component.component_spec.inputs)[:3]
    ['backend', 'epochs', 'image']
"""

import inspect
import itertools
import linecache
import os
import textwrap
import typing
from collections.abc import Callable
from typing import Any, Optional

from kfp import dsl
from kfp.dsl import HTML, Dataset, Input, Metrics, Model, Output, OutputPath

from ._image import BASE_IMAGE, TRAINER_IMAGE
from .calls import FUNCTION_ATTRIBUTE
from .context import with_run_context
from .train_job import TASK_CONFIG_PASSTHROUGHS

SPECIAL = ("dataset_dir", "model_dir", "output_dir")
_TYPES = {str: "str", int: "int", float: "float", bool: "bool", dict: "dict", list: "list"}
_RESERVED = {
    "output_model", "metrics", "report", "trainjob", "dataset", "model", "num_nodes", "runtime", "image", "backend",
    "workspace_path", "run_id", "task_name", "task_id", "start_timeout", "run_timeout", "task_config", "env", "num_proc_per_node",
    "resources_per_node", "namespace", "logs", "packages_to_install", "pip_index_urls",
}
_counter = itertools.count()

def _function_source(func: Callable) -> str:
    lines = textwrap.dedent(inspect.getsource(func)).splitlines()
    start = next(i for i, line in enumerate(lines) if line.lstrip().startswith(("def ", "async def ")))
    return "\n".join(lines[start:]) + "\n"


def _annotation_name(annotation: Any, name: str) -> str:
    if isinstance(annotation, str):  # postponed annotations (from __future__ import annotations)
        text = annotation.replace(" ", "")
        for wrapped in (text[len("Optional["):-1] if text.startswith("Optional[") and text.endswith("]") else None,
                        text[: -len("|None")] if text.endswith("|None") else None,
                        text[len("None|"):] if text.startswith("None|") else None):
            if wrapped in _TYPES.values():
                return f"Optional[{wrapped}]"
        if text in _TYPES.values():
            return text
        annotation = text
    origin = typing.get_origin(annotation)
    if origin is typing.Union:
        inner = [a for a in typing.get_args(annotation) if a is not type(None)]
        if len(inner) == 1:
            return f"Optional[{_annotation_name(inner[0], name)}]"
    base = origin or annotation
    if base in _TYPES:
        return _TYPES[base]
    raise TypeError(
        f"parameter {name!r}: annotate it with str, int, float, bool, dict or list (got {annotation!r}); "
        "artifacts reach the function through dataset_dir, model_dir and output_dir"
    )


def trainjob_component(
    func: Optional[Callable] = None,
    *,
    runtime: str = "torch-distributed",
    num_nodes: int = 1,
    num_proc_per_node: Optional[int] = None,
    image: Optional[str] = None,
    resources_per_node: Optional[dict] = None,
    env: Optional[dict] = None,
    packages_to_install: Optional[list] = None,
    pip_index_urls: Optional[list] = None,
    base_image: Optional[str] = None,
) -> Any:
    """Make a KFP component that runs ``func`` distributed inside a TrainJob.

    Usable as ``trainjob_component(train, num_nodes=2)`` or as the decorator
    ``@trainjob_component(num_nodes=2)``. The component's inputs are the function's
    parameters plus ``num_nodes``, ``runtime``, ``image``, ``packages_to_install``,
    ``pip_index_urls``, ``backend``, ``workspace_path`` (see ``train_job``), time limits, and
    ``dataset`` / ``model`` artifacts when the function takes ``dataset_dir`` / ``model_dir``.
    Outputs: ``output_model``, ``metrics``, ``report`` and ``trainjob``, as for ``train_job``.

    Args:
        func: The training function (self-contained; imports inside its body).
        runtime: Default Trainer runtime.
        num_nodes: Default number of trainer nodes.
        num_proc_per_node: Processes per node (torch runtimes).
        image: Default trainer image; one with torch and kfp-trainer's dependencies.
        resources_per_node: Default resources of each node.
        env: Extra environment of the trainer.
        packages_to_install: Default pip requirements installed in the trainer before the
            function runs (as the SDK's ``packages_to_install``; a local run installs nothing
            and needs them installed already).
        pip_index_urls: Default package indexes: the first is the index, the others extra ones.
        base_image: Image of the launcher step itself.

    Returns:
        A ``PythonComponent``.

    Raises:
        TypeError: A parameter is not annotated with a supported type.
    """
    if func is None:
        return lambda f: trainjob_component(
            f, runtime=runtime, num_nodes=num_nodes, num_proc_per_node=num_proc_per_node, image=image,
            resources_per_node=resources_per_node, env=env, packages_to_install=packages_to_install,
            pip_index_urls=pip_index_urls, base_image=base_image,
        )
    name = func.__name__
    try:
        func_file = os.path.basename(inspect.getfile(func))  # the file name the SDK gives the source in the pod
    except TypeError:
        func_file = f"{name}.py"
    signature = inspect.signature(func)
    params, arguments, specials = [], [], []
    for p in signature.parameters.values():
        if p.name in SPECIAL:
            specials.append(p.name)
            continue
        if p.name in _RESERVED:
            raise TypeError(f"parameter {p.name!r} of {name}: the name is taken by the component; rename it")
        kind = _annotation_name(p.annotation, p.name)
        default = "" if p.default is inspect.Parameter.empty else f" = {p.default!r}"
        params.append(f"{p.name}: {kind}{default}")
        arguments.append(p.name)
    params.sort(key=lambda text: " = " in text)  # parameters without defaults first
    artifact_inputs = [
        f"{n}: Input[{'Dataset' if n == 'dataset' else 'Model'}] = None" for n in ("dataset", "model") if f"{n}_dir" in specials
    ]
    source = _function_source(func)
    doc = inspect.getdoc(func) or f"Runs {name} in a Kubeflow Trainer TrainJob."
    args_dict = ", ".join(f"{a!r}: {a}" for a in arguments)
    code = f'''
def {name}(
    output_model: Output[Model],
    metrics: Output[Metrics],
    report: Output[HTML],
    trainjob: OutputPath(str),
    {(", ".join(params) + ",") if params else ""}
    {(", ".join(artifact_inputs) + ",") if artifact_inputs else ""}
    num_nodes: int = {int(num_nodes)!r},
    runtime: str = {runtime!r},
    image: str = {image or TRAINER_IMAGE!r},
    packages_to_install: list = {list(packages_to_install or [])!r},
    pip_index_urls: list = {list(pip_index_urls or ["https://pypi.org/simple"])!r},
    backend: str = "auto",
    workspace_path: str = "",
    run_id: str = dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    task_name: str = dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    task_id: str = dsl.PIPELINE_TASK_ID_PLACEHOLDER,
    start_timeout: float = 3600.0,
    run_timeout: float = 0.0,
    task_config: dsl.TaskConfig = None,
):
    {doc!r}
    from kfp_trainer import steps

    inputs = {{
        "runtime": runtime, "image": image, "num_nodes": num_nodes, "run_id": run_id, "task_name": task_name, "task_id": task_id,
        "num_proc_per_node": {num_proc_per_node!r}, "resources_per_node": {resources_per_node!r}, "env": {env!r},
    }}
    steps.exit_on_error(
        lambda: steps.run_function_job(
            source={source!r}, function={name!r}, func_file={func_file!r}, arguments={{{args_dict}}}, specials={specials!r},
            packages_to_install=packages_to_install, pip_index_urls=pip_index_urls,
            inputs=inputs, task_config=task_config, backend=backend, start_timeout=start_timeout,
            run_timeout=run_timeout, logs="0", delete_after_success=False, workspace_path=workspace_path,
            dataset={"dataset" if "dataset_dir" in specials else "None"}, model={"model" if "model_dir" in specials else "None"},
            output_model=output_model, metrics=metrics, report=report, trainjob_path=trainjob,
        )
    )
'''
    filename = f"<kfp-trainer trainjob_component {name} {next(_counter)}>"
    linecache.cache[filename] = (len(code), None, code.splitlines(True), filename)
    namespace: dict = {
        "dsl": dsl, "Input": Input, "Output": Output, "OutputPath": OutputPath, "Model": Model, "Dataset": Dataset,
        "Metrics": Metrics, "HTML": HTML, "Optional": Optional,
    }
    exec(compile(code, filename, "exec"), namespace)  # noqa: S102 - code generated above from a signature
    wrapper = namespace[name]
    component = dsl.component(
        wrapper, base_image=base_image or BASE_IMAGE, install_kfp_package=False, task_config_passthroughs=TASK_CONFIG_PASSTHROUGHS
    )
    setattr(component, FUNCTION_ATTRIBUTE, {  # what the checks at each call need (.calls)
        "source": source, "name": name, "file": func_file, "arguments": arguments, "specials": specials,
        "inputs": {"num_proc_per_node": num_proc_per_node, "resources_per_node": resources_per_node, "env": env},
    })  # fmt: skip
    return with_run_context(component)
