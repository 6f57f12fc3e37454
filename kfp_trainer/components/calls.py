"""What calling a component of this package does in a pipeline, besides KFP's own work.

Before KFP creates the task:

* an integer given to a float input (``lora_alpha=16``, ``start_timeout=600``) becomes a
  float, as KFP's type check wants;
* the literal arguments, with the component's defaults for the inputs left out, go through
  the checks the step itself runs (:mod:`kfp_trainer.steps.checks`). A mistake -- a node count
  of -2, an unknown ``method``, a runtime name Kubernetes refuses, half a GPU -- or a literal
  credential fails at the call, inside the pipeline function, with the step's own message;
  nothing reaches the compiled YAML or ``kfp.local``. Pipeline parameters and upstream outputs
  are checked when the step runs, as before (inside a list or dict they stand as ``$(...)``);
* the run context is filled in (:mod:`.context`).

:func:`with_run_context` makes a component's calls go through :func:`call` (the components of
this package are made so; :mod:`.loading` makes loaded ones so).

After: a launcher task (one that runs a TrainJob) gets caching off -- its inputs rarely change
between runs, so a cache hit would skip training; ``task.set_caching_options(True)`` turns it
back on -- and, in a pipeline without a workspace, is noted so that an enclosing pipeline's
workspace reaches it (:mod:`.nested`); one that needs that volume (its command uses
``{output_model}``, a fine-tune's model comes back on it) and never gets one nor a PVC fails
the pipeline's compilation with the step's own message.

Only the standard library and ``kfp`` are imported at the top; the checks load when a
component is called. What of KFP's internals this needs is in :mod:`.kfp_internals`.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from typing import Any

from .context import WORKSPACE_INPUT, context_arguments
from .kfp_internals import CHANNEL_TEXT, component_name, default_pipeline, extend, inputs_of, is_channel, outputs_of, unique_task_name
from .nested import await_workspace

#: What a value known only when the step runs stands as in a checked list or dict: a reference,
#: which no rule takes for a credential.
UNKNOWN = "$(PIPELINE_VALUE)"
_FIELD = re.compile(r"[A-Za-z_][A-Za-z0-9_]*")
FUNCTION_ATTRIBUTE = "_kfp_trainer_function"  # what trainjob_component built into the component
ARTIFACT_INPUTS = ("dataset", "model")  # a launcher's input artifacts ({dataset}, {model})


def is_launcher(inputs: Any) -> bool:
    """True for a component that runs a TrainJob (it takes a ``task_config`` and a ``run_id``)."""
    return "task_config" in inputs and "run_id" in inputs


def coerce_floats(inputs: Any, kwargs: dict[str, Any]) -> dict[str, Any]:
    """``kwargs`` with integers given to float inputs as floats (KFP refuses ``16`` for a float input)."""
    return {
        k: float(v) if type(v) is int and k in inputs and getattr(inputs[k], "type", None) == "Float" else v
        for k, v in kwargs.items()
    }


def _stand_in(value: Any) -> tuple[Any, bool]:
    """``value`` with pipeline channels replaced by :data:`UNKNOWN`, and whether it held any."""
    if is_channel(value):
        return UNKNOWN, True
    if isinstance(value, str):
        out = CHANNEL_TEXT.sub(UNKNOWN, value)
        return out, out != value
    if isinstance(value, dict):
        pairs = [(_stand_in(k), _stand_in(v)) for k, v in value.items()]
        return {k: v for (k, _), (v, _) in pairs}, any(a or b for (_, a), (_, b) in pairs)
    if isinstance(value, (list, tuple)):
        items = [_stand_in(v) for v in value]
        return type(value)(v for v, _ in items), any(c for _, c in items)
    return value, False


def literal_values(inputs: Any, kwargs: dict[str, Any]) -> tuple[dict[str, Any], set[str]]:
    """Every input's value as far as the pipeline knows it, and the names known only at run time.

    Inputs left out have the component's default; a pipeline parameter or upstream output is
    ``None`` (and named in the set), an upstream ``dataset`` or ``model`` artifact :data:`UNKNOWN`;
    channels inside a list, dict or string are :data:`UNKNOWN`.
    """
    values = {name: getattr(spec, "default", None) for name, spec in inputs.items()}
    unknown: set[str] = set()
    for name, value in kwargs.items():
        if is_channel(value):
            values[name] = UNKNOWN if name in ARTIFACT_INPUTS else None  # a connected artifact: its path comes at run time
            unknown.add(name)
        else:
            values[name], _ = _stand_in(value)
    return values, unknown


def kind_of(component: Any) -> str | None:
    """Which of the steps' checks applies to ``component`` (a Python or YAML component), by its inputs and outputs."""
    inputs = set(inputs_of(component))
    outputs = set(outputs_of(component))
    if {"packages_to_install", "pip_index_urls", "runtime", "task_config"} <= inputs:
        return "function"
    if {"method", "lora_rank", "runtime", "task_config"} <= inputs:
        return "torchtune_finetune"
    if {"method", "lora_r", "beta", "runtime", "task_config"} <= inputs:
        return "trl_finetune"
    if {"command", "args", "runtime", "task_config"} <= inputs:
        return "train_job"
    if "uri" in inputs and outputs in ({"dataset"}, {"model"}):
        return "initializer"
    return None


