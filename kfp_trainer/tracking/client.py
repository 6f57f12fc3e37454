"""A small client of MLflow's REST API (``/api/2.0/mlflow/...``). Standard library only.

The launcher and the trainers talk to the tracking server with this instead of the ``mlflow``
package: the component image stays as light as it is, and a launch imports nothing new
(``docs/mlflow.md`` has the figures). It authenticates as MLflow's own client does, from the
environment:

* ``MLFLOW_TRACKING_TOKEN``: ``Authorization: Bearer <token>``;
* ``MLFLOW_TRACKING_USERNAME`` / ``MLFLOW_TRACKING_PASSWORD``: HTTP basic;
* ``MLFLOW_TRACKING_AUTH=kubernetes`` / ``kubernetes-namespaced`` (KFP's plugin): the pod's
  service-account token, read again before each request (the kubelet renews it);
* ``MLFLOW_WORKSPACE``: the ``X-MLflow-Workspace`` header (MLflow 3.10+ workspaces);
* ``MLFLOW_TRACKING_INSECURE_TLS``, ``MLFLOW_TRACKING_SERVER_CERT_PATH``,
  ``MLFLOW_TRACKING_CLIENT_CERT_PATH``: TLS settings.

Credentials stay in the request headers: no message, exception or ``repr`` carries them.
Connection failures, timeouts, 429 and 5xx answers are retried a few times
(:class:`MlflowUnreachable` after that); any other refusal is an :class:`MlflowError` with the
server's ``error_code``.

Example:
    >>> client = MlflowClient("http://127.0.0.1:9", env={}, attempts=1, timeout=0.5)  # nothing listens on port 9
    >>> try:
    ...     client.call("GET", "experiments/get-by-name", query={"experiment_name": "x"})
    ... except MlflowUnreachable as e:
    ...     print(str(e).split(":")[0])
    MLflow at http
"""

from __future__ import annotations

import base64
import json
import os
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Callable, Iterable, Mapping
from pathlib import Path
from typing import Any

from ..redaction import redact_text
from . import settings

API = "/api/2.0/mlflow/"
ARTIFACTS_API = "/api/2.0/mlflow-artifacts/artifacts/"
SERVICE_ACCOUNT_TOKEN = "/var/run/secrets/kubernetes.io/serviceaccount/token"
SERVICE_ACCOUNT_NAMESPACE = "/var/run/secrets/kubernetes.io/serviceaccount/namespace"
# log-batch limits of the MLflow REST API (per request).
MAX_METRICS, MAX_PARAMS, MAX_TAGS = 1000, 100, 100
MAX_PARAM_VALUE, MAX_TAG_VALUE = 6000, 8000
_RETRY_STATUS = (429, 500, 502, 503, 504)


class MlflowError(Exception):
    """MLflow refused a request: ``status`` is the HTTP status, ``code`` MLflow's ``error_code``."""

    def __init__(self, message: str, *, status: int = 0, code: str = "", endpoint: str = "") -> None:
        super().__init__(message)
        self.status = status
        self.code = code
        self.endpoint = endpoint


class MlflowUnreachable(MlflowError):
    """The tracking server did not answer (connection, timeout) or kept answering 429/5xx."""


def metric(key: str, value: float, *, step: int = 0, timestamp: float | None = None) -> dict[str, Any]:
    """One metric of a ``log-batch`` request (``timestamp`` in seconds, now by default).

    Example:
        >>> metric("loss", 0.5, step=3, timestamp=1.0)
        {'key': 'loss', 'value': 0.5, 'timestamp': 1000, 'step': 3}
    """
    millis = int((time.time() if timestamp is None else timestamp) * 1000)
    return {"key": key, "value": float(value), "timestamp": millis, "step": int(step)}


def pairs(values: Mapping[str, Any], limit: int) -> list[dict[str, str]]:
    """``{key, value}`` items with values as text cut to ``limit`` characters (params, tags).

    Example:
        >>> pairs({"lr": 0.1, "note": "x" * 10}, 5)
        [{'key': 'lr', 'value': '0.1'}, {'key': 'note', 'value': 'xx...'}]
    """
    out = []
    for key, value in values.items():
        if isinstance(value, str):
            text = value
        else:
            text = json.dumps(value) if isinstance(value, (dict, list)) else str(value)  # as MLflow's client: False, None
        out.append({"key": str(key)[:250], "value": text if len(text) <= limit else text[: limit - 3] + "..."})
    return out


