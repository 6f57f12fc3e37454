"""A model version in MLflow's model registry: made once per step, with lineage tags and an alias.

:func:`register` makes the version of one registered model for one pipeline step and hands it
back on a retry of that step: the version carries the step's key as the tag
``kfp_trainer.step``, found again before anything is made. The alias (``champion``) moves to it
only when asked (the gate passed).

A registry keeps where a version's files are: the model's artifact URI (``s3://``,
``minio://``, ``gs://``: where KFP stored it), or -- on request, and always for a path on this
machine, which means nothing to a reader elsewhere -- a run's artifacts the files are uploaded
to (``mlflow-artifacts:/...``, served by the tracking server).
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any
from urllib.parse import urlsplit

from .client import MlflowClient, MlflowError, pairs, quote

STEP_TAG = "kfp_trainer.step"  # the registering step's key: one version per step, whatever its retries
MAX_TAG = 5000  # model version tag values (MLflow's limit)


@dataclass(frozen=True)
class Registration:
    """What :func:`register` did."""

    name: str
    version: str
    source: str
    run_id: str = ""
    reused: bool = False  # an earlier try of the step made this version
    alias: str = ""  # the alias now on this version ("" when none was moved)

    @property
    def uri(self) -> str:
        """``models:/<name>/<version>``, how MLflow names the version.

        Example:
            >>> Registration("addition", "3", "s3://b/m").uri
            'models:/addition/3'
        """
        return f"models:/{self.name}/{self.version}"


def is_local_path(uri: str) -> bool:
    """Whether an artifact URI is a path on this machine (``kfp.local``), which a registry cannot hand to others.

    Example:
        >>> is_local_path("/tmp/root/train-job/output_model"), is_local_path("minio://mlpipeline/v2/x"), is_local_path("file:///x")
        (True, False, True)
    """
    scheme = urlsplit(uri).scheme
    return scheme in ("", "file") or (len(scheme) == 1 and uri[1:3] in (":\\", ":/"))  # a Windows drive letter


def ensure_model(client: MlflowClient, name: str, *, description: str = "", tags: Mapping[str, str] | None = None) -> bool:
    """Create the registered model ``name`` unless it exists; True when it was created."""
    body = {"name": name, "tags": pairs(tags or {}, MAX_TAG), **({"description": description} if description else {})}
    try:
        client.call("POST", "registered-models/create", body)
        return True
    except MlflowError as e:
        if e.code != "RESOURCE_ALREADY_EXISTS":
            raise
        return False


def version_of_step(client: MlflowClient, name: str, step_key: str) -> dict[str, Any] | None:
    """The version of ``name`` an earlier try of the step made (tagged with ``step_key``), if any."""
    query = {"filter": f"name='{quote(name)}' and tags.`{STEP_TAG}` = '{quote(step_key)}'", "max_results": 10}
    found = client.call("GET", "model-versions/search", query=query).get("model_versions") or []
    return min(found, key=lambda v: int(v["version"])) if found else None


def register(
    client: MlflowClient,
    *,
    name: str,
    source: str,
    step_key: str,
    run_id: str = "",
    tags: Mapping[str, Any] | None = None,
    description: str = "",
    run_link: str = "",
    alias: str = "",
) -> Registration:
    """Make (or find again) the step's version of ``name`` from ``source``; move ``alias`` to it when given.

    Args:
        client: The tracking server's client.
        name: The registered model (created when missing).
        source: Where the version's files are.
        step_key: What stays the same on every try of the step (KFP run, task, loop iteration).
        run_id: The MLflow run that made the model (its lineage in the UI), if known.
        tags: Lineage and metrics, as the version's tags (values cut to MLflow's limit).
        description: The version's description.
        run_link: A link to where the model came from (the KFP run's page).
        alias: An alias to point at this version ("" moves none).

    Raises:
        MlflowError: The server refused (the message says what and where).
    """
    ensure_model(client, name)
    existing = version_of_step(client, name, step_key)
    if existing is None:
        body: dict[str, Any] = {"name": name, "source": source, "tags": pairs({**(tags or {}), STEP_TAG: step_key}, MAX_TAG)}
        body.update({k: v for k, v in (("run_id", run_id), ("description", description), ("run_link", run_link)) if v})
        version = client.call("POST", "model-versions/create", body)["model_version"]
    else:
        version = existing
    number = str(version["version"])
    if alias:
        client.call("POST", "registered-models/alias", {"name": name, "alias": alias, "version": number})
    return Registration(
        name=name, version=number, source=str(version.get("source", source)), run_id=str(version.get("run_id") or ""),
        reused=existing is not None, alias=alias,
    )  # fmt: skip


def alias_version(client: MlflowClient, name: str, alias: str) -> str:
    """The version ``alias`` points at, or ``""`` when it points at none."""
    try:
        return str(client.call("GET", "registered-models/alias", query={"name": name, "alias": alias})["model_version"]["version"])
    except MlflowError as e:
        if e.code in ("RESOURCE_DOES_NOT_EXIST", "INVALID_PARAMETER_VALUE"):
            return ""
        raise
