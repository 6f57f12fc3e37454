"""Logging from inside a TrainJob into the step's MLflow run: global rank 0 only. Standard library only.

The launcher points the trainer nodes at the step's run (``MLFLOW_TRACKING_URI``,
``MLFLOW_RUN_ID``, ...; :mod:`.settings`); KFP's MLflow plugin does the same for the task's run.
The project's trainers log through :func:`log_params` (their settings, once) and every JSON
line they print (:func:`kfp_trainer.trainers._common.emit`): its numbers become metrics at its
``step`` (per-step loss, learning rate, evaluation metrics, the final summary). With the first
metrics the run also gets system tags: the trainer, the host, the world size, Python's and
torch's versions, the device. Without those variables, or on another rank, every call is a no-op.

Logging never waits on the server: the writes go to a background sender (:mod:`.sender`), which
batches them, keeps them while the server does not answer, and sends them when it answers again;
at the trainer's exit it waits for them up to ``KFP_TRAINER_MLFLOW_FLUSH_SECONDS`` (30 s). A
trainer never fails for tracking: a refusal is one warning on stderr and logging stops; a params
conflict (an earlier try logged other values) only skips the params.

Example:
    >>> logger = RunLogger(env={"RANK": "0"})  # no MLFLOW_TRACKING_URI / MLFLOW_RUN_ID
    >>> logger.enabled, logger.log_record({"step": 1, "loss": 0.5})
    (False, False)
    >>> metrics_of({"step": 20, "epoch": 0.5, "loss": 0.25, "note": "x", "ok": True})
    (20, {'epoch': 0.5, 'loss': 0.25})
    >>> metrics_of({"epoch": 3, "val_accuracy": 0.9})
    (3, {'epoch': 3.0, 'val_accuracy': 0.9})
"""

from __future__ import annotations

import atexit
import math
import os
import platform
import re
import socket
import sys
import threading
from collections.abc import Callable, Mapping
from typing import Any

from . import settings

_NOT_METRICS = frozenset({"step", "global_step", "rank", "local_rank", "node_rank", "pid", "port"})
_BAD_KEY = re.compile(r"[^A-Za-z0-9_\-. /]")


def reporting_rank(env: Mapping[str, str]) -> bool:
    """Whether this process is global rank 0 (torchrun, MPI) or alone.

    Example:
        >>> reporting_rank({"RANK": "1"}), reporting_rank({})
        (False, True)
    """
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if env.get(name) not in (None, ""):
            return env[name] == "0"
    return True


def metrics_of(record: Mapping[str, Any]) -> tuple[int | None, dict[str, float]]:
    """The step of a JSON line (``step``, ``global_step``, else a whole ``epoch``) and its metrics (finite numbers)."""
    step = record.get("step", record.get("global_step"))
    epoch = record.get("epoch")
    if step is None and isinstance(epoch, (int, float)) and not isinstance(epoch, bool) and float(epoch).is_integer():
        step = epoch  # per-epoch trainers (digits): one point per epoch
    numbers = {}
    for key, value in record.items():
        if key in _NOT_METRICS or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if math.isfinite(value):
            numbers[_BAD_KEY.sub("_", str(key))[:250]] = float(value)
    return (int(step) if isinstance(step, (int, float)) and not isinstance(step, bool) and math.isfinite(step) else None), numbers