def quote(value: str) -> str:
    r"""``value`` inside single quotes of an MLflow search filter.

    Example:
        >>> print(quote("it's"))
        it\'s
    """
    return value.replace("\\", "\\\\").replace("'", "\\'")


class MlflowClient:
    """Calls to one MLflow tracking server. See the module docstring.

    Args:
        uri: The server's URL (``MLFLOW_TRACKING_URI``).
        env: Where the credentials and TLS settings are read (default ``os.environ``), at each request.
        workspace: The MLflow workspace (``MLFLOW_WORKSPACE`` of ``env`` when empty).
        timeout: Seconds per request.
        attempts: Tries of a request that met a connection failure, a timeout, 429 or 5xx.
        backoff: Seconds before the second try; doubled for each further one.
        sleep: Replaceable in tests.
    """

    def __init__(
        self,
        uri: str,
        *,
        env: Mapping[str, str] | None = None,
        workspace: str = "",
        timeout: float = 10.0,
        attempts: int = 3,
        backoff: float = 0.5,
        sleep: Callable[[float], None] = time.sleep,
    ) -> None:
        self.uri = uri.rstrip("/")
        self._env = os.environ if env is None else env
        self.workspace = workspace or self._env.get(settings.WORKSPACE, "")
        self.timeout = timeout
        self.attempts = max(1, attempts)
        self.backoff = backoff
        self._sleep = sleep

    def __repr__(self) -> str:
        return f"MlflowClient({self.uri!r})"

    # ----------------------------------------------------------------- transport

    def _headers(self) -> dict[str, str]:
        env = self._env
        headers = {"User-Agent": "kfp-trainer"}
        auth = env.get(settings.AUTH, "")
        if env.get(settings.TOKEN):
            headers["Authorization"] = "Bearer " + env[settings.TOKEN]
        elif env.get(settings.USERNAME) and env.get(settings.PASSWORD):
            pair = f"{env[settings.USERNAME]}:{env[settings.PASSWORD]}".encode()
            headers["Authorization"] = "Basic " + base64.b64encode(pair).decode()
        elif auth in settings.KUBERNETES_AUTH:
            try:
                headers["Authorization"] = "Bearer " + Path(SERVICE_ACCOUNT_TOKEN).read_text().strip()
            except OSError:
                pass  # outside a pod: the server answers 401, which says more than a guess here
        workspace = self.workspace
        if not workspace and auth == "kubernetes-namespaced":
            try:
                workspace = Path(SERVICE_ACCOUNT_NAMESPACE).read_text().strip()
            except OSError:
                workspace = ""
        if workspace:
            headers["X-MLflow-Workspace"] = workspace
        return headers

    def _context(self) -> Any:
        if not self.uri.startswith("https:"):
            return None
        import ssl

        env = self._env
        if str(env.get(settings.INSECURE_TLS, "")).lower() in ("1", "true", "yes"):
            context = ssl.create_default_context()
            context.check_hostname = False
            context.verify_mode = ssl.CERT_NONE
        else:
            context = ssl.create_default_context(cafile=env.get(settings.SERVER_CERT) or None)
        if env.get(settings.CLIENT_CERT):
            context.load_cert_chain(env[settings.CLIENT_CERT])
        return context

    def request(
        self, method: str, url_path: str, *, body: bytes | Path | None = None, query: Mapping[str, Any] | None = None,
        content_type: str = "", attempts: int = 0,
    ) -> bytes:  # fmt: skip
        """One HTTP request to the server (tried ``attempts`` times, default the client's, as the class says); the answer's body.

        A ``Path`` body is streamed from the file (read again from its start on each try), never
        held in memory whole: a checkpoint or a dataset uploaded as an artifact can be larger
        than the step's memory.
        """
        url = self.uri + url_path
        if query:
            url += "?" + urllib.parse.urlencode({k: v for k, v in query.items() if v not in (None, "")}, doseq=True)
        endpoint = f"{method} {url_path}"
        tries = attempts or self.attempts
        for attempt in range(1, tries + 1):
            headers = self._headers()
            if content_type:
                headers["Content-Type"] = content_type
            stream, data = None, body  # type: Any, Any
            try:
                if isinstance(body, Path):
                    data = stream = body.open("rb")
                    headers["Content-Length"] = str(os.fstat(stream.fileno()).st_size)
                req = urllib.request.Request(url, data=data, method=method, headers=headers)
                with urllib.request.urlopen(req, timeout=self.timeout, context=self._context()) as answer:
                    content: bytes = answer.read()
                    return content
            except urllib.error.HTTPError as e:
                text = e.read(4096).decode("utf-8", "replace")
                if e.code in _RETRY_STATUS and attempt < tries:
                    self._sleep(self.backoff * 2 ** (attempt - 1))
                    continue
                raise self._refusal(e.code, text, endpoint) from None
            except (TimeoutError, urllib.error.URLError, ConnectionError, OSError) as e:
                if attempt < tries:
                    self._sleep(self.backoff * 2 ** (attempt - 1))
                    continue
                reason = getattr(e, "reason", e)
                raise MlflowUnreachable(
                    f"MLflow at {self.uri} did not answer {endpoint} after {tries} tries: {reason}", endpoint=endpoint
                ) from None
            finally:
                if stream is not None:
                    stream.close()
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def _refusal(self, status: int, text: str, endpoint: str) -> MlflowError:
        code, message = "", text.strip()
        try:
            answer = json.loads(text)
            code, message = str(answer.get("error_code", "")), str(answer.get("message", message))
        except (ValueError, AttributeError):
            pass
        message = redact_text(message)[:500]
        cls = MlflowUnreachable if status in _RETRY_STATUS else MlflowError
        what = {401: "not authenticated", 403: "not allowed"}.get(status, code or f"HTTP {status}")
        return cls(f"MLflow at {self.uri} refused {endpoint}: {what}: {message}", status=status, code=code, endpoint=endpoint)

    def call(
        self, method: str, endpoint: str, body: Mapping[str, Any] | None = None, *, query: Mapping[str, Any] | None = None,
        attempts: int = 0,
    ) -> dict[str, Any]:  # fmt: skip
        """A JSON call to ``/api/2.0/mlflow/<endpoint>``; the decoded answer (``attempts``: as :meth:`request`)."""
        data = json.dumps(body).encode() if body is not None else None
        kind = "application/json" if data else ""
        raw = self.request(method, API + endpoint, body=data, query=query, content_type=kind, attempts=attempts)
        answer: dict[str, Any] = json.loads(raw) if raw.strip() else {}
        return answer

    # ----------------------------------------------------------------- experiments and runs

    def experiment_id(self, name: str, *, tags: Mapping[str, str] | None = None) -> str:
        """The id of the experiment ``name``, created (with ``tags``) when missing; another creating it meanwhile is fine."""
        try:
            return str(self.call("GET", "experiments/get-by-name", query={"experiment_name": name})["experiment"]["experiment_id"])
        except MlflowError as e:
            if e.code != "RESOURCE_DOES_NOT_EXIST":
                raise
        try:
            return str(self.call("POST", "experiments/create", {"name": name, "tags": pairs(tags or {}, MAX_TAG_VALUE)})["experiment_id"])
        except MlflowError as e:
            if e.code != "RESOURCE_ALREADY_EXISTS":
                raise
        return str(self.call("GET", "experiments/get-by-name", query={"experiment_name": name})["experiment"]["experiment_id"])

    def get_run(self, run_id: str) -> dict[str, Any]:
        """``{"info": ..., "data": ...}`` of one run."""
        run: dict[str, Any] = self.call("GET", "runs/get", query={"run_id": run_id})["run"]
        return run

    def create_run(self, experiment_id: str, *, name: str, tags: Mapping[str, str], attempts: int = 0) -> dict[str, Any]:
        """A new RUNNING run; its ``info``. ``attempts`` (default: the client's) tries of a server that does not answer."""
        body = {"experiment_id": experiment_id, "run_name": name, "start_time": int(time.time() * 1000),
                "tags": pairs(tags, MAX_TAG_VALUE)}  # fmt: skip
        info: dict[str, Any] = self.call("POST", "runs/create", body, attempts=attempts)["run"]["info"]
        return info

    def find_or_create_run(self, experiment_id: str, *, name: str, tags: Mapping[str, str], key: str) -> tuple[dict[str, Any], bool]:
        """The run of ``experiment_id`` whose tag ``key`` has the value ``tags[key]``, else a new one: ``(info, found)``.

        Never two runs for one key: a create whose answer was lost (a timeout, a 5xx after the
        server stored the run) is not sent again blindly; the run is looked up by its tag first.
        """
        wanted = f"tags.`{key}` = '{quote(tags[key])}'"
        for attempt in range(1, self.attempts + 1):
            found = self.search_runs([experiment_id], wanted, max_results=1)
            if found:
                return dict(found[0]["info"]), attempt == 1  # after a lost answer: the run this call made
            try:
                return self.create_run(experiment_id, name=name, tags=tags, attempts=1), False
            except MlflowUnreachable:
                if attempt == self.attempts:
                    raise
                self._sleep(self.backoff * 2 ** (attempt - 1))
        raise AssertionError("unreachable")  # pragma: no cover - the loop returns or raises

    def update_run(self, run_id: str, status: str, *, end: bool = True) -> None:
        """Set a run's status (``RUNNING``, ``FINISHED``, ``FAILED``, ``KILLED``); a final one gets an end time."""
        body: dict[str, Any] = {"run_id": run_id, "status": status}
        if end and status != "RUNNING":
            body["end_time"] = int(time.time() * 1000)
        self.call("POST", "runs/update", body)

    def search_runs(self, experiment_ids: Iterable[str], filter_string: str, *, max_results: int = 10) -> list[dict[str, Any]]:
        """Runs (active ones) of the experiments matching an MLflow filter, newest first."""
        body = {"experiment_ids": list(experiment_ids), "filter": filter_string, "max_results": max_results,
                "order_by": ["attributes.start_time DESC"]}  # fmt: skip
        return list(self.call("POST", "runs/search", body).get("runs") or [])

    def log_batch(
        self,
        run_id: str,
        *,
        metrics: Iterable[dict[str, Any]] = (),
        params: Mapping[str, Any] | None = None,
        tags: Mapping[str, Any] | None = None,
    ) -> None:
        """Log metrics, params and tags in as few ``log-batch`` requests as the API's limits allow."""
        rest_metrics, rest_params = list(metrics), pairs(params or {}, MAX_PARAM_VALUE)
        rest_tags = pairs(tags or {}, MAX_TAG_VALUE)
        while rest_metrics or rest_params or rest_tags:
            body = {"run_id": run_id, "metrics": rest_metrics[:MAX_METRICS], "params": rest_params[:MAX_PARAMS],
                    "tags": rest_tags[:MAX_TAGS]}  # fmt: skip
            rest_metrics, rest_params, rest_tags = rest_metrics[MAX_METRICS:], rest_params[MAX_PARAMS:], rest_tags[MAX_TAGS:]
            self.call("POST", "runs/log-batch", body)

    # ----------------------------------------------------------------- artifacts

    def artifact_url_path(self, artifact_uri: str, path: str) -> str:
        """The proxy URL path of ``path`` under a run's ``mlflow-artifacts:`` artifact URI.

        Raises:
            MlflowError: The run's artifacts live elsewhere (``s3://``, ``gs://``, a local
                directory of the server): the server must serve artifacts (``mlflow server``
                does by default; not with ``--no-serve-artifacts``).

        Example:
            >>> MlflowClient("http://m", env={}).artifact_url_path("mlflow-artifacts:/1/abc/artifacts", "report.html")
            '/api/2.0/mlflow-artifacts/artifacts/1/abc/artifacts/report.html'
        """
        parsed = urllib.parse.urlsplit(artifact_uri)
        if parsed.scheme != "mlflow-artifacts":
            raise MlflowError(
                f"the run's artifacts live at {redact_text(artifact_uri)}, which the launcher does not write; start the MLflow "
                "server with artifact serving (`mlflow server --artifacts-destination ...`, the default) to get files uploaded"
            )
        root = parsed.path.strip("/")
        return ARTIFACTS_API + urllib.parse.quote(f"{root}/{path.strip('/')}".strip("/"))

    def upload(self, artifact_uri: str, local: str | Path, path: str = "") -> int:
        """Upload a file, or a directory's files, under ``path`` of a run's artifacts; the number of files."""
        source = Path(local)
        files = [source] if source.is_file() else sorted(p for p in source.rglob("*") if p.is_file())
        for file in files:
            rel = file.name if source.is_file() else file.relative_to(source).as_posix()
            target = self.artifact_url_path(artifact_uri, f"{path}/{rel}" if path else rel)
            self.request("PUT", target, body=file, content_type="application/octet-stream")
        return len(files)
