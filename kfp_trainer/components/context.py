"""Give every launcher task the KFP run context it needs, so a pipeline need not pass it.

A KFP backend (2.15-2.17) resolves ``dsl.PIPELINE_JOB_ID_PLACEHOLDER`` and friends only when
the *task* passes them: as a component's default value the placeholder reaches the step
unresolved. And it mounts the pipeline workspace only in steps that receive
``dsl.WORKSPACE_PATH_PLACEHOLDER`` (or ``/kfp-workspace``) as an input value. So a launcher
component made with :func:`with_run_context` fills in, on every task created from it,

* ``run_id``, ``task_name``, ``task_id`` and ``pipeline_name`` with the KFP placeholders, and
* ``workspace_path`` with ``dsl.WORKSPACE_PATH_PLACEHOLDER`` when the pipeline being built
  declares a workspace (``dsl.PipelineConfig(workspace=...)``),

unless the call passes them itself. The compiled task then carries the placeholders, and
``train_job(runtime=..., image=..., command=...)`` works on a cluster as it is. (A launcher in a
nested pipeline gets the enclosing pipeline's workspace: :mod:`.nested`.) The same call also
checks the literal arguments and sets the launcher's defaults: :mod:`.calls`.

Example:
    >>> from kfp import dsl
    >>> from kfp_trainer.components import train_job
    >>> @dsl.pipeline(name="ctx", pipeline_config=dsl.PipelineConfig(workspace=dsl.WorkspaceConfig(size="1Gi")))
    ... def ctx():
    ...     train_job(runtime="torch-distributed", image="python:3.11", command=["python", "train.py"])
    >>> task = ctx.pipeline_spec.root.dag.tasks["train-job"]
    >>> task.inputs.parameters["run_id"].runtime_value.constant.string_value
    '{{$.pipeline_job_uuid}}'
    >>> task.inputs.parameters["workspace_path"].runtime_value.constant.string_value
    '{{$.workspace_path}}'
"""

from __future__ import annotations

import inspect
from typing import Any

from kfp import dsl
from kfp.dsl.graph_component import GraphComponent

# Inputs a launcher reads its identity from, and the placeholder each gets.
CONTEXT_INPUTS = {
    "run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    "task_name": dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    "task_id": dsl.PIPELINE_TASK_ID_PLACEHOLDER,
    "pipeline_name": dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
}
WORKSPACE_INPUT = "workspace_path"


def building_pipeline() -> Any:
    """The ``GraphComponent`` whose ``@dsl.pipeline`` body is running now, or ``None`` outside one.

    KFP runs a pipeline body inside ``GraphComponent.__init__``; the innermost such frame is
    the pipeline being built (its ``pipeline_config`` argument holds the workspace).
    """
    frame = inspect.currentframe()
    code = GraphComponent.__init__.__code__
    try:
        while frame is not None:
            if frame.f_code is code:
                return frame.f_locals.get("self")
            frame = frame.f_back
        return None
    finally:
        del frame


def pipeline_workspace_declared() -> bool:
    """Whether the pipeline whose body is running now declares a workspace (False outside a pipeline body)."""
    frame = inspect.currentframe()
    code = GraphComponent.__init__.__code__
    try:
        while frame is not None:
            if frame.f_code is code:
                config = frame.f_locals.get("pipeline_config")
                workspace = getattr(config, "workspace", None)
                return bool(getattr(workspace, "size", None))
            frame = frame.f_back
        return False
    finally:
        del frame


def context_arguments(inputs: Any, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` plus the context inputs the component declares and the call left out."""
    out = dict(given)
    for name, placeholder in CONTEXT_INPUTS.items():
        if name in inputs and name not in out:
            out[name] = placeholder
    if WORKSPACE_INPUT in inputs and WORKSPACE_INPUT not in out and pipeline_workspace_declared():
        out[WORKSPACE_INPUT] = dsl.WORKSPACE_PATH_PLACEHOLDER
    return out


_MARK = "_kfp_trainer_run_context"


def _subclass(cls: type) -> type:
    """A subclass of a component class whose calls fill in the context inputs."""

    def __call__(self: Any, *args: Any, **kwargs: Any) -> Any:
        from .calls import call

        return call(cls.__call__, self, args, kwargs)

    return type(cls.__name__, (cls,), {"__call__": __call__, "__module__": cls.__module__, _MARK: True})


_CLASSES: dict[type, type] = {}


def with_run_context(component: Any) -> Any:
    """Make ``component`` (a Python or YAML component) fill in its run context on every call.

    Its calls also coerce integers given to float inputs, check the literal arguments as the
    step would and, for a launcher, turn caching off (:func:`.calls.call`).

    Returns:
        The same component object, now of a subclass of its class that adds the context.

    Example:
        >>> from kfp_trainer.components import train_job
        >>> with_run_context(train_job) is train_job
        True
    """
    cls = type(component)
    if getattr(cls, _MARK, False):
        return component
    if cls not in _CLASSES:
        _CLASSES[cls] = _subclass(cls)
    component.__class__ = _CLASSES[cls]
    return component