def _shown(error: Any, unknown: set[str]) -> bool:
    """Whether a check's error is about what the pipeline knows (not a value only the run knows)."""
    top = _FIELD.match(error.field)
    if top and top.group() in unknown:
        return False
    return UNKNOWN not in error.field and UNKNOWN not in repr(error.value)


def task_name(component: Any) -> str:
    """The name KFP will give the task this call of ``component`` makes in the pipeline being built."""
    return unique_task_name(component_name(component))


def check_literals(component: Any, kwargs: dict[str, Any]) -> dict[str, Any] | None:
    """Run the step's checks on the call's literal arguments.

    Returns:
        The values checked (:func:`literal_values`), or ``None`` for a component without checks.

    Raises:
        InvalidSpecErrors: What the step would refuse, with its message (secrets hidden).
    """
    kind = kind_of(component)
    if kind is None:
        return None
    from kfp_trainer.errors import InvalidSpecErrors
    from kfp_trainer.steps import checks

    values, unknown = literal_values(inputs_of(component), kwargs)
    check: Callable[[dict[str, Any]], None] = {
        "train_job": checks.check_train_job,
        "torchtune_finetune": checks.check_torchtune_finetune,
        "trl_finetune": checks.check_trl_finetune,
        "function": lambda v: checks.check_function(v, getattr(component, FUNCTION_ATTRIBUTE, None)),
        "initializer": checks.check_initializer,
    }[kind]
    try:
        check(values)
    except InvalidSpecErrors as e:
        shown = [error for error in e.errors if _shown(error, unknown)]
        if shown:
            refused = InvalidSpecErrors(shown)
            if hasattr(refused, "add_note"):  # Python 3.11+: shown under the traceback, not in the message
                where = f"task {task_name(component)!r}: " if default_pipeline() is not None else ""
                refused.add_note(f"{where}{component.name}(...) refused while the pipeline was built, as its step would refuse it")
            raise refused from None
    return values


def workspace_need(component: Any, values: dict[str, Any] | None) -> Any:
    """The step's own error if it needs a volume shared with its TrainJob (see :mod:`kfp_trainer.steps.workspace_need`)."""
    kind = kind_of(component)
    if kind is None or values is None:
        return None
    from kfp_trainer.steps.workspace_need import shared_volume_need

    return shared_volume_need(kind, values, getattr(component, FUNCTION_ATTRIBUTE, None))


def call(original: Callable[..., Any], component: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """Call ``component`` through ``original`` (its class's ``__call__``) with the checks and defaults above."""
    inputs = inputs_of(component)
    in_pipeline = default_pipeline() is not None
    kwargs = coerce_floats(inputs, kwargs)
    values = check_literals(component, kwargs)
    kwargs = context_arguments(inputs, kwargs)
    task = original(component, *args, **kwargs)
    if in_pipeline and is_launcher(inputs):
        task.set_caching_options(False)
        if WORKSPACE_INPUT in inputs and WORKSPACE_INPUT not in kwargs:
            await_workspace(task, workspace_need(component, values))
    return task


_MARK = "_kfp_trainer_run_context"


def with_run_context(component: Any) -> Any:
    """Make ``component`` (a Python or YAML component) fill in its run context on every call.

    Its calls also coerce integers given to float inputs, check the literal arguments as the
    step would and, for a launcher, turn caching off (:func:`call`).

    Returns:
        The same component object, now of a subclass of its class that adds the context.

    Example:
        >>> from kfp_trainer.components import train_job
        >>> with_run_context(train_job) is train_job
        True
    """
    cls = type(component)

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        return call(cls.__call__, self, args, kwargs)

    extend(component, _MARK, {"__call__": __call__})
    return component
