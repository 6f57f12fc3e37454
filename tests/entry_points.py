"""Every way a launch is started, as a command line a test runs in a real process.

* ``cli`` -- ``kfp-trainer launch ...``, the console script;
* ``cli-flag-first`` -- ``kfp-trainer -v launch ...``: a global flag before the command;
* ``python-m`` -- ``python -m kfp_trainer.cli launch ...``;
* ``component`` -- the ``train_job`` component's body, as KFP runs it: the compiled
  component's own command (``sh -ec ... python3 -m kfp.dsl.executor_main ...``) with an executor
  input, the way KFP's launcher starts it in a step's container;
* ``python-api`` -- a script calling ``prepare`` and ``Launcher`` with no stop token of its own.

Each is given the same TrainJob inputs (a map of :class:`~kfp_trainer.spec.TrainJobInputs` fields)
and the same launcher options.
"""

from __future__ import annotations

import json
import sys
import uuid
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
ENTRY_POINTS = ["cli", "cli-flag-first", "python-m", "component", "python-api"]
COMPONENT = REPO / "components" / "train_job" / "component.yaml"

API_SCRIPT = """
import json, sys
from kfp_trainer.backends import select_backend
from kfp_trainer.launcher import Launcher, LaunchOptions
from kfp_trainer.prepare import prepare
from kfp_trainer.spec import TrainJobInputs

inputs, options, backend = json.loads(sys.argv[1]), json.loads(sys.argv[2]), sys.argv[3]
kube = select_backend(backend)
Launcher(kube, LaunchOptions(**options)).run(prepare(kube, TrainJobInputs(**inputs)))
"""


def _cli_flags(inputs_file: Path, options: dict[str, Any], backend: str) -> list[str]:
    flags = ["--inputs-file", str(inputs_file)]
    for key, value in options.items():
        flags += [f"--{key.replace('_', '-')}", str(value)]
    return [*flags, "--local"] if backend == "local" else flags


def executor_input(parameters: dict[str, Any], outputs: dict[str, Any], root: Path) -> dict[str, Any]:
    """What KFP's launcher hands a component's container: ``parameters``, and URIs under ``root`` for ``outputs``
    (the component's ``outputDefinitions``)."""
    artifacts = {
        name: {"artifacts": [{"name": name, "type": {"schemaTitle": out["artifactType"]["schemaTitle"]}, "uri": str(root / name),
                              "metadata": {}}]}
        for name, out in outputs["artifacts"].items()
    }  # fmt: skip
    return {
        "inputs": {"parameterValues": parameters},
        "outputs": {
            "artifacts": artifacts,
            "parameters": {n: {"outputFile": str(root / n)} for n in outputs.get("parameters", {})},
            "outputFile": str(root / "executor_output.json"),
        },
    }


def component_command(parameters: dict[str, Any], root: Path) -> list[str]:
    """The compiled ``train_job`` component's command and arguments, its executor input filled in."""
    spec = yaml.safe_load(COMPONENT.read_text())
    container = spec["deploymentSpec"]["executors"]["exec-train-job"]["container"]
    outputs = spec["components"]["comp-train-job"]["outputDefinitions"]
    body = json.dumps(executor_input(parameters, outputs, root / f"task-{uuid.uuid4().hex[:8]}"))
    return [*container["command"], *(body if arg == "{{$}}" else arg for arg in container["args"])]


def step_argv(entry: str, inputs: dict[str, Any], options: dict[str, Any], *, backend: str, folder: Path) -> list[str]:
    """The command line that starts a launch through ``entry`` (one of :data:`ENTRY_POINTS`).

    Args:
        inputs: TrainJob inputs (``run_id``, ``runtime``, ``command``, ...).
        options: Launcher options by their Python names (``logs``, ``start_timeout``, ...).
        backend: ``local`` or ``kubernetes`` (the cluster of ``$KUBECONFIG``).
        folder: Where the inputs file and the component's outputs go.
    """
    folder.mkdir(parents=True, exist_ok=True)
    inputs_file = folder / "inputs.json"
    inputs_file.write_text(json.dumps(inputs))
    script = Path(sys.executable).with_name("kfp-trainer")
    if entry == "cli":
        return [str(script), "launch", *_cli_flags(inputs_file, options, backend)]
    if entry == "cli-flag-first":
        return [str(script), "-v", "launch", *_cli_flags(inputs_file, options, backend)]
    if entry == "python-m":
        return [sys.executable, "-m", "kfp_trainer.cli", "launch", *_cli_flags(inputs_file, options, backend)]
    if entry == "component":
        return component_command({**inputs, **options, "backend": backend}, folder)
    if entry == "python-api":
        return [sys.executable, "-c", API_SCRIPT, json.dumps(inputs), json.dumps(options), backend]
    raise ValueError(entry)
