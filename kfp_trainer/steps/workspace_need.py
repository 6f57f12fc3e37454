"""Whether a step needs a volume shared with its TrainJob, as far as a pipeline knows when it is built.

On a cluster a TrainJob's pods cannot see the launcher's files: the artifacts behind
``{dataset}``, ``{model}`` and ``{output_model}``, a fine-tune's model and a training
function's ``output_dir`` travel on a volume both mount -- the pipeline workspace, or a PVC
mounted on the task. Without one the step refuses to start, but only when it runs, after the
steps before it. :func:`shared_volume_need` tells, from a call's literal values, whether the
step will need that volume and, if so, returns the error the step would raise;
:mod:`kfp_trainer.components.nested` keeps it until the pipeline is compiled, and
:func:`refuse_missing_workspace` then fails the compilation for every such task that neither
got a workspace (its own pipeline's or an enclosing one's) nor a PVC
(``kfp.kubernetes.mount_pvc``).

Example:
    >>> shared_volume_need("train_job", {"args": ["--out", "{output_model}"], "backend": "auto"}, None).field
    'workspace_path'
    >>> shared_volume_need("train_job", {"args": ["--epochs", "3"], "backend": "auto"}, None) is None
    True
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from types import SimpleNamespace
from typing import Any

from ..errors import InvalidSpecErrors, ValidationError
from .finetune import TorchTuneFinetune


def _run_time_error(kind: str) -> ValidationError:
    """The error the step raises on a cluster without a shared volume, obtained from the step's own code."""
    if kind == "torchtune_finetune":
        ctx: Any = SimpleNamespace(local=False, shared_root=None, key="", output_model=None)  # what _output reads before refusing
        no_inputs: Any = None
        try:
            TorchTuneFinetune(None)._output(ctx, no_inputs)
        except ValidationError as e:
            return e
    else:
        from ..staging import plan_paths

        try:
            plan_paths({"args": ["{output_model}"]}, local=False, artifacts={}, output_model="", shared_root=None, key="")
        except ValidationError as e:
            return e
    raise AssertionError(f"the {kind} step no longer refuses a job without a shared volume")  # pragma: no cover


def _has_pvc(values: Mapping[str, Any]) -> bool:
    """Whether the call's own volumes and mounts give the step a PVC it shares with the TrainJob."""
    from ..staging import choose_shared_root

    mounts, volumes = values.get("volume_mounts"), values.get("volumes")
    if not isinstance(mounts, list) or not isinstance(volumes, list):
        return False
    return choose_shared_root("", mounts, volumes) is not None


def shared_volume_need(kind: str, values: Mapping[str, Any], function: Mapping[str, Any] | None) -> ValidationError | None:
    """The step's error for a missing shared volume if its literal ``values`` need one on a cluster, else ``None``.

    ``None`` also when the pipeline cannot tell: the command is a pipeline parameter, or the
    step runs on the local backend.
    """
    if values.get("backend") == "local" or _has_pvc(values):
        return None
    if kind == "train_job":
        from ..spec.placeholders import placeholders_in

        needed = bool(placeholders_in({k: values.get(k) for k in ("command", "args", "env")}))
    elif kind == "function":
        needed = bool((function or {}).get("specials"))
    else:
        needed = kind in ("torchtune_finetune", "trl_finetune")
    return _run_time_error(kind) if needed else None


def _mounts_pvc(task: Any) -> bool:
    """Whether ``task`` got a PVC with ``kfp.kubernetes.mount_pvc`` (it reaches the TrainJob through the task config)."""
    kubernetes = (getattr(task, "platform_config", None) or {}).get("kubernetes") or {}
    return bool(kubernetes.get("pvcMount"))


def refuse_missing_workspace(pipeline: str, needs: Sequence[tuple[str, Any, ValidationError]]) -> None:
    """Fail when a task of ``needs`` (``(where, task, error)``) has no PVC either, with each step's message.

    Raises:
        InvalidSpecErrors: The steps' errors; a note names the tasks and how to give them the volume.
    """
    missing = [(where, error) for where, task, error in needs if not _mounts_pvc(task)]
    if not missing:
        return
    errors: list[ValidationError] = []
    for _, error in missing:
        if all(str(error) != str(e) for e in errors):
            errors.append(error)
    refused = InvalidSpecErrors(errors)
    if hasattr(refused, "add_note"):  # Python 3.11+
        tasks = ", ".join(where for where, _ in missing)
        refused.add_note(
            f"pipeline {pipeline!r} has no workspace, and on a cluster {tasks} would refuse to start (after the steps before "
            "them ran): give the pipeline one, @dsl.pipeline(pipeline_config=kfp_trainer.components.workspace_config('10Gi')), "
            "or mount a PVC on each such task with kfp.kubernetes.mount_pvc(task, pvc_name=..., mount_path=...); "
            "refused when the pipeline was compiled"
        )
    raise refused
