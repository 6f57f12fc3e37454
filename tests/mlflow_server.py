"""A real MLflow tracking server for the tests: ``mlflow server`` on SQLite, artifacts on disk.

The ``mlflow`` package (the ``[dev]`` extra) provides the server; the project's code talks to
it through its own REST client. ``KFP_TRAINER_MLFLOW`` may name another ``mlflow`` executable
(e.g. one in a virtualenv of its own).
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from dataclasses import dataclass
from pathlib import Path

import pytest

from kfp_trainer.tracking.client import MlflowClient

IN_CI = os.environ.get("CI", "").strip().lower() in ("1", "true", "yes")


def mlflow_executable() -> str | None:
    """The ``mlflow`` command: ``$KFP_TRAINER_MLFLOW``, the one beside this Python, or on ``PATH``."""
    given = os.environ.get("KFP_TRAINER_MLFLOW")
    if given:
        return given
    beside = Path(sys.executable).with_name("mlflow")
    return str(beside) if beside.is_file() else shutil.which("mlflow")


def free_port(host: str) -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


@dataclass
class MlflowServer:
    """A running server: its URL, its files, its log."""

    url: str
    root: Path
    process: subprocess.Popen

    def client(self) -> MlflowClient:
        return MlflowClient(self.url, env={})

    def log(self) -> str:
        return (self.root / "server.log").read_text(errors="replace")

    def runs(self, experiment: str, filter_string: str = "") -> list[dict]:
        client = self.client()
        experiment_id = client.experiment_id(experiment)
        return client.search_runs([experiment_id], filter_string, max_results=100)

    def metric_history(self, run_id: str, key: str) -> list[dict]:
        answer = self.client().call("GET", "metrics/get-history", query={"run_id": run_id, "metric_key": key, "max_results": 1000})
        return sorted(answer.get("metrics") or [], key=lambda m: (m["step"], m["timestamp"]))

    def artifacts(self, run_id: str, path: str = "") -> list[str]:
        answer = self.client().call("GET", "artifacts/list", query={"run_id": run_id, "path": path})
        return [f["path"] for f in answer.get("files") or []]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=20)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=20)


def start(root: Path, *, host: str = "127.0.0.1", timeout: float = 180.0) -> MlflowServer:
    """``mlflow server`` on ``host`` (a free port), SQLite in ``root``, artifacts served from ``root/artifacts``."""
    executable = mlflow_executable()
    if executable is None:
        message = "mlflow is not installed: pip install -e '.[dev]' (or set KFP_TRAINER_MLFLOW to an mlflow executable)"
        if IN_CI:
            pytest.fail(message)
        pytest.skip(message)
    root.mkdir(parents=True, exist_ok=True)
    port = free_port(host)
    env = {k: v for k, v in os.environ.items() if not k.startswith("MLFLOW_")}
    env["MLFLOW_SERVER_ENABLE_JOB_EXECUTION"] = "false"  # no job runner: seven worker processes (~1.5 GB) the tests never use
    argv = [executable, "server", "--backend-store-uri", f"sqlite:///{root / 'mlflow.db'}", "--artifacts-destination",
            str(root / "artifacts"), "--host", host, "--port", str(port), "--workers", "1",
            "--allowed-hosts", f"{host},{host}:*,localhost,localhost:{port}"]  # its Host check: a proxy on another port too  # fmt: skip
    log = open(root / "server.log", "w")  # noqa: SIM115 - the server writes to it until stopped
    process = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT, env=env, cwd=root, start_new_session=True)
    server = MlflowServer(f"http://{host}:{port}", root, process)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"mlflow server exited {process.returncode}:\n{server.log()[-3000:]}")
        try:
            with urllib.request.urlopen(server.url + "/health", timeout=2) as answer:
                healthy = answer.status == 200
        except OSError:
            time.sleep(0.5)
            continue
        if healthy:  # the first API call loads the server's handlers: not on a test's clock
            try:
                MlflowClient(server.url, env={}, timeout=120, attempts=1).experiment_id("Default")
            except Exception:
                server.stop()
                raise
            return server
    server.stop()
    raise AssertionError(f"mlflow server did not answer /health in {timeout:.0f}s:\n{server.log()[-3000:]}")
