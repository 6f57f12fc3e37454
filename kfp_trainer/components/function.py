# ruff: noqa: UP045 - the generated component signature needs Optional[...] (KFP does not read X | None).
"""``trainjob_component``: turn a Python training function into a component that runs it in a TrainJob.

It is the pipeline form of the kubeflow SDK's ``TrainerClient().train(trainer=CustomTrainer(func,
func_args, packages_to_install, ...))``: the TrainJob is the one the SDK creates -- the same
command (packages installed, the function's source as ``inspect.getsource`` gives it,
decorators included, written to its file name, started by the runtime's launcher --
``torchrun`` on every node of a torch runtime -- and called as ``func(**func_args)``, or
``func()`` for a function without parameters), the runtime's image and node count unless set,
``resources_per_node`` in the SDK's flat form -- so a function moved from ``train()`` into a
pipeline changes nothing. Only the ``@trainjob_component(...)`` line itself is left out of
the source. The function's parameters become the component's inputs (``func_args``), under
any name but those of the component's own inputs. Its source travels inside the component,
so it must be self-contained like any KFP lightweight component: imports inside its body,
parameters annotated with (or defaulting to a value of) ``str``, ``int``, ``float``,
``bool``, ``dict`` or ``list``. Three parameter names are special: ``dataset_dir`` and
``model_dir`` add ``dataset`` / ``model`` artifact inputs and receive their paths;
``output_dir`` receives the directory to save the model to, which becomes the
``output_model`` artifact. Everything the function prints as metrics (JSON lines,
``name=value``) becomes the ``metrics`` output and the report's curves.

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

import ast
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

from ._image import BASE_IMAGE
from .calls import FUNCTION_ATTRIBUTE, with_run_context
from .train_job import TASK_CONFIG_PASSTHROUGHS

SPECIAL = ("dataset_dir", "model_dir", "output_dir")
_TYPES = {str: "str", int: "int", float: "float", bool: "bool", dict: "dict", list: "list"}
# KFP refuses an input named "Output" (the name of a function's single return value).
_KFP_RESERVED = ("Output",)
_OUTPUTS = ("output_model", "metrics", "report", "trainjob")
_LAUNCH_INPUTS = (
    "num_nodes", "runtime", "image", "packages_to_install", "pip_index_urls", "backend", "workspace_path", "run_id", "task_name",
    "task_id", "start_timeout", "run_timeout", "task_config",
)  # fmt: skip
_counter = itertools.count()


def _declared_by(decorator: ast.expr, func: Callable) -> bool:
    """Whether ``decorator`` (as written above ``func``) is :func:`trainjob_component`."""
    node = decorator.func if isinstance(decorator, ast.Call) else decorator
    path: list[str] = []
    while isinstance(node, ast.Attribute):
        path.insert(0, node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return False
    scope = getattr(inspect.unwrap(func), "__globals__", {})
    if node.id in scope:
        found: Any = scope[node.id]
        for attr in path:
            found = getattr(found, attr, None)
        return found is trainjob_component
    return (path or [node.id])[-1] == "trainjob_component"  # a name of an enclosing function's scope


def _function_source(func: Callable) -> str:
    """The source the SDK sends (``textwrap.dedent(inspect.getsource(func))``), without this factory's own decorator.

    Decorators written below ``@trainjob_component(...)`` were applied to ``func`` and stay,
    as the SDK keeps them; the factory's line (and any written above it, which decorate the
    component rather than the function) would not run in the trainer.
    """
    source = textwrap.dedent(inspect.getsource(func))
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return source  # the settings' check names the problem
    node = next((n for n in tree.body if isinstance(n, (ast.FunctionDef, ast.AsyncFunctionDef))), None)
    if node is None:
        return source
    ours = [d for d in node.decorator_list if _declared_by(d, func)]
    if not ours:
        return source
    last = ours[-1]
    following = node.decorator_list[node.decorator_list.index(last) + 1 :]
    first_kept = following[0].lineno if following else node.lineno  # lines are 1-based; "@" sits on the expression's line
    lines = source.splitlines(keepends=True)
    return "".join(lines[first_kept - 1 :])


def _parameter_kind(p: inspect.Parameter, func_name: str) -> str:
    """The KFP type of a parameter: its annotation, or the type of its default when it has none."""
    if p.annotation is inspect.Parameter.empty and p.default is not inspect.Parameter.empty:
        default_type = bool if isinstance(p.default, bool) else type(p.default)
        if default_type in _TYPES:
            return _TYPES[default_type]
    if p.annotation is inspect.Parameter.empty:
        raise TypeError(
            f"parameter {p.name!r} of {func_name}: annotate it with str, int, float, bool, dict or list, or give it a default of "
            "one of those types (it becomes a component input)"
        )
    return _annotation_name(p.annotation, p.name)


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
    num_nodes: Optional[int] = None,
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
        num_nodes: Default number of trainer nodes; unset (the component's 0), the runtime's.
        num_proc_per_node: Processes per node (torch runtimes).
        image: Default trainer image; unset (the component's ""), the runtime's, as with the SDK.
        resources_per_node: Resources of each node: the SDK's flat form (``{"cpu": 4, "memory":
            "8Gi", "gpu": 1}``, requests equal to limits) or a Kubernetes ResourceRequirements
            dict (``{"limits": {...}}``).
        env: Extra environment of the trainer.
        packages_to_install: Default pip requirements installed in the trainer before the
            function runs (as the SDK's ``packages_to_install``; a local run installs nothing
            and needs them installed already).
        pip_index_urls: Default package indexes: the first is the index, the others extra ones.
        base_image: Image of the launcher step itself.

    Returns:
        A ``PythonComponent``.

    Raises:
        TypeError: A parameter has neither a supported annotation nor a default of a supported
            type, is positional-only, or has the name of one of the component's own inputs.
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
    specials = [p.name for p in signature.parameters.values() if p.name in SPECIAL]
    artifact_inputs = {n: f"{n}: Input[{'Dataset' if n == 'dataset' else 'Model'}] = None" for n in ("dataset", "model")
                       if f"{n}_dir" in specials}  # fmt: skip
    taken = {*_OUTPUTS, *_LAUNCH_INPUTS, *artifact_inputs}
    params, arguments, order = [], [], []
    defaults, types = {}, {}
    for p in signature.parameters.values():
        if p.kind in (p.VAR_POSITIONAL, p.VAR_KEYWORD):
            continue  # *args / **kwargs take no component input
        if p.kind is p.POSITIONAL_ONLY:
            raise TypeError(f"parameter {p.name!r} of {name}: positional-only, but the function is called as {name}(**func_args)")
        order.append(p.name)
        if p.name in SPECIAL:
            continue
        if not p.name[0].isalpha():
            raise TypeError(f"parameter {p.name!r} of {name}: KFP input names start with a letter; rename it")
        if p.name in _KFP_RESERVED:
            raise TypeError(f"parameter {p.name!r} of {name}: KFP reserves the input name {p.name!r}; rename it")
        if p.name in taken:
            raise TypeError(f"parameter {p.name!r} of {name}: the name is taken by the component's own inputs "
                            f"({', '.join(sorted(taken))}); rename it")  # fmt: skip
        kind = _parameter_kind(p, name)
        default = "" if p.default is inspect.Parameter.empty else f" = {p.default!r}"
        params.append(f"{p.name}: {kind}{default}")
        arguments.append(p.name)
        if p.default is not inspect.Parameter.empty:
            defaults[p.name] = p.default
        types[p.name] = kind.removeprefix("Optional[").removesuffix("]")
    params.sort(key=lambda text: " = " in text)  # parameters without defaults first
    source = _function_source(func)
    doc = inspect.getdoc(func) or f"Runs {name} in a Kubeflow Trainer TrainJob."
    # The body binds one name, which no parameter can have (KFP input names start with a letter),
    # and reads every input by name: any parameter name of the function reaches it unchanged.
    module = "_kfp_trainer_function"
    values = ", ".join(f"{n!r}: {n}" for n in [*_OUTPUTS, *arguments, *artifact_inputs, *_LAUNCH_INPUTS])
    constants = {
        "source": source, "function": name, "func_file": func_file, "parameters": order, "defaults": defaults,
        "types": types, "num_proc_per_node": num_proc_per_node, "resources_per_node": resources_per_node, "env": env,
    }  # fmt: skip
    code = f'''
def {name}(
    output_model: Output[Model],
    metrics: Output[Metrics],
    report: Output[HTML],
    trainjob: OutputPath(str),
    {(", ".join(params) + ",") if params else ""}
    {(", ".join(artifact_inputs.values()) + ",") if artifact_inputs else ""}
    num_nodes: int = {int(num_nodes or 0)!r},
    runtime: str = {runtime!r},
    image: str = {image or ""!r},
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
    import kfp_trainer.steps.function as {module}

    {module}.run_function_component({{{values}}}, {constants!r})
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
