"""The values a launcher step passes between its stages, and the typed-trainer contract. Pure: no I/O.

* :class:`StepArtifacts` -- the step's input and output artifacts;
* :class:`StepOptions` -- the launcher's own inputs (backend, limits, logs, workspace, task settings, tracking);
* :class:`TrainerContext` and :class:`TypedTrainer` -- what a trainer described by typed settings
  (the torchtune fine-tune, TRL, a Python function) is given and implements.

Example:
    >>> options = StepOptions.of({"backend": "local", "start_timeout": 60, "runtime": "torch-distributed"})
    >>> options.backend, options.start_timeout, options.logs
    ('local', 60, '0')
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from ..backends.base import RuntimeInfo
    from ..spec import TrainJobInputs


@dataclass
class StepArtifacts:
    """The step's input and output artifacts, and the file that gets the TrainJob's ``namespace/name``."""

    output_model: Any
    metrics: Any
    report: Any
    trainjob_path: str
    dataset: Any = None
    model: Any = None

    @classmethod
    def of(cls, values: Mapping[str, Any]) -> StepArtifacts:
        """The artifacts among a component's values by name (``trainjob`` is the output path)."""
        return cls(
            output_model=values.get("output_model"), metrics=values.get("metrics"), report=values.get("report"),
            trainjob_path=str(values.get("trainjob") or ""), dataset=values.get("dataset"), model=values.get("model"),
        )  # fmt: skip

    def write_trainjob(self, ref: Any) -> None:
        """Write ``namespace/name`` to the ``trainjob`` output (as soon as the job is known)."""
        Path(self.trainjob_path).parent.mkdir(parents=True, exist_ok=True)
        Path(self.trainjob_path).write_text(str(ref))


@dataclass(frozen=True)
class StepOptions:
    """The launcher's own inputs of a step (checked when the step runs; 0 = no limit)."""

    backend: str = "auto"  # auto, local or kubernetes
    workspace_path: str = ""  # the KFP workspace path (dsl.WORKSPACE_PATH_PLACEHOLDER) or ""
    start_timeout: float = 3600.0
    run_timeout: float = 0.0
    queue_timeout: float = 0.0
    logs: str = "0"  # trainer node whose log is streamed, "all" or "none"
    delete_after_success: bool = False
    metric_names: str = ""  # the metrics to keep (kfp_trainer.metrics.MetricFilter); "" every one
    task_config: Any = None  # the task's dsl.TaskConfig (empty under kfp.local)
    mlflow_tracking_uri: str | None = None  # where the step tracks its training (kfp_trainer.tracking); None: MLFLOW_TRACKING_URI
    mlflow_experiment: str | None = None  # the experiment of the step's own MLflow run

    @classmethod
    def of(cls, values: Mapping[str, Any], **fixed: Any) -> StepOptions:
        """The options among a component's values by name; ``fixed`` for those the component does not take."""
        names = {f.name for f in dataclasses.fields(cls)}
        return cls(**{**{k: v for k, v in values.items() if k in names}, **fixed})


@dataclass
class TrainerContext:
    """Where a typed trainer's TrainJob runs, for :class:`TypedTrainer` hooks.

    ``shared_root`` is the volume shared with the TrainJob's pods (cluster only); ``key`` names
    this task's folder on it (stable across retries of the step); ``local`` tells the local
    backend. Hooks add report rows to ``report``, report tables to ``tables`` (see
    :func:`kfp_trainer.report.render_html`), model metadata to ``metadata``, and files for the
    step's MLflow run to ``tracked_files`` (``{name in the run: local path}``).
    """

    local: bool
    shared_root: str | None
    key: str
    workspace_path: str
    output_model: Any
    dataset: Any = None
    model: Any = None
    report: dict[str, str] = field(default_factory=dict)
    metadata: dict[str, Any] = field(default_factory=dict)
    tables: list[dict[str, Any]] = field(default_factory=list)
    tracked_files: dict[str, str] = field(default_factory=dict)


class TypedTrainer:
    """A trainer described by typed settings instead of a command; the hooks the step calls, in order.

    :meth:`configure` and :meth:`finalize` run inside :func:`~kfp_trainer.prepare.prepare`, once
    the runtime is read; :meth:`before_launch` once every input has been checked; :meth:`collect`
    after the job succeeded. The defaults do nothing.
    """

    def identity(self) -> dict[str, Any]:
        """The settings that make two tries the same job (part of the task's folder name)."""
        return {}

    def source_inputs(self) -> dict[str, Any]:
        """TrainJob inputs known before the runtime is read (e.g. initializer URIs), checked with the step's."""
        return {}

    def configure(self, ctx: TrainerContext, runtime: RuntimeInfo, inputs: TrainJobInputs) -> dict[str, Any]:
        """TrainJob inputs for ``runtime``, to set on ``inputs``; reads only, writes nothing.

        ``{dataset}``, ``{model}`` and ``{output_model}`` in the returned command, args or env
        are planned as for ``train_job`` (staged on the shared volume, copied out after success).
        """
        return {}

    def finalize(self, ctx: TrainerContext, runtime: RuntimeInfo, paths: dict[str, str]) -> dict[str, Any]:
        """Last TrainJob input changes, once the placeholders' paths (``paths``) are known."""
        return {}

    def before_launch(self, ctx: TrainerContext) -> None:
        """Writes (folders on the shared volume) once every input has been checked."""

    def collect(self, ctx: TrainerContext, outcome: Any) -> None:
        """After success: fill ``ctx.output_model`` and add metrics, metadata and report rows."""
