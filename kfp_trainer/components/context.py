"""The KFP run context every launcher task needs, filled in at its call so a pipeline need not pass it.

A KFP backend (2.15-2.17) resolves ``dsl.PIPELINE_JOB_ID_PLACEHOLDER`` and friends only when
the *task* passes them: as a component's default value the placeholder reaches the step
unresolved. And it mounts the pipeline workspace only in steps that receive
``dsl.WORKSPACE_PATH_PLACEHOLDER`` (or ``/kfp-workspace``) as an input value. So a launcher
component made with :func:`~.calls.with_run_context` fills in, on every task created from it,

* ``run_id``, ``task_name``, ``task_id`` and ``pipeline_name`` with the KFP placeholders, and
* ``workspace_path`` with ``dsl.WORKSPACE_PATH_PLACEHOLDER`` when the pipeline being built
  declares a workspace (``dsl.PipelineConfig(workspace=...)``),

unless the call passes them itself (:func:`context_arguments`, called at each call by
:mod:`.calls`, which also checks the literal arguments and sets the launcher's defaults). The
compiled task then carries the placeholders, and ``train_job(runtime=..., image=..., command=...)``
works on a cluster as it is. (A launcher in a nested pipeline gets the enclosing pipeline's
workspace: :mod:`.nested`.)

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

from typing import Any

from kfp import dsl

from .kfp_internals import pipeline_being_built

# Inputs a launcher reads its identity from, and the placeholder each gets.
CONTEXT_INPUTS = {
    "run_id": dsl.PIPELINE_JOB_ID_PLACEHOLDER,
    "task_name": dsl.PIPELINE_TASK_NAME_PLACEHOLDER,
    "task_id": dsl.PIPELINE_TASK_ID_PLACEHOLDER,
    "pipeline_name": dsl.PIPELINE_JOB_NAME_PLACEHOLDER,
}
WORKSPACE_INPUT = "workspace_path"


def pipeline_workspace_declared() -> bool:
    """Whether the pipeline whose body is running now declares a workspace (False outside a pipeline body)."""
    _, config = pipeline_being_built()
    workspace = getattr(config, "workspace", None)
    return bool(getattr(workspace, "size", None))


def context_arguments(inputs: Any, given: dict[str, Any]) -> dict[str, Any]:
    """``given`` plus the context inputs the component declares and the call left out."""
    out = dict(given)
    for name, placeholder in CONTEXT_INPUTS.items():
        if name in inputs and name not in out:
            out[name] = placeholder
    if WORKSPACE_INPUT in inputs and WORKSPACE_INPUT not in out and pipeline_workspace_declared():
        out[WORKSPACE_INPUT] = dsl.WORKSPACE_PATH_PLACEHOLDER
    return out
