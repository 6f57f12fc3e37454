"""The ``kfp-trainer`` command line.

    kfp-trainer render --runtime torch-distributed --num-nodes 2 --run-id r1 --task-name train
    kfp-trainer launch --runtime torch-distributed --image my/trainer:1 --command torchrun,train.py
    kfp-trainer run pipelines/llm_finetune --local
    kfp-trainer gc [--namespace NS | --all-namespaces] [--older-than 24h] [--yes]
    kfp-trainer compile [--check] [--output-dir DIR]

``render`` prints the TrainJob as YAML (a dry run to ``kubectl apply``); ``launch`` runs one
TrainJob to its end on the current cluster (or locally with ``--local``); ``run`` runs a whole
pipeline with ``kfp.local``; ``gc`` lists (and with ``--yes`` deletes) TrainJobs whose run or
task is gone; ``compile`` regenerates the component and pipeline YAML and READMEs
(``--check`` fails when they are stale). ``kfp-trainer COMMAND --help`` shows each one's flags.

Exit codes: 0 done; 1 the TrainJob (or, for ``run``, a pipeline step) failed, or ``compile
--check`` found stale files; 2 bad input, or refused by the cluster (RBAC, admission, 401/403);
3 no cluster configured, or its API server unreachable (DNS, refused, TLS, timeout: said
within seconds, in one line); 130 cancelled.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from collections.abc import Sequence
from typing import Any

from .cli_inputs import add_input_flags, inputs_from_args, seconds
from .cli_run import task_outputs
from .errors import KfpTrainerError

__all__ = ["build_parser", "main", "task_outputs"]


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' layout and ends every flag's help with its default."""

    def _get_help_string(self, action: argparse.Action) -> str:
        text = action.help or ""
        if not action.option_strings or action.default is argparse.SUPPRESS or "(default: " in text:
            return text
        if action.nargs == 0:
            return f"{text} (default: off)"
        if action.default is None or action.default == []:
            return text if "when unset" in text else f"{text} (default: unset)"
        return f"{text} (default: %(default)s)"


class VersionAction(argparse.Action):
    """``--version``: this package's version and those of the libraries it is pinned to."""

    def __init__(self, option_strings: Sequence[str], dest: str = argparse.SUPPRESS, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *args: Any, **kwargs: Any) -> None:
        print(version_text())
        parser.exit()


