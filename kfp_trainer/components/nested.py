"""The workspace of an enclosing pipeline, for launcher tasks inside a nested ``@dsl.pipeline``.

A pipeline used as a step of another is built once, when its ``@dsl.pipeline`` runs, usually
without a workspace of its own; KFP refuses ``dsl.WORKSPACE_PATH_PLACEHOLDER`` there. Its
launcher tasks are noted on it instead (:func:`await_workspace`), and each time the pipeline is
called inside one that declares a workspace, the task KFP makes for it gets a copy of its
spec in which those tasks receive ``workspace_path=dsl.WORKSPACE_PATH_PLACEHOLDER`` -- as tasks
of the outer pipeline get it (:mod:`.context`); the nested pipeline itself is left as it was.
A pipeline nested in a pipeline without a workspace passes the note on to it.

A noted task that needs the volume on a cluster (its step's error, from
:func:`kfp_trainer.steps.workspace_need.shared_volume_need`) and still has neither a workspace
nor a PVC when its pipeline is compiled fails the compilation with that error.
"""

from __future__ import annotations

from typing import Any

from kfp import dsl
from kfp.pipeline_spec import pipeline_spec_pb2

from .context import WORKSPACE_INPUT, pipeline_workspace_declared
from .kfp_internals import extend, graph_spec, pipeline_being_built, set_task_spec, task_spec

_PENDING = "_kfp_trainer_awaiting_workspace"  # task names, on the GraphComponent
_NEEDS = "_kfp_trainer_workspace_needs"  # (where, task, the step's error) of tasks that need it, on the GraphComponent


def await_workspace(task: Any, need: Any = None) -> None:
    """Note ``task`` (in a pipeline without a workspace) on the pipeline being built; ``need``: its error without one."""
    graph, _ = pipeline_being_built()
    where = f"task {task.name!r}" + (f" (of pipeline {graph.name!r})" if graph is not None else "")
    _note(graph, {task.name}, [(where, task, need)] if need is not None else [])


def _note(graph: Any, names: set[str], needs: list[Any] | None = None) -> None:
    if graph is None or not names:
        return
    pending = graph.__dict__.setdefault(_PENDING, set())
    pending.update(names)
    graph.__dict__.setdefault(_NEEDS, []).extend(needs or [])
    extend(graph, _PENDING, {"__call__": _call, "pipeline_spec": property(_checked_spec)})


def _checked_spec(self: Any) -> Any:
    """The pipeline's spec (what ``Compiler.compile`` reads), refused while a task that needs the workspace lacks it."""
    needs = self.__dict__.get(_NEEDS)
    if needs:
        from kfp_trainer.steps.workspace_need import refuse_missing_workspace

        refuse_missing_workspace(self.name, needs)
    return graph_spec(self)


def _call(self: Any, *args: Any, **kwargs: Any) -> Any:
    task = super(type(self), self).__call__(*args, **kwargs)
    names = set(self.__dict__.get(_PENDING) or ())
    if names and task_spec(task) is not None:
        if pipeline_workspace_declared():
            set_task_spec(task, with_workspace(task_spec(task), names))
        else:
            _note(pipeline_being_built()[0], names, self.__dict__.get(_NEEDS))
    return task


def with_workspace(spec: Any, names: set[str]) -> Any:
    """A copy of ``spec`` where the launcher tasks named ``names`` receive the workspace placeholder."""
    out = pipeline_spec_pb2.PipelineSpec()
    out.CopyFrom(spec)
    dags = [out.root.dag] + [c.dag for c in out.components.values() if c.HasField("dag")]
    for dag in dags:
        for name, task in dag.tasks.items():
            if name not in names or WORKSPACE_INPUT in task.inputs.parameters:
                continue
            component = out.components.get(task.component_ref.name)
            if component is None or WORKSPACE_INPUT not in component.input_definitions.parameters:
                continue
            task.inputs.parameters[WORKSPACE_INPUT].runtime_value.constant.string_value = dsl.WORKSPACE_PATH_PLACEHOLDER
    return out
