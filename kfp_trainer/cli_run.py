"""``kfp-trainer run PIPELINE --local``: a whole pipeline with ``kfp.local`` on this machine.

Parameters are typed by the pipeline's declaration (``--param epochs=3``); the outputs of each
task are summarised at the end. A failed step ends the run with one block naming the step and
its error, and exit code 1 (the block is made by :mod:`kfp_trainer.local_failure`).
"""

from __future__ import annotations

import argparse
import json
import sys
from typing import Any

from .cli_inputs import json_value
from .errors import EXIT_JOB_FAILED, UserError
from .numbers import parse_float, parse_int


def load_pipeline(target: str) -> tuple[Any, Any]:
    """The pipeline defined in ``target`` (a ``pipeline.py`` or the folder holding one), and its module."""
    import importlib.util
    from pathlib import Path

    path = Path(target)
    if path.is_dir():
        path = path / "pipeline.py"
    if not path.is_file():
        raise UserError(f"{target}: no pipeline file at {path}")
    spec = importlib.util.spec_from_file_location(f"kfp_trainer_pipeline_{path.parent.name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from kfp.dsl.graph_component import GraphComponent

    pipelines = [v for v in vars(module).values() if isinstance(v, GraphComponent)]
    named = [p for p in pipelines if getattr(module, "PIPELINE", None) is p]
    if named or len(pipelines) == 1:
        return (named or pipelines)[0], module
    raise UserError(f"{path} defines {len(pipelines)} pipelines; set PIPELINE = <the one to run> in it")


def _typed(text: str, kind: str, name: str) -> Any:
    """A --param value as the type the pipeline declares (KFP rejects an int for a float)."""
    try:
        if kind == "String":
            return text
        if kind == "Integer":
            return parse_int(text, f"--param {name}")
        if kind == "Float":
            return parse_float(text, f"--param {name}")
        if kind == "Boolean":
            if text.lower() not in ("true", "false", "1", "0", "yes", "no"):
                raise ValueError(text)
            return text.lower() in ("true", "1", "yes")
    except ValueError:
        raise UserError(f"--param {name}={text!r}: expected a {kind.lower()}") from None
    try:
        return json_value(text)
    except argparse.ArgumentTypeError as e:
        raise UserError(f"--param {name}: {e}") from None


def cmd_run(ns: argparse.Namespace) -> int:
    """Run a whole pipeline with kfp.local on this machine (the local TrainJob backend)."""
    import os
    import tempfile
    import time
    import warnings
    from pathlib import Path

    if not ns.local:
        raise UserError("kfp-trainer run: only --local runs are supported; upload the compiled pipeline YAML to KFP for a cluster run")
    pipeline, module = load_pipeline(ns.pipeline)
    declared = {name: getattr(spec, "type", "") for name, spec in (pipeline.component_spec.inputs or {}).items()}
    params = {}
    for item in ns.param or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise UserError(f"--param {item!r}: expected NAME=VALUE")
        if key not in declared:
            raise UserError(f"--param {key}: the pipeline has no such parameter; it has {', '.join(sorted(declared))}")
        params[key] = _typed(value, declared[key], key)
    import kfp.local

    out = Path(ns.output or Path("out") / f"{pipeline.name}-{time.strftime('%Y%m%d-%H%M%S')}").resolve()
    out.mkdir(parents=True, exist_ok=True)
    # kfp.local deletes the workspace root when the run ends: always a fresh folder of our own.
    workspace = Path(tempfile.mkdtemp(prefix="kfp-trainer-workspace-"))
    os.environ["KFP_TRAINER_BACKEND"] = "local"
    os.environ.setdefault("KFP_TRAINER_LOCAL_ROOT", str(out / "trainjobs"))
    kfp.local.init(runner=kfp.local.SubprocessRunner(use_venv=False), pipeline_root=str(out / "artifacts"), workspace_root=str(workspace))
    started = time.monotonic()
    print(f"[kfp-trainer] running pipeline {pipeline.name} locally; outputs in {out}", flush=True)
    print("[kfp-trainer] each step runs in this Python environment: the steps' images and resource limits do not apply locally",
          flush=True)  # fmt: skip
    with warnings.catch_warnings():
        # kfp.local says the same for every step of every local run (the note above, once): its two warnings
        # would be the only warnings of a healthy run, and a user learns to skip warnings that way.
        warnings.filterwarnings("ignore", r"Task '.*': settings \[.*\] have no effect in the current local runner", UserWarning)
        warnings.filterwarnings("ignore", "You may be attemping to run a task that uses custom or non-Python base image", RuntimeWarning)
        if not run_reporting_failure(pipeline, params, out):
            return EXIT_JOB_FAILED
    print(f"[kfp-trainer] pipeline {pipeline.name} finished in {time.monotonic() - started:.0f}s", flush=True)
    outputs = task_outputs(out / "artifacts")
    print(summarize_outputs(outputs, getattr(module, "TASK_LABELS", None)))
    compare = getattr(module, "COMPARE", None)
    if compare:
        print(before_after(outputs, labels=getattr(module, "TASK_LABELS", None), **compare))
    return 0


def run_reporting_failure(pipeline: Any, params: dict[str, Any], out: Any) -> bool:
    """Run ``pipeline``; on a failed step print the failure block to stderr and return False."""
    from .local_failure import TaskLog, failure_block, is_step_failure

    log = TaskLog(sys.stdout)
    real, sys.stdout = sys.stdout, log
    try:
        pipeline(**params)
    except RuntimeError as e:
        if not is_step_failure(e):
            raise
        sys.stdout = real
        print(flush=True)
        print(failure_block(e, log.tails, log.last_task), file=sys.stderr)
        print(f"The step's whole log is above; what the run wrote is under {out}.", file=sys.stderr, flush=True)
        return False
    finally:
        sys.stdout = real
    return True


def task_outputs(root: Any) -> list[tuple[str, dict[str, Any]]]:
    """``(task, executor output)`` of each task of a kfp.local run under ``root``, in finishing order."""
    from pathlib import Path

    runs = [p for p in Path(root).iterdir() if p.is_dir()] if Path(root).is_dir() else []
    paths = sorted((p for run in runs for p in run.rglob("executor_output.json")), key=lambda p: p.stat().st_mtime)
    # a task inside a ParallelFor is named by its iteration too: for-loop-1-iteration-0/train-job
    return [(path.parent.relative_to(run).as_posix(), json.loads(path.read_text())) for run in runs for path in paths
            if run in path.parents]


def summarize_outputs(outputs: list[tuple[str, dict[str, Any]]], labels: dict[str, str] | None = None) -> str:
    """What a local run produced, per task: metrics, verdicts, models, reports.

    ``outputs`` comes from :func:`task_outputs`; ``labels`` names tasks for people
    (e.g. ``{"evaluate-model": "base model"}``).
    """
    from pathlib import Path

    labels = labels or {}
    lines = []
    for task, data in outputs:
        label = labels.get(task) or labels.get(task.rsplit("/", 1)[-1])
        shown = f"{task} ({label})" if label else task
        for name, value in (data.get("parameterValues") or {}).items():
            lines.append(f"  {shown:<40} {name} = {value}")
        for name, group in (data.get("artifacts") or {}).items():
            for artifact in group.get("artifacts") or []:
                metadata = artifact.get("metadata") or {}
                if "metrics" in name:
                    numbers = ", ".join(f"{k}={v:.4g}" for k, v in metadata.items() if isinstance(v, (int, float)))
                    lines.append(f"  {shown:<40} {name}: {numbers}")
                elif Path(artifact.get("uri", "")).exists():
                    lines.append(f"  {shown:<40} {name}: {artifact['uri']}")
    return "Outputs:\n" + "\n".join(lines) if lines else "No task outputs"


def before_after(
    outputs: list[tuple[str, dict[str, Any]]], *, metric: str, before: str, after: str, labels: dict[str, str] | None = None
) -> str:
    """One line comparing ``metric`` of two tasks' Metrics outputs (e.g. base vs fine-tuned)."""
    values = {}
    for task, data in outputs:
        if task in (before, after):
            for group in (data.get("artifacts") or {}).values():
                for artifact in group.get("artifacts") or []:
                    if metric in (artifact.get("metadata") or {}):
                        values[task] = artifact["metadata"][metric]
    if len(values) < 2:
        return f"{metric}: not found in the outputs of {before} and {after}"
    name = {task: (labels or {}).get(task, task) for task in (before, after)}
    change = values[after] - values[before]
    return f"{metric}: {name[before]} {values[before]:.3f} -> {name[after]} {values[after]:.3f} ({change:+.3f})"


def add_parser(sub: Any, formatter: Any) -> None:
    """Register ``run`` on the CLI's subparsers."""
    run = sub.add_parser("run", help="run a pipeline (folder or pipeline.py) on this machine with kfp.local",
                         description=__doc__, formatter_class=formatter)  # fmt: skip
    run.add_argument("pipeline", help="a pipeline.py, or the folder that holds one")
    run.add_argument(
        "--local", action="store_true",
        help="run on this machine with the local TrainJob backend; required (for a cluster: upload the compiled YAML to KFP)",
    )  # fmt: skip
    run.add_argument(
        "--param", action="append", metavar="NAME=VALUE", help="pipeline parameter, repeatable; the pipeline's default when unset"
    )
    run.add_argument("-o", "--output", metavar="DIR", help="folder for artifacts and local TrainJobs; out/<pipeline>-<time> when unset")
    run.set_defaults(func=cmd_run)