def version_text() -> str:
    """``kfp-trainer 0.1.0 (kfp 2.17.3, kubernetes 30.1.0, Python 3.11.9)``."""
    import platform
    from importlib import metadata

    from . import __version__

    def installed(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    return f"kfp-trainer {__version__} (kfp {installed('kfp')}, kubernetes {installed('kubernetes')}, Python {platform.python_version()})"


def cmd_render(ns: argparse.Namespace) -> int:
    """Print the TrainJob manifest as YAML."""
    from .spec import render

    inputs = inputs_from_args(ns)
    if ns.api_version == "auto":
        from .backends.kubernetes import KubernetesBackend

        backend = KubernetesBackend.from_config(ns.kubeconfig, fail_fast=True)
        info = backend.resolve_runtime(inputs.model_copy(update={"namespace": inputs.namespace or backend.default_namespace()}))
        manifest = render(
            inputs, api_version=info.api_version, runtime_jobs=info.job_names, allow_host_access=info.allow_host_access,
            init_containers=info.init_container_names,
        )
    else:
        manifest = render(inputs, api_version=ns.api_version)
    import yaml

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

        backend = KubernetesBackend.from_config(ns.kubeconfig, fail_fast=True, api_version=ns.api_version)
    options = LaunchOptions(
        start_timeout=ns.start_timeout, run_timeout=ns.run_timeout, queue_timeout=ns.queue_timeout, logs=ns.logs,
        delete_after_success=ns.delete_after_success,
    )
    outcome = Launcher(backend, options).run(inputs)
    print(json.dumps({"trainjob": str(outcome.ref), "phase": outcome.phase.value, "metrics": outcome.metrics.final(),
                      "seconds": outcome.times}))  # fmt: skip
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kfp-trainer``."""
    parser = argparse.ArgumentParser(prog="kfp-trainer", description=__doc__, formatter_class=HelpFormatter)
    parser.add_argument("--version", action=VersionAction, help="print the version (and those of kfp and kubernetes) and exit")
    parser.add_argument("-v", "--verbose", action="store_true", help="log what happens at INFO level")
    sub = parser.add_subparsers(dest="command_name", required=True, metavar="COMMAND")
    kubeconfig_help = "kubeconfig file; $KUBECONFIG, else ~/.kube/config, else the pod's service account when unset"

    render = sub.add_parser("render", help="print the TrainJob manifest (dry run)", formatter_class=HelpFormatter,
                            description="Print the TrainJob a set of inputs renders to, as YAML (a dry run to kubectl apply).")  # fmt: skip
    add_input_flags(render)
    render.add_argument(
        "--api-version", default="v2.2", choices=["v2.1", "v2.2", "auto"],
        help="Trainer API to render for (v2.1: podTemplateOverrides; v2.2+: runtimePatches); auto asks the cluster",
    )  # fmt: skip
    render.add_argument("--kubeconfig", metavar="PATH", help=kubeconfig_help + " (read only with --api-version auto)")
    render.set_defaults(func=cmd_render)

    launch = sub.add_parser("launch", help="run one TrainJob to its end", formatter_class=HelpFormatter,
                            description="Run one TrainJob to its end on the cluster (or --local on this machine), "
                            "streaming the trainer's log; a stop signal deletes it.")  # fmt: skip
    add_input_flags(launch)
    launch.add_argument(
        "--api-version", default="auto", choices=["v2.1", "v2.2", "auto"], help="Trainer API to render for; auto asks the cluster"
    )
    launch.add_argument("--kubeconfig", metavar="PATH", help=kubeconfig_help)
    launch.add_argument("--local", action="store_true", help="run on this machine (the local TrainJob backend) instead of a cluster")
    launch.add_argument(
        "--start-timeout", type=seconds, default=3600.0, metavar="SECONDS",
        help="seconds the job may take to start (scheduling, image pulls), not counting time queued; 0: no limit",
    )  # fmt: skip
    launch.add_argument(
        "--run-timeout", type=seconds, default=0.0, metavar="SECONDS", help="seconds the trainer may run once started; 0: no limit"
    )
    launch.add_argument("--queue-timeout", type=seconds, default=0.0, metavar="SECONDS",
                        help="seconds the job may wait suspended in its queue (Kueue); 0: no limit")  # fmt: skip
    launch.add_argument("--logs", default="0", metavar="WHICH", help="trainer node whose log is streamed (0, 1, ...), all, or none")
    launch.add_argument("--delete-after-success", action="store_true", help="delete the TrainJob once it succeeded")
    launch.set_defaults(func=cmd_launch)

    from .cli_run import add_parser as add_run_parser
    from .gc import add_parser as add_gc_parser

    add_run_parser(sub, HelpFormatter)
    add_gc_parser(sub, HelpFormatter)
    add_compile_parser(sub)
    return parser


def add_compile_parser(sub: Any) -> None:
    """Register ``compile``; its flags are :func:`kfp_trainer.compile.add_arguments` (kfp is imported only when it runs)."""
    from . import compile as gen

    compile_ = sub.add_parser("compile", help="regenerate the components' and pipelines' YAML and READMEs",
                              description=gen.__doc__, formatter_class=HelpFormatter)  # fmt: skip
    gen.add_arguments(compile_)
    compile_.set_defaults(func=gen.run)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kfp-trainer`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        if args[:1] == ["launch"]:  # from here on a stop signal ends with the job deleted or never created
            from . import cancel

            cancel.install()
        parser = build_parser()
        ns = parser.parse_args(args)
        logging.basicConfig(level=logging.INFO if ns.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        code = int(ns.func(ns) or 0)
        if args[:1] == ["launch"]:  # a stop signal while it finished still ends it cancelled
            from . import cancel

            cancel.check()
        return code
    except KfpTrainerError as e:
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code


if __name__ == "__main__":
    sys.exit(main())
