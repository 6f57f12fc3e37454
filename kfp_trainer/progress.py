"""Report training progress to the Kubeflow Trainer v2.3 status server. Standard library only.

With the ``TrainJobStatus`` feature gate on, the Trainer's controller manager serves
``POST /apis/trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`` over TLS
(port 10443 of its webhook Service) and copies what it receives into the TrainJob's
``status.trainerStatus``. It gives every trainer container three variables:

* ``KUBEFLOW_TRAINER_SERVER_URL``: the full URL of that endpoint for this TrainJob;
* ``KUBEFLOW_TRAINER_SERVER_CA_CERT``: a file with the CA that signed the server's certificate;
* ``KUBEFLOW_TRAINER_SERVER_TOKEN``: a file with a projected service-account token whose audience
  is ``trainer.kubeflow.org/v1alpha1/namespaces/<ns>/trainjobs/<name>/status`` (the kubelet
  renews it; it is read again before each request), sent as ``Authorization: Bearer``.

The body is an ``UpdateTrainJobStatusRequest``: ``{"trainerStatus": {"progressPercentage": 0-100,
"estimatedRemainingSeconds": >=0, "metrics": [{"name", "value"}], "lastUpdatedTime": RFC 3339}}``;
metric names and values are strings of 1-64 characters, at most 256 metrics, and the server
refuses bodies over 64 KiB. :func:`build_payload` keeps within all of that.

Without those variables (local mode, older Trainer, gate off) every call is a no-op that returns
False. A failed report never raises: training must not die because progress could not be shown.

What a cluster needs for reports to arrive (Trainer v2.3.0):

* the manager started with ``--feature-gates=TrainJobStatus=true`` (or ``featureGates:
  {TrainJobStatus: true}`` in its config file); only then does it add the status server and the
  plugin that injects the variables and mounts ``/var/run/secrets/kubeflow/trainer`` (a projected
  volume: the token, and ``ca.crt`` from the ConfigMap ``<trainjob>-tls-config`` that the plugin
  copies from the webhook certificate Secret);
* the webhook Service exposing port 10443 (``statusServer.port``) next to the webhook port;
  the URL is ``https://<webhookServiceName>.<manager namespace>.svc:10443/apis/...``;
* the manager able to verify tokens: it reads the issuer from its own service-account token and
  fetches the API server's OIDC discovery (``/.well-known/openid-configuration``, JWKS) with its
  credentials (the default ``system:service-account-issuer-discovery`` binding covers this), and
  to server-side-apply ``trainjobs/status`` (its existing role); the pods need no extra RBAC;
* a kubelet that mounts projected service-account tokens (KWOK pods get none: there, a test
  mints one with the TokenRequest API, audience :func:`token_audience`, and calls the server).

Example:
    >>> reporter = ProgressReporter(env={})
    >>> reporter.enabled, reporter.report(50, 120, {"loss": 0.25})
    (False, False)
    >>> build_payload(150, -3, {"loss": 0.25}, now=0.0)["trainerStatus"]
    {'progressPercentage': 100, 'estimatedRemainingSeconds': 0, 'metrics': [{'name': 'loss', 'value': '0.25'}], \
'lastUpdatedTime': '1970-01-01T00:00:00Z'}
"""

from __future__ import annotations

import json
import logging
import math
import os
import ssl
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

ENV_URL = "KUBEFLOW_TRAINER_SERVER_URL"
ENV_CA_CERT = "KUBEFLOW_TRAINER_SERVER_CA_CERT"
ENV_TOKEN = "KUBEFLOW_TRAINER_SERVER_TOKEN"
STATUS_PATH = "/apis/trainer.kubeflow.org/v1alpha1/namespaces/{namespace}/trainjobs/{name}/status"
MAX_METRICS = 256
MAX_TEXT = 64
MAX_BODY = 1 << 16
INT32_MAX = 2**31 - 1

log = logging.getLogger(__name__)

#: ``send(url, body, headers, ca_file, timeout) -> (HTTP status, response text)``.
Transport = Callable[[str, bytes, "dict[str, str]", "str | None", float], "tuple[int, str]"]


def token_audience(namespace: str, name: str) -> str:
    """The audience the status server requires of the bearer token for one TrainJob.

    Example:
        >>> token_audience("team-a", "job-1")
        'trainer.kubeflow.org/v1alpha1/namespaces/team-a/trainjobs/job-1/status'
    """
    return "trainer.kubeflow.org" + STATUS_PATH.format(namespace=namespace, name=name)[len("/apis/trainer.kubeflow.org") :]


