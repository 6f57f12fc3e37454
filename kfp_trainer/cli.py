"""The ``kfp-trainer`` command line.

    kfp-trainer render --runtime torch-distributed --num-nodes 2 --run-id r1 --task-name train [-o yaml|json]
    kfp-trainer launch --runtime torch-distributed --image my/trainer:1 --command torchrun,train.py
    kfp-trainer run pipelines/llm_finetune --local
    kfp-trainer gc [-n NS | -A] [--older-than 24h] [--yes] [-o json|yaml]
    kfp-trainer compile [--check] [--output-dir DIR]

``render`` prints the TrainJob as YAML (a dry run to ``kubectl apply``); ``launch`` runs one
TrainJob to its end on the current cluster (or locally with ``--local``); ``run`` runs a whole
pipeline with ``kfp.local``; ``gc`` lists (and with ``--yes`` deletes) TrainJobs whose run or
task is gone; ``compile`` regenerates the component and pipeline YAML and READMEs
(``--check`` fails when they are stale). ``kfp-trainer COMMAND --help`` shows each one's flags.
Every input is checked before a connection to the cluster is opened: bad input is said as bad
input (exit code 2) even when no cluster can be reached.

Exit codes: 0 done; 1 the TrainJob (or, for ``run``, a pipeline step) failed, or ``compile
--check`` found stale files; 2 bad input, or refused by the cluster (RBAC, admission, 401/403);
3 no cluster configured, or its API server unreachable (DNS, refused, TLS, timeout: said
within seconds, in one line); 130 cancelled; 141 the reader of the output went away
(``| head``), said by nothing but the code, as ``git`` and ``kubectl`` do; for ``launch`` once
the job it made is deleted (a launch nobody follows any more is cancelled, see ``docs/cancel.md``).
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import re
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

from .cli_inputs import add_input_flags, inputs_from_args, seconds
from .cli_run import task_outputs
from .errors import EXIT_READER_GONE, EXIT_USER, KfpTrainerError
from .redaction import redact_text

__all__ = ["build_parser", "main", "plain_text", "task_outputs"]


_ROLE = re.compile(r":[a-z]+(?::[a-z]+)?:`~?([^`<]*?)\s*(?:<[^`>]*>)?`")
_LITERAL = re.compile(r"``(.+?)``|`([^`]+)`|\*\*(\S.*?)\*\*", re.S)  # ``literal``, `text`, **strong**


def plain_text(text: str) -> str:
    """``text`` (a docstring) without its reST markup, as a terminal shows it.

    Example:
        >>> plain_text("``render`` prints it; see :func:`~kfp_trainer.spec.render` and :mod:`kfp_trainer.gc`")
        'render prints it; see render and kfp_trainer.gc'
        >>> plain_text("**task gone** -- ``--check``; :class:`the error <kfp_trainer.errors.UserError>`")
        'task gone -- --check; the error'
    """

    def role(match: re.Match[str]) -> str:
        target = match.group(1)
        return target.rsplit(".", 1)[-1] if match.group(0).split("`", 1)[1].startswith("~") else target

    return _LITERAL.sub(lambda m: m.group(1) or m.group(2) or m.group(3), _ROLE.sub(role, text))


class Parser(argparse.ArgumentParser):
    """An argument error in two lines (what is wrong, and where the help is), not the whole usage first."""

    def error(self, message: str) -> NoReturn:
        """Print ``kfp-trainer launch: error: ...`` and ``see 'kfp-trainer launch --help'``; exit 2."""
        self.exit(EXIT_USER, f"{self.prog}: error: {redact_text(message)}\nsee '{self.prog} --help'\n")


class HelpFormatter(argparse.RawDescriptionHelpFormatter):
    """Keeps the descriptions' layout, shows them without reST markup and ends every flag's help with its default."""

    def _format_text(self, text: str) -> str:
        return super()._format_text(plain_text(text))

    def _expand_help(self, action: argparse.Action) -> str:
        return plain_text(super()._expand_help(action))

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


def write(document: Any, output: str, *, indent: int | None = 2) -> None:
    """Print ``document`` as ``yaml`` (block style, keys in order) or ``json`` (``indent=None``: on one line)."""
    if output == "yaml":
        import yaml

        yaml.safe_dump(document, sys.stdout, sort_keys=False)
    else:
        print(json.dumps(document, indent=indent))


def cmd_render(ns: argparse.Namespace) -> int:
    """Print the TrainJob manifest as YAML (or JSON)."""
    from .spec import render

    inputs = inputs_from_args(ns)
    if ns.api_version == "auto":
        from .backends.kube.connect import connect, kubeconfig_namespace
        from .backends.kubernetes import KubernetesBackend
        from .prepare import check_inputs

        check_inputs(inputs, local=False)  # what the inputs alone can fail on is said before the cluster is asked
        api = connect(ns.kubeconfig, hint="(--api-version v2.2 or v2.1 renders without a cluster)")
        backend = KubernetesBackend(api, namespace=kubeconfig_namespace(ns.kubeconfig))
        info = backend.resolve_runtime(inputs.model_copy(update={"namespace": inputs.namespace or backend.default_namespace()}))
        manifest = render(
            inputs, api_version=info.api_version, runtime_jobs=info.job_names, allow_host_access=info.allow_host_access,
            init_containers=info.init_container_names,
        )
    else:
        manifest = render(inputs, api_version=ns.api_version)
    write(manifest, ns.output)
    return 0


def cmd_launch(ns: argparse.Namespace) -> int:
    """Run one TrainJob to its end and print a summary."""
    from .cancel import Stop
    from .launcher import Launcher, LaunchOptions
    from .prepare import check_inputs, prepare
    from .spec import check_launch_options

    stop: Stop = getattr(ns, "stop", None) or Stop()  # run_command's: a stop signal from the first instruction on
    inputs = inputs_from_args(ns)
    check_launch_options(start_timeout=ns.start_timeout, run_timeout=ns.run_timeout, queue_timeout=ns.queue_timeout, logs=ns.logs,
                         metric_names=ns.metric_names)  # fmt: skip
    # every check the inputs alone can fail is made before a connection: bad input is exit 2 even with no cluster
    check_inputs(inputs, local=ns.local, api_version=None if ns.api_version == "auto" else ns.api_version)
    if ns.local:
        from .backends.local import LocalBackend

        backend: Any = LocalBackend()
    else:
        from .backends.kubernetes import KubernetesBackend

        # a stop signal while connecting is a cancel, not an unreachable cluster
        backend = KubernetesBackend.from_config(ns.kubeconfig, fail_fast=True, api_version=ns.api_version, stop=stop)
    options = LaunchOptions(
        start_timeout=ns.start_timeout, run_timeout=ns.run_timeout, queue_timeout=ns.queue_timeout, logs=ns.logs,
        delete_after_success=ns.delete_after_success, metric_names=ns.metric_names,
    )
    outcome = Launcher(backend, options, stop=stop).run(prepare(backend, inputs, stop=stop))
    summary = {"trainjob": str(outcome.ref), "phase": outcome.phase.value, "metrics": outcome.metrics.final(), "seconds": outcome.times}
    write(summary, ns.output, indent=None)  # json on one line, as before -o existed
    return 0


def build_parser() -> argparse.ArgumentParser:
    """The argument parser of ``kfp-trainer``."""
    parser = Parser(prog="kfp-trainer", description=__doc__, formatter_class=HelpFormatter)
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
    render.add_argument("-o", "--output", default="yaml", choices=["yaml", "json"], help="format of the manifest")
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
    launch.add_argument(
        "--metrics", "--metric-names", dest="metric_names", default="", metavar="NAMES",
        help="metrics to keep: comma-separated names and re:REGEX patterns that the whole name must match (loss,re:eval_.*); "
        "a name listed is read from library log lines too; every metric in lines that are not library log lines when unset",
    )  # fmt: skip
    launch.add_argument("-o", "--output", default="json", choices=["json", "yaml"],
                        help="format of the summary printed at the end (json: one line)")  # fmt: skip
    launch.set_defaults(func=cmd_launch, stoppable=True)  # run_command makes its stop token

    from .cli_run import add_parser as add_run_parser
    from .gc import add_parser as add_gc_parser

    add_run_parser(sub, HelpFormatter)
    add_gc_parser(sub, HelpFormatter)
    add_compile_parser(sub)
    return parser


def add_compile_parser(sub: Any) -> None:
    """Register ``compile``; its flags are ``kfp_trainer.compile.add_arguments``'s (kfp is imported only when it runs)."""
    from . import compile as gen

    compile_ = sub.add_parser("compile", help="regenerate the components' and pipelines' YAML and READMEs",
                              description=gen.__doc__, formatter_class=HelpFormatter)  # fmt: skip
    gen.add_arguments(compile_)
    compile_.set_defaults(func=gen.run)


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of the ``kfp-trainer`` console script."""
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        try:
            return run_command(args)
        finally:
            sys.stdout.flush()  # a closed pipe shows here (after --help's exit too), not at the interpreter's exit
    except BrokenPipeError:
        return reader_gone()


def run_command(args: list[str]) -> int:
    """Parse ``args`` and run the command; a :class:`KfpTrainerError` becomes one ``error:`` message and its exit code."""
    try:
        ns = parse(build_parser(), args)  # creates nothing: a stop signal until here just ends the process
        logging.basicConfig(level=logging.INFO if ns.verbose else logging.WARNING, format="%(levelname)s %(name)s: %(message)s")
        # A command that creates something (launch), as the parser found it -- wherever its name stands among
        # the global flags: from here on a stop signal, or a reader of the output that went away, ends it with
        # the job deleted or never created (and, while it finished, still ends it cancelled); the token goes
        # down to the command through ``ns.stop``.
        with _stopping(bool(getattr(ns, "stoppable", False))) as stop:
            ns.stop = stop
            return int(ns.func(ns) or 0)
    except KfpTrainerError as e:
        say_error(e)
        return e.exit_code


def say_error(error: KfpTrainerError) -> None:
    """``error: ...`` on stderr; a stderr with no reader any more is not an error of its own (the exit code says it)."""
    try:
        print(f"error: {error}", file=sys.stderr, flush=True)
    except OSError:
        pass


def _stopping(wanted: bool) -> Any:
    """:func:`kfp_trainer.cancel.stopping` when ``wanted``, else a context that yields None."""
    if not wanted:
        return contextlib.nullcontext(None)
    from .cancel import stopping

    return stopping()


def parse(parser: argparse.ArgumentParser, args: Sequence[str]) -> argparse.Namespace:
    """``args`` parsed; a flag the command does not take is refused by the command (its name, its ``--help``)."""
    ns, extra = parser.parse_known_args(args)
    if extra:
        import difflib

        command = subparsers(parser).get(getattr(ns, "command_name", None) or "", parser)
        known = [flag for action in command._actions for flag in action.option_strings if flag.startswith("--")]
        typed = [arg.partition("=")[0] for arg in extra if arg.startswith("--")]
        close = [match for flag in typed for match in difflib.get_close_matches(flag, known, n=1)]
        hint = f" (did you mean {' or '.join(dict.fromkeys(close))}?)" if close else ""
        command.error(f"unrecognized arguments: {' '.join(extra)}{hint}")
    return ns


def subparsers(parser: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    """The parser of each subcommand of ``parser``, by name."""
    for action in parser._actions:  # argparse keeps them nowhere public
        if isinstance(action, argparse._SubParsersAction):
            return dict(action.choices)
    return {}


def reader_gone() -> int:
    """The reader of stdout went away: say nothing more to it (no traceback) and end with :data:`EXIT_READER_GONE`."""
    from .cancel import to_devnull

    to_devnull(sys.stdout)  # what is still buffered would fail again at exit
    return EXIT_READER_GONE


if __name__ == "__main__":
    sys.exit(main())
