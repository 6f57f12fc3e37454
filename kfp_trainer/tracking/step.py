"""A launcher step's MLflow run: opened before the TrainJob, told what the launcher learns, closed with its outcome.

:meth:`StepTracking.open` finds the run (see :mod:`.settings`): KFP's plugin's run for the task,
or the step's own one -- the run an earlier try of the same task made (tagged
``kfp_trainer.task``, stable across retries), else a new one. The TrainJob's trainer nodes get
its id (:meth:`StepTracking.prepared`) and log params, per-step metrics and system tags into it
from rank 0 (:mod:`.trainer`); the launcher adds the TrainJob (name, uid, runtime, Trainer API,
nodes, queue), the seconds queued, starting and running, the final metrics it parsed, the
preemptions and the HTML report. The run ends ``FINISHED``, ``FAILED``, or ``KILLED`` when the
step was cancelled.

Tracking never fails a step, and never holds it up while the job runs: once the run is open,
the writes go to a background sender (:mod:`.sender`) that keeps them while the server does not
answer and sends them when it answers again. At the end, the final metrics, the report and the
run's status wait for the server up to ``KFP_TRAINER_MLFLOW_FLUSH_SECONDS`` (120 s; 5 s for a
cancelled step, which has a grace period to keep). A server that cannot be reached when the run
is opened, or a refusal, is one warning in the step's log and the step goes on without it.
"""

from __future__ import annotations

import copy
import dataclasses
import os
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..errors import CancelledError
from ..redaction import redact_text, redact_uri
from . import settings

if TYPE_CHECKING:
    from .client import MlflowClient

TASK_TAG = "kfp_trainer.task"  # the task's key (run, task, loop iteration, inputs): the same on every try
KFP_RUN_TAG = "kfp.pipeline_run_id"  # the tag KFP's plugin sets on the pipeline's run
KFP_RUN_URL_TAG = "kfp.pipeline_run_url"
PARENT_TAG = "mlflow.parentRunId"
EXPERIMENT_TAGS = {"mlflow.experimentKind": "custom_model_development"}  # a new experiment opens in the UI's model-training view


def run_url(uri: str, experiment_id: str, run_id: str) -> str:
    """The MLflow UI's page of a run.

    Example:
        >>> run_url("http://mlflow:5000", "1", "abc")
        'http://mlflow:5000/#/experiments/1/runs/abc'
    """
    return f"{redact_uri(uri.rstrip('/'))}/#/experiments/{experiment_id}/runs/{run_id}"


@dataclasses.dataclass
class StepRun:
    """The run a step logs into."""

    run_id: str
    experiment_id: str
    artifact_uri: str
    continued: bool = False  # an earlier try's run, reopened