def _text(value: object) -> str:
    if isinstance(value, float):
        text = repr(value) if math.isfinite(value) else str(value)
    else:
        text = str(value)
    return text[:MAX_TEXT]


def _int32(value: float | int | None, low: int, high: int) -> int | None:
    if value is None:
        return None
    if isinstance(value, float) and not math.isfinite(value):
        return None
    return max(low, min(high, int(round(value))))


def build_payload(
    progress_percentage: float | int | None = None,
    estimated_remaining_seconds: float | int | None = None,
    metrics: Mapping[str, object] | None = None,
    *,
    now: float | None = None,
) -> dict[str, Any]:
    """The ``UpdateTrainJobStatusRequest`` body, clamped and trimmed to what the server accepts.

    Progress is rounded into 0..100 and the ETA into 0..2^31-1 seconds (non-finite values are
    left out); metric values become strings; names and values are cut to 64 characters; empty
    names or values and metrics past the 256th are dropped.
    """
    status: dict[str, object] = {}
    pct = _int32(progress_percentage, 0, 100)
    if pct is not None:
        status["progressPercentage"] = pct
    eta = _int32(estimated_remaining_seconds, 0, INT32_MAX)
    if eta is not None:
        status["estimatedRemainingSeconds"] = eta
    items: list[dict[str, str]] = []
    for name, value in (metrics or {}).items():
        n, v = _text(name), _text(value)
        if n and v and len(items) < MAX_METRICS:
            items.append({"name": n, "value": v})
    if items:
        status["metrics"] = items
    stamp = time.time() if now is None else now
    status["lastUpdatedTime"] = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(stamp))
    return {"trainerStatus": status}


@dataclass(frozen=True)
class StatusTarget:
    """Where and how to report: the endpoint URL, the CA file and the token file."""

    url: str
    ca_file: str | None
    token_file: str | None

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None) -> StatusTarget | None:
        """The target the Trainer injected into this container, or None outside such a TrainJob."""
        env = os.environ if env is None else env
        url = env.get(ENV_URL, "").strip()
        if not url:
            return None
        return cls(url=url, ca_file=env.get(ENV_CA_CERT) or None, token_file=env.get(ENV_TOKEN) or None)


def urllib_transport(url: str, body: bytes, headers: dict[str, str], ca_file: str | None, timeout: float) -> tuple[int, str]:
    """POST ``body`` with urllib; TLS verified against ``ca_file`` (else the system CAs)."""
    context = ssl.create_default_context(cafile=ca_file) if url.startswith("https:") else None
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")
    try:
        with urllib.request.urlopen(request, timeout=timeout, context=context) as response:
            return response.status, response.read(4096).decode("utf-8", "replace")
    except urllib.error.HTTPError as e:
        return e.code, e.read(4096).decode("utf-8", "replace")


def _is_reporting_rank(env: Mapping[str, str]) -> bool:
    # torchrun/torchtune/MPI set one of these; a single-process trainer sets none and reports.
    for name in ("RANK", "OMPI_COMM_WORLD_RANK", "PMI_RANK"):
        if env.get(name) not in (None, ""):
            return env[name] == "0"
    return True


