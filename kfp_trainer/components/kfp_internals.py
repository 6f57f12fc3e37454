"""Every part of KFP's internals the components rely on, in one place (KFP 2.15-2.17).

KFP offers no public way to do what :mod:`.calls`, :mod:`.context`, :mod:`.nested` and
:mod:`.loading` do at a call or a load: know the pipeline being built and its workspace, tell a
value known only at run time, name a task as KFP will, hand a nested pipeline's tasks the
workspace, restore what the YAML loader drops. So they go through the functions here, and
``tests/unit/test_kfp_internals.py`` names each internal in one test: a KFP upgrade that moves one
fails there, and here is the one module to change.

The internals (what each function below relies on):

* ``GraphComponent.__init__`` runs a ``@dsl.pipeline`` body, with the graph as ``self`` and
  the ``pipeline_config`` argument among its locals (:func:`pipeline_being_built`);
* ``pipeline_context.Pipeline.get_default_pipeline()`` and its ``tasks`` (:func:`default_pipeline`,
  :func:`unique_task_name`);
* ``pipeline_channel.PipelineChannel`` and its text form ``{{channel:task=...;name=...;type=...;}}``
  inside strings (:func:`is_channel`, :data:`CHANNEL_TEXT`);
* ``dsl.utils.maybe_rename_for_k8s`` and ``make_name_unique_by_adding_index`` (:func:`unique_task_name`);
* ``BaseComponent.component_spec`` (``inputs``, ``outputs``, ``name``; an input's ``default`` and
  ``type``; ``implementation.graph``; ``task_config_passthroughs``) (:func:`inputs_of`,
  :func:`outputs_of`, :func:`graph_spec`, :func:`set_task_config_passthroughs`);
* ``PipelineTask.pipeline_spec``, the spec a task of a nested pipeline carries (:func:`task_spec`,
  :func:`set_task_spec`);
* a component's class may be replaced by a subclass that overrides ``__call__`` (and a
  ``GraphComponent``'s ``pipeline_spec`` property) (:func:`extend`).
"""

from __future__ import annotations

import inspect
import re
from typing import Any

from kfp import dsl
from kfp.dsl import pipeline_channel, pipeline_context, utils
from kfp.dsl.graph_component import GraphComponent

#: A pipeline channel as it stands inside a string (an f-string of a pipeline parameter or an upstream output).
CHANNEL_TEXT = re.compile(r"\{\{channel:task=[\w\s_-]*;name=[\w\s_-]+;type=[\w\s{}\":_-]*;\}\}")


def pipeline_being_built() -> tuple[Any, Any]:
    """``(graph, pipeline_config)`` of the innermost ``@dsl.pipeline`` whose body is running now; ``(None, None)`` outside one.

    KFP runs a pipeline body inside ``GraphComponent.__init__``: the innermost such frame is the
    pipeline being built; its ``pipeline_config`` argument holds the workspace.
    """
    frame = inspect.currentframe()
    code = GraphComponent.__init__.__code__
    try:
        while frame is not None:
            if frame.f_code is code:
                return frame.f_locals.get("self"), frame.f_locals.get("pipeline_config")
            frame = frame.f_back
        return None, None
    finally:
        del frame


def default_pipeline() -> Any:
    """The pipeline KFP adds tasks to now (its ``tasks`` by name), or ``None`` outside a pipeline body."""
    return pipeline_context.Pipeline.get_default_pipeline()


def is_channel(value: Any) -> bool:
    """Whether ``value`` is known only when the run starts (a pipeline parameter or an upstream output)."""
    return isinstance(value, pipeline_channel.PipelineChannel)


def unique_task_name(component_name: str) -> str:
    """The name KFP gives the next task of a component named ``component_name`` in the pipeline being built."""
    pipeline = default_pipeline()
    name = utils.maybe_rename_for_k8s(component_name)
    unique: str = utils.make_name_unique_by_adding_index(name, list(pipeline.tasks) if pipeline else [], "-")
    return unique


def inputs_of(component: Any) -> dict[str, Any]:
    """A component's input specs by name (each with ``default`` and ``type``)."""
    return dict(component.component_spec.inputs or {})


def outputs_of(component: Any) -> dict[str, Any]:
    """A component's output specs by name."""
    return dict(component.component_spec.outputs or {})


def component_name(component: Any) -> str:
    """The name in a component's spec (what its tasks are named after)."""
    return str(component.component_spec.name)


def graph_spec(graph: Any) -> Any:
    """A pipeline's (``GraphComponent``'s) ``PipelineSpec``: what its ``pipeline_spec`` property returns."""
    return graph.component_spec.implementation.graph


def task_spec(task: Any) -> Any:
    """The ``PipelineSpec`` a task of a nested pipeline carries; ``None`` for a task of a plain component."""
    return getattr(task, "pipeline_spec", None)


def set_task_spec(task: Any, spec: Any) -> None:
    """Make ``task`` (of a nested pipeline) carry ``spec``: what the compiler reads for it."""
    task.pipeline_spec = spec


def set_task_config_passthroughs(component: Any, entries: list[dict[str, Any]]) -> None:
    """Set the TaskConfig passthroughs of a component YAML's ``taskConfigPassthroughs`` on the loaded ``component``."""
    component.component_spec.task_config_passthroughs = [
        dsl.TaskConfigPassthrough(field=dsl.TaskConfigField[e["field"]], apply_to_task=bool(e.get("applyToTask"))) for e in entries
    ]


def task_config_passthroughs(component: Any) -> list[Any]:
    """The TaskConfig passthroughs a component declares."""
    return list(getattr(component.component_spec, "task_config_passthroughs", None) or [])


def extend(obj: Any, mark: str, members: dict[str, Any]) -> bool:
    """Give ``obj`` (a component) a subclass of its class with ``members``, once per class and ``mark``.

    ``mark`` names the extension: an object whose class already carries it is left as it is.

    Returns:
        True when ``obj``'s class was replaced now; False when it was extended already.
    """
    cls = type(obj)
    if getattr(cls, mark, False):
        return False
    kept = f"_extended_{mark}"  # the subclass, made once, kept on the class it extends (not in a module-level registry)
    extended = cls.__dict__.get(kept)
    if extended is None:
        extended = type(cls.__name__, (cls,), {**members, "__module__": cls.__module__, mark: True})
        setattr(cls, kept, extended)
    obj.__class__ = extended
    return True
