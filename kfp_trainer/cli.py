"""The ``kfp-trainer`` command line.

    kfp-trainer render --runtime torch-distributed --num-nodes 2 --run-id r1 --task-name train
    kfp-trainer launch --runtime torch-distributed --image my/trainer:1 --command python,train.py
    kfp-trainer run pipelines/llm_finetune --local
    kfp-trainer gc [--namespace NS | --all-namespaces] [--older-than 24h] [--yes]
    kfp-trainer compile [--check]

``render`` prints the TrainJob as YAML (a dry run to ``kubectl apply``); ``launch`` runs one
TrainJob to its end on the current cluster (or locally with ``--local``); ``run`` runs a whole
pipeline with ``kfp.local``; ``gc`` lists (and with ``--yes`` deletes) TrainJobs whose run or
task is gone; ``compile`` regenerates the component and pipeline YAML and READMEs
(``--check`` fails when they are stale).
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

import yaml

from .cli_inputs import add_input_flags, inputs_from_args, json_value, seconds
from .errors import CancelledError, KfpTrainerError
from .numbers import parse_float, parse_int


def cmd_render(ns: argparse.Namespace) -> int:
    """Print the TrainJob manifest as YAML."""
    from .spec import render

    inputs = inputs_from_args(ns)
    if ns.api_version == "auto":
        from .backends.kubernetes import KubernetesBackend

        backend = KubernetesBackend.from_config(ns.kubeconfig)
        info = backend.resolve_runtime(inputs.model_copy(update={"namespace": inputs.namespace or backend.default_namespace()}))
        manifest = render(
            inputs, api_version=info.api_version, runtime_jobs=info.job_names, allow_host_access=info.allow_host_access,
            init_containers=info.init_container_names,
        )
    else:
        manifest = render(inputs, api_version=ns.api_version)
    yaml.safe_dump(manifest, sys.stdout, sort_keys=False)
    return 0


def cmd_launch(ns: argparse.Namespace) -> int:
    """Run one TrainJob to its end and print a summary."""
    from .launcher import Launcher, LaunchOptions
    from .spec import check_launch_options

    inputs = inputs_from_args(ns)
    check_launch_options(start_timeout=ns.start_timeout, run_timeout=ns.run_timeout, queue_timeout=ns.queue_timeout, logs=ns.logs)
    if ns.local:
        from .backends.local import LocalBackend

        backend: Any = LocalBackend()
    else:
        from .backends.kubernetes import KubernetesBackend

        backend = KubernetesBackend.from_config(ns.kubeconfig, api_version=ns.api_version)
    options = LaunchOptions(
        start_timeout=ns.start_timeout, run_timeout=ns.run_timeout, queue_timeout=ns.queue_timeout, logs=ns.logs,
        delete_after_success=ns.delete_after_success,
    )
    outcome = Launcher(backend, options).run(inputs)
    print(json.dumps({"trainjob": str(outcome.ref), "phase": outcome.phase.value, "metrics": outcome.metrics.final(),
                      "seconds": outcome.times}))  # fmt: skip
    return 0


def load_pipeline(target: str) -> tuple[Any, Any]:
    """The pipeline defined in ``target`` (a ``pipeline.py`` or the folder holding one), and its module."""
    import importlib.util
    from pathlib import Path

    path = Path(target)
    if path.is_dir():
        path = path / "pipeline.py"
    if not path.is_file():
        raise SystemExit(f"error: no pipeline file at {path}")
    spec = importlib.util.spec_from_file_location(f"kfp_trainer_pipeline_{path.parent.name}", path)
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    from kfp.dsl.graph_component import GraphComponent

    pipelines = [v for v in vars(module).values() if isinstance(v, GraphComponent)]
    named = [p for p in pipelines if getattr(module, "PIPELINE", None) is p]
    if named or len(pipelines) == 1:
        return (named or pipelines)[0], module
    raise SystemExit(f"error: {path} defines {len(pipelines)} pipelines; name the one to run PIPELINE")


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
        raise SystemExit(f"--param {name}={text!r}: expected a {kind.lower()}") from None
    return json_value(text)


def cmd_run(ns: argparse.Namespace) -> int:
    """Run a whole pipeline with kfp.local on this machine (the local TrainJob backend)."""
    import os
    import tempfile
    import time
    from pathlib import Path

    if not ns.local:
        raise SystemExit("error: only --local runs are supported here; upload the compiled YAML to KFP for cluster runs")
    pipeline, module = load_pipeline(ns.pipeline)
    declared = {name: getattr(spec, "type", "") for name, spec in (pipeline.component_spec.inputs or {}).items()}
    params = {}
    for item in ns.param or []:
        key, sep, value = item.partition("=")
        if not sep:
            raise SystemExit(f"--param {item!r}: expected name=value")
        if key not in declared:
            raise SystemExit(f"--param {key}: the pipeline has no such parameter; it has {', '.join(sorted(declared))}")
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
    pipeline(**params)
    print(f"[kfp-trainer] pipeline {pipeline.name} finished in {time.monotonic() - started:.0f}s", flush=True)
    outputs = task_outputs(out / "artifacts")
    print(summarize_outputs(outputs, getattr(module, "TASK_LABELS", None)))
    compare = getattr(module, "COMPARE", None)
    if compare:
        print(before_after(outputs, labels=getattr(module, "TASK_LABELS", None), **compare))
    return 0


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


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kfp-trainer``."""
    parser = argparse.ArgumentParser(prog="kfp-trainer", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("-v", "--verbose", action="store_true")
    sub = parser.add_subparsers(dest="command_name", required=True)

    render = sub.add_parser("render", help="print the TrainJob manifest (dry run)")
    add_input_flags(render)
    render.add_argument("--api-version", default="v2.2", choices=["v2.1", "v2.2", "auto"], help="auto: ask the cluster")
    render.add_argument("--kubeconfig")
    render.set_defaults(func=cmd_render)

    launch = sub.add_parser("launch", help="run one TrainJob to its end")
    add_input_flags(launch)
    launch.add_argument("--api-version", default="auto", choices=["v2.1", "v2.2", "auto"])
    launch.add_argument("--kubeconfig")
    launch.add_argument("--local", action="store_true", help="run on this machine instead of a cluster")
    launch.add_argument("--start-timeout", type=seconds, default=3600.0)
    launch.add_argument("--run-timeout", type=seconds, default=0.0)
    launch.add_argument("--queue-timeout", type=seconds, default=0.0, help="seconds the job may wait suspended in its queue")
    launch.add_argument("--logs", default="0", help="trainer node index, 'all' or 'none'")
    launch.add_argument("--delete-after-success", action="store_true")
    launch.set_defaults(func=cmd_launch)

    run = sub.add_parser("run", help="run a pipeline (folder or pipeline.py) locally with kfp.local")
    run.add_argument("pipeline")
    run.add_argument("--local", action="store_true", help="run on this machine with the local TrainJob backend")
    run.add_argument("--param", action="append", metavar="NAME=VALUE", help="pipeline parameter (repeatable)")
    run.add_argument("--output", help="folder for artifacts and local TrainJobs (default: out/<pipeline>-<time>)")
    run.set_defaults(func=cmd_run)

    from .gc import add_parser as add_gc_parser

    add_gc_parser(sub)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kfp-trainer`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["compile"]:  # the generator has its own flags
        from .compile import main as compile_main

        return compile_main(args[1:])
    try:
        if args[:1] == ["launch"]:  # from here on a stop signal ends with the job deleted or never created
            from . import cancel

            cancel.install()
        parser = build_parser()
        ns = parser.parse_args(args)
        logging.basicConfig(level=logging.INFO if ns.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        return int(ns.func(ns) or 0)
    except KfpTrainerError as e:
        if isinstance(e, CancelledError):
            from . import cancel

            cancel.acknowledge()  # the process ends with it: no need to send it again
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