class ProgressReporter:
    """Sends progress from the training process (global rank 0 only) to the Trainer's status server.

    Args:
        env: the environment to read (default ``os.environ``).
        min_interval: seconds between two reports; more frequent calls are skipped unless ``force``.
        timeout: seconds per request.
        transport: how to POST (default :func:`urllib_transport`).
        clock: monotonic clock, replaceable in tests.

    Example:
        >>> r = ProgressReporter(env={ENV_URL: "https://x/status", "RANK": "1"})
        >>> r.enabled  # only rank 0 reports
        False
    """

    def __init__(
        self,
        *,
        env: Mapping[str, str] | None = None,
        min_interval: float = 5.0,
        timeout: float = 5.0,
        transport: Transport | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        env = os.environ if env is None else env
        self.target = StatusTarget.from_env(env) if _is_reporting_rank(env) else None
        self.min_interval = min_interval
        self.timeout = timeout
        self._send = transport or urllib_transport
        self._clock = clock
        self._lock = threading.Lock()
        self._last_sent: float | None = None
        self._started = clock()
        self.last_error: str | None = None
        self.sent = 0

    @property
    def enabled(self) -> bool:
        """True when this process reports (inside a TrainJob with the status server, rank 0)."""
        return self.target is not None

    def _token(self) -> str | None:
        if not self.target or not self.target.token_file:
            return None
        try:
            with open(self.target.token_file, encoding="utf-8") as f:
                return f.read().strip() or None
        except OSError as e:
            self.last_error = f"cannot read the status token {self.target.token_file}: {e}"
            return None

    def report(
        self,
        progress_percentage: float | int | None = None,
        estimated_remaining_seconds: float | int | None = None,
        metrics: Mapping[str, object] | None = None,
        *,
        force: bool = False,
    ) -> bool:
        """Send one update; True when the server stored it. Never raises.

        Skipped (False) when disabled, when the last report is less than ``min_interval`` ago and
        ``force`` is not set, or when the token cannot be read; failures are kept in ``last_error``.
        """
        if self.target is None:
            return False
        with self._lock:
            now = self._clock()
            if not force and self._last_sent is not None and now - self._last_sent < self.min_interval:
                return False
            token = self._token()
            if token is None:
                if self.last_error is None:
                    self.last_error = "no status token (KUBEFLOW_TRAINER_SERVER_TOKEN)"
                log.debug("progress not reported: %s", self.last_error)
                return False
            payload = build_payload(progress_percentage, estimated_remaining_seconds, metrics)
            body = json.dumps(payload, separators=(",", ":")).encode()
            while len(body) > MAX_BODY and payload["trainerStatus"].get("metrics"):
                payload["trainerStatus"]["metrics"] = payload["trainerStatus"]["metrics"][: len(payload["trainerStatus"]["metrics"]) // 2]
                body = json.dumps(payload, separators=(",", ":")).encode()
            headers = {"Authorization": f"Bearer {token}", "Content-Type": "application/json"}
            try:
                status, text = self._send(self.target.url, body, headers, self.target.ca_file, self.timeout)
            except Exception as e:  # noqa: BLE001 - a report must never stop training
                self.last_error = f"{type(e).__name__}: {e}"
                log.warning("progress report to the Trainer failed: %s", self.last_error)
                return False
            if status != 200:
                self.last_error = f"HTTP {status}: {text[:300]}"
                log.warning("progress report to the Trainer refused: %s", self.last_error)
                return False
            self._last_sent = now
            self.last_error = None
            self.sent += 1
            return True

    def report_step(self, step: int, total_steps: int, metrics: Mapping[str, object] | None = None, *, force: bool = False) -> bool:
        """Report ``step`` of ``total_steps``: percentage, and an ETA from the time since this reporter started.

        The final step (``step >= total_steps``) is always sent.
        """
        if total_steps <= 0:
            return self.report(None, None, metrics, force=force)
        return self.report_fraction(step / total_steps, metrics, force=force)

    def report_fraction(self, done: float, metrics: Mapping[str, object] | None = None, *, force: bool = False) -> bool:
        """Report that the fraction ``done`` (0..1) of the work is done, with an ETA from the time so far.

        For trainers whose end is a step count or a time budget, whichever comes first. Done (1.0)
        is always sent.

        Example:
            >>> ProgressReporter(env={}).report_fraction(0.5, {"loss": 1.0})  # outside a TrainJob
            False
        """
        done = max(0.0, min(float(done), 1.0)) if math.isfinite(done) else 0.0
        elapsed = self._clock() - self._started
        eta = elapsed * (1.0 - done) / done if done > 0 else None
        return self.report(100.0 * done, eta, metrics, force=force or done >= 1.0)


_default: ProgressReporter | None = None


def report(
    progress_percentage: float | int | None = None,
    estimated_remaining_seconds: float | int | None = None,
    metrics: Mapping[str, object] | None = None,
    *,
    force: bool = False,
) -> bool:
    """:meth:`ProgressReporter.report` on a process-wide reporter built from ``os.environ``.

    Example:
        >>> report(10, 300, {"loss": 1.5})  # outside a TrainJob: nothing is sent
        False
    """
    global _default
    if _default is None:
        _default = ProgressReporter()
    return _default.report(progress_percentage, estimated_remaining_seconds, metrics, force=force)