class RunLogger:
    """Logs into the run named by ``MLFLOW_RUN_ID`` from global rank 0. See the module docstring.

    Args:
        env: The environment to read (default ``os.environ``).
        client: The REST client (default: a :class:`~kfp_trainer.tracking.client.MlflowClient` of ``MLFLOW_TRACKING_URI``).
        warn: Writes a line (default: on stderr).
        at_exit: Flush at the interpreter's exit (what a trainer wants; not a logger made for a test).
    """

    def __init__(
        self, *, env: Mapping[str, str] | None = None, client: Any = None, warn: Callable[[str], None] | None = None,
        at_exit: bool = True,
    ) -> None:  # fmt: skip
        env = os.environ if env is None else env
        self.run_id = (env.get(settings.RUN_ID) or "").strip()
        uri = (env.get(settings.TRACKING_URI) or "").strip()
        self._env = env
        self._warn = warn or (lambda text: print(f"[kfp-trainer] {text}", file=sys.stderr, flush=True))
        self.flush_seconds = settings.flush_seconds(env, 30.0)
        self.sender: Any = None
        if self.run_id and uri.startswith(("http://", "https://")) and reporting_rank(env):
            from .client import MlflowClient
            from .sender import Sender

            # One try per request: the sender keeps what a server that does not answer missed, and tries again.
            self.sender = Sender(client or MlflowClient(uri, env=env, timeout=10.0, attempts=1), self.run_id, say=self._warn)
            if at_exit:
                atexit.register(self.close)
        self._lock = threading.Lock()
        self._tagged = False
        self._trainer = ""
        self._last_step = 0

    @property
    def enabled(self) -> bool:
        """Whether this process logs (rank 0, a run to log into, no refusal so far)."""
        return self.sender is not None and self.sender.enabled

    def _system_tags(self, trainer: str) -> dict[str, str]:
        torch = sys.modules.get("torch")
        tags = {
            "kfp_trainer.trainer": trainer, "kfp_trainer.host": socket.gethostname(),
            "kfp_trainer.world_size": self._env.get("WORLD_SIZE", "1"), "kfp_trainer.python": platform.python_version(),
            "kfp_trainer.torch": str(getattr(torch, "__version__", "")) if torch else "",
        }  # fmt: skip
        if torch is not None:
            try:
                tags["kfp_trainer.device"] = "cuda" if torch.cuda.is_available() else "cpu"
            except Exception:  # noqa: BLE001 - a tag is not worth a failure
                pass
        return {k: v for k, v in tags.items() if v}

    def log_params(self, params: Mapping[str, Any], *, trainer: str = "") -> bool:
        """Queue the trainer's settings (``trainer`` names it in the system tags); True when queued."""
        if not self.enabled:
            return False
        with self._lock:
            self._trainer = trainer or self._trainer
            shown = {str(k): v for k, v in params.items() if v is not None and not callable(v)}
            return bool(self.sender.params(_scrubbed(shown)))

    def log_record(self, record: Mapping[str, Any]) -> bool:
        """Queue the numbers of one JSON line as metrics at its step (the last step seen when it has none); never waits on the server."""
        if not self.enabled:
            return False
        step, numbers = metrics_of(record)
        if not numbers:
            return False
        from .client import metric

        with self._lock:
            if not self._tagged:  # with the first metrics: torch is loaded by then (its version, the device)
                self._tagged = True
                self.sender.tags(self._system_tags(self._trainer or os.path.basename(sys.argv[0] or "trainer")))
            if step is not None:
                self._last_step = step
            return bool(self.sender.metrics([metric(k, v, step=self._last_step) for k, v in numbers.items()]))

    def close(self) -> bool:
        """Wait for what is queued to reach the server (``KFP_TRAINER_MLFLOW_FLUSH_SECONDS``, default 30 s); True when it all did."""
        if self.sender is None:
            return True
        sender, self.sender = self.sender, None
        return bool(sender.close(self.flush_seconds))


def _scrubbed(params: Mapping[str, Any]) -> dict[str, Any]:
    """Params fit to store: secret-like names and values hidden (a token passed as a flag stays out of MLflow)."""
    from ..redaction import scrub

    scrubbed: dict[str, Any] = scrub(dict(params))
    return scrubbed


_default: RunLogger | None = None


def default() -> RunLogger:
    """The process-wide logger, built from ``os.environ`` on first use."""
    global _default
    if _default is None:
        _default = RunLogger()
    return _default


def log_params(params: Mapping[str, Any], *, trainer: str = "") -> bool:
    """:meth:`RunLogger.log_params` on the process-wide logger."""
    return default().log_params(params, trainer=trainer)


def log_record(record: Mapping[str, Any]) -> bool:
    """:meth:`RunLogger.log_record` on the process-wide logger."""
    return default().log_record(record)