class StepTracking:
    """One step's MLflow run; every method a no-op once tracking is off. See the module docstring."""

    def __init__(self, target: settings.Target | None = None, client: MlflowClient | None = None, run: StepRun | None = None,
                 *, say: Callable[[str], None] = print, flush_seconds: float = 120.0) -> None:  # fmt: skip
        self.target, self.client, self.run = target, client, run
        self.say = say
        self.flush_seconds = flush_seconds
        self.sender: Any = None

    @property
    def enabled(self) -> bool:
        """Whether the step logs to MLflow (a server, a run, no refusal so far)."""
        return self.client is not None and self.run is not None and self.sender is not None and self.sender.enabled

    @classmethod
    def open(
        cls,
        *,
        tracking_uri: str | None,
        experiment: str | None,
        env: Any,
        identity: Mapping[str, str],
        say: Callable[[str], None],
        process_env: Mapping[str, str] | None = None,
        client_factory: Callable[..., MlflowClient] | None = None,
    ) -> StepTracking:
        """Open the step's run; a disabled tracker when tracking is off or MLflow cannot be used.

        Args:
            tracking_uri: The component's ``mlflow_tracking_uri`` (checked already).
            experiment: The component's ``mlflow_experiment``.
            env: The TrainJob's env input (the task's env merged in): its literal values count.
            identity: ``run_id``, ``task_name``, ``pipeline_name``, ``key`` (the task's key) and ``component``.
            say: Writes a line to the step's log.
            process_env: The step's environment (default ``os.environ``): credentials come from here.
            client_factory: Makes the client (a test hook).
        """
        process_env = os.environ if process_env is None else process_env
        combined = {**process_env, **settings.literal_env(env)}
        target = settings.resolve_target(tracking_uri=tracking_uri, experiment=experiment, env=combined)
        if target is None:
            return cls(say=say)  # tracking off: the REST client is not even imported
        from .client import MlflowClient, MlflowError

        client = (client_factory or MlflowClient)(target.uri, env=combined, workspace=target.workspace, timeout=20.0, attempts=2)
        tracking = cls(target, client, say=say, flush_seconds=settings.flush_seconds(process_env, 120.0))
        try:
            tracking.run = tracking._open_run(identity)
        except (MlflowError, OSError, ValueError, KeyError) as e:
            tracking._off(e)
            return tracking
        from .sender import Sender

        tracking.sender = Sender(client, tracking.run.run_id, say=lambda text: say(f"warning: {text}"))
        for note in settings.credential_notes(target, process_env=process_env, task_env=env):
            say(f"MLflow: {note}")
        run = tracking.run
        what = "logging into the task's run" if not target.owns_run else "run"
        what = "continuing the run of an earlier try" if run.continued else what
        say(f"MLflow: {what} {run.run_id} at {run_url(target.uri, run.experiment_id, run.run_id)}")
        return tracking

    def _open_run(self, identity: Mapping[str, str]) -> StepRun:
        assert self.target is not None and self.client is not None
        target, client = self.target, self.client
        tags = {
            KFP_RUN_TAG: identity.get("run_id", ""), "kfp.task_name": identity.get("task_name", ""),
            "kfp.pipeline_name": identity.get("pipeline_name", ""), TASK_TAG: identity.get("key", ""),
            "mlflow.source.type": "JOB", "mlflow.source.name": f"kfp-trainer {identity.get('component', 'train_job')}",
        }  # fmt: skip
        tags = {k: v for k, v in tags.items() if v}
        if not target.owns_run:
            info = client.get_run(target.run_id)["info"]
            run = StepRun(target.run_id, str(info["experiment_id"]), str(info.get("artifact_uri", "")))
            if info.get("status") != "RUNNING":
                client.update_run(run.run_id, "RUNNING")
            client.log_batch(run.run_id, tags={k: v for k, v in tags.items() if not k.startswith("mlflow.")})
            return run
        experiment_id = target.experiment_id or client.experiment_id(target.experiment_name, tags=EXPERIMENT_TAGS)
        name = "/".join(p for p in (identity.get("pipeline_name", ""), identity.get("task_name", "")) if p) or "train-job"
        if not tags.get(TASK_TAG):
            info = client.create_run(experiment_id, name=name, tags=tags)
            return StepRun(str(info["run_id"]), experiment_id, str(info.get("artifact_uri", "")))
        info, earlier = client.find_or_create_run(experiment_id, name=name, tags=tags, key=TASK_TAG)  # one run per task, over retries
        run = StepRun(str(info["run_id"]), experiment_id, str(info.get("artifact_uri", "")), continued=earlier)
        if earlier:
            client.update_run(run.run_id, "RUNNING")
        return run

    def _off(self, error: BaseException) -> None:
        """Turn tracking off after its first problem, with one warning."""
        uri = redact_uri(self.target.uri) if self.target else "?"
        self.say(f"warning: MLflow tracking is off for the rest of this step ({uri}): {redact_text(str(error))}; the training goes on")
        self.client = None

    def _end(self, timeout: float) -> None:
        """Wait up to ``timeout`` seconds for the queued writes to reach the server, then stop sending."""
        sender, self.sender = self.sender, None
        if sender is not None:
            sender.close(timeout)

    # ----------------------------------------------------------------- the step's stages

    def trainer_env(self) -> list[dict[str, str]]:
        """The variables that point the trainer nodes at this run (none when tracking is off)."""
        if not self.enabled or self.target is None or self.run is None:
            return []
        return settings.trainer_env(self.target, run_id=self.run.run_id, experiment_id=self.run.experiment_id)

    def lineage(self) -> dict[str, str]:
        """The run, for the model's metadata (:mod:`.registry` links a model version to it); empty without one."""
        if self.run is None or self.target is None:
            return {}
        return {"mlflow_run_id": self.run.run_id, "mlflow_experiment_id": self.run.experiment_id,
                "mlflow_tracking_uri": redact_uri(self.target.uri)}  # fmt: skip

    def prepared(self, job: Any) -> Any:
        """``job`` (a :class:`~kfp_trainer.prepare.PreparedJob`) with the trainer env pointing at this run.

        The TrainJob's name does not depend on these variables
        (:meth:`~kfp_trainer.spec.TrainJobInputs.digest`), so a retried step adopts its job
        whatever run it logs into.
        """
        items = self.trainer_env()
        if not items:
            return job
        manifest = copy.deepcopy(job.manifest)
        trainer = manifest.setdefault("spec", {}).setdefault("trainer", {})
        trainer["env"] = settings.merge_env(trainer.get("env") or [], items)
        return dataclasses.replace(job, manifest=manifest)

    def submitted(self, ref: Any, job: Any) -> None:
        """Tag the run with the TrainJob as soon as it exists."""
        runtime = getattr(job, "runtime", None)
        tags = {
            "kfp_trainer.trainjob": str(ref), "kfp_trainer.trainjob_uid": getattr(ref, "uid", ""),
            "kfp_trainer.runtime": getattr(job, "runtime_name", ""), "kfp_trainer.trainer_api": getattr(job, "api_version", ""),
            "kfp_trainer.nodes": str(getattr(runtime, "nodes", "") or ""),
            "kfp_trainer.image": str((job.manifest.get("spec", {}).get("trainer") or {}).get("image", "")) if job is not None else "",
        }  # fmt: skip
        tags["mlflow.note.content"] = (
            f"TrainJob `{ref}` ({tags['kfp_trainer.runtime']}, {tags['kfp_trainer.nodes'] or '?'} nodes), "
            "started by kfp-trainer; its trainer logs into this run from rank 0."
        )
        if self.enabled:
            self.sender.tags({k: v for k, v in tags.items() if v})

    def finished(
        self, outcome: Any, *, metrics: Mapping[str, Any], report: str | Path | None, files: Mapping[str, str | Path] | None = None,
    ) -> None:
        """After success: the final metrics, times and preemptions, the report and ``files`` (``{name: path}``); the run ``FINISHED``."""
        if not self.enabled:
            return
        assert self.client is not None and self.run is not None
        client, run_id = self.client, self.run.run_id
        series: Any = getattr(outcome, "metrics", None)
        points = [p for name in (series.names() if series else []) for p in series.series(name)]
        positions = [p.step if p.step is not None else p.epoch for p in points]
        step = int(max((x for x in positions if x is not None), default=0))  # the last point the trainer printed: curves end there
        from .client import metric

        values = [metric(k, v, step=step) for k, v in sorted(metrics.items()) if _number(v)]
        values.append(metric("preemptions", getattr(outcome, "preemptions", 0) or 0, step=step))
        tags = {
            "kfp_trainer.queue": getattr(outcome, "queue", ""), "kfp_trainer.log_lines": str(getattr(outcome, "log_lines", 0)),
            "kfp_trainer.adopted": str(bool(getattr(outcome, "adopted", False))).lower(),
        }  # fmt: skip
        self.sender.metrics(values)
        self.sender.tags({k: v for k, v in tags.items() if v})
        uploads = {"report.html": report} if report else {}
        for name, local in {**uploads, **dict(sorted((files or {}).items()))}.items():
            if Path(local).is_file():
                self.sender.call(lambda name=name, local=local: self._upload(local, name), f"the upload of {name}")
        self.sender.call(lambda: client.update_run(run_id, "FINISHED"), "the run's status FINISHED")
        self._end(self.flush_seconds)

    def _upload(self, local: str | Path, name: str) -> None:
        assert self.client is not None and self.run is not None
        uri = self.run.artifact_uri or self.client.get_run(self.run.run_id)["info"]["artifact_uri"]
        path = self.client.artifact_url_path(uri, name)
        kind = {".html": "text/html", ".jsonl": "application/x-ndjson", ".json": "application/json"}.get(Path(name).suffix, "text/plain")
        self.client.request("PUT", path, body=Path(local), content_type=kind)  # streamed from the file

    def failed(self, error: BaseException) -> None:
        """The run ``FAILED`` (``KILLED`` for a cancelled step), with what happened as a tag."""
        if not self.enabled:
            return
        assert self.client is not None and self.run is not None
        client, run_id = self.client, self.run.run_id
        status = "KILLED" if isinstance(error, (CancelledError, KeyboardInterrupt)) else "FAILED"
        message = redact_text(f"{type(error).__name__}: {error}")[:2000]
        self.sender.tags({"kfp_trainer.error": message})
        self.sender.call(lambda: client.update_run(run_id, status), f"the run's status {status}")
        self._end(min(self.flush_seconds, 5.0) if status == "KILLED" else self.flush_seconds)  # a cancel has a grace period to keep

    @contextmanager
    def ending(self) -> Iterator[StepTracking]:
        """Mark the run failed or killed when the block raises (the error goes on)."""
        try:
            yield self
        except BaseException as e:
            self.failed(e)
            raise


def _number(value: Any) -> bool:
    import math

    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
