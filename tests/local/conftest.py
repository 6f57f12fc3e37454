"""Fixtures of the local tests: a real MLflow tracking server (``tests/mlflow_server.py``)."""

from __future__ import annotations

from collections.abc import Iterator

import pytest

from tests.mlflow_server import MlflowServer, start


@pytest.fixture(scope="session")
def mlflow_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[MlflowServer]:
    """``mlflow server`` on 127.0.0.1 (SQLite, artifacts on disk) for the whole session, stopped at its end."""
    server = start(tmp_path_factory.mktemp("mlflow"))
    yield server
    server.stop()
