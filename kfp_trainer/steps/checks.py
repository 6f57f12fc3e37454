"""What a step checks in its inputs before it touches anything, runnable when a pipeline is built.

When a pipeline calls a component of this package with literal arguments,
:mod:`kfp_trainer.components` runs these checks on them at the call, so a mistake fails
while the pipeline is built -- with the message the step would print on the cluster -- and a
literal credential never reaches the compiled YAML. Each ``check_*`` takes the component's
input values by name (defaults included; ``None`` for a value only the run knows) and raises
one :class:`~kfp_trainer.errors.InvalidSpecErrors` listing every problem. The rules are
those of :mod:`kfp_trainer.spec` and :mod:`kfp_trainer.llm.inputs`, called as the steps call
them; only what a built pipeline cannot know is left out: the run's identity (KFP fills it
in), the runtime (read from the cluster) and volumes the task adds (``kfp.kubernetes.mount_pvc``).

Example:
    >>> check_train_job({"runtime": "torch-distributed", "num_nodes": -2})
    Traceback (most recent call last):
    ...
    kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
      - num_nodes: got -2; expected an integer from 1 to 1024
"""

from __future__ import annotations

import json
from collections.abc import Callable, Collection, Mapping
from typing import Any

from ..errors import InvalidSpecErrors, ValidationError
from ..redaction import find_secret
from .arguments import LAUNCH_OPTIONS, SPECIAL, train_job_inputs, trl_arguments
from .common import unresolved
from .finetune_inputs import read_torchtune, torchtune_finetune_arguments

BUILD_RUN_ID = "pipeline-build"  # stands for the run id, which KFP fills in when the run starts
_TORCHTUNE_LAUNCH = ("backend", "workspace_path", "start_timeout", "run_timeout", "logs")
_FUNCTION_LAUNCH = ("backend", "workspace_path", "start_timeout", "run_timeout")


def errors_of(check: Callable[[], Any]) -> list[ValidationError]:
    """The validation errors ``check()`` raises (none when it returns)."""
    try:
        check()
    except InvalidSpecErrors as e:
        return list(e.errors)
    except ValidationError as e:
        return [e]
    return []


def _raise(errors: list[ValidationError]) -> None:
    if errors:
        raise InvalidSpecErrors(errors)


def launch_option_errors(values: Mapping[str, Any], names: tuple[str, ...]) -> list[ValidationError]:
    """Problems of the launcher's own options among ``values`` (time limits, logs, backend, workspace path)."""
    from ..spec import check_launch_options

    options = {name: values[name] for name in names if name in values}
    if "workspace_path" in options and (options["workspace_path"] is None or unresolved(options["workspace_path"])):
        options["workspace_path"] = ""  # the pipeline workspace: known when the step runs
    if "backend" in options:
        options["backend"] = options["backend"] or "auto"
    return errors_of(lambda: check_launch_options(**options))


def trainjob_errors(inputs: Mapping[str, Any], *, local: bool) -> list[ValidationError]:
    """Problems of TrainJob inputs (``None`` = unset), checked as the launcher checks them before any API call."""
    from ..spec import TrainJobInputs, validate
    from ..spec.inputs import normalize_values

    given = normalize_values({k: v for k, v in inputs.items() if v is not None})
    for name in ("run_id", "task_name", "pipeline_name", "task_id"):
        if unresolved(given.get(name)):
            given.pop(name)
    given.setdefault("run_id", BUILD_RUN_ID)
    mounts, volumes = given.get("volume_mounts"), given.get("volumes")
    if isinstance(mounts, list) and isinstance(volumes, (list, type(None))):
        # Volumes the task may add (kfp.kubernetes.mount_pvc) reach the step only when it runs.
        known = {v.get("name") for v in volumes or [] if isinstance(v, dict)}
        extra = [{"name": m["name"], "emptyDir": {}} for m in mounts if isinstance(m, dict) and isinstance(m.get("name"), str)
                 and m["name"] not in known]  # fmt: skip
        if extra:
            given["volumes"] = list(volumes or []) + extra
    return errors_of(lambda: validate(TrainJobInputs.parse(**given), api_version=None, local=local))


def placeholder_errors(inputs: Mapping[str, Any], *, connected: Collection[str], unknown: bool = True) -> list[ValidationError]:
    """Placeholder mistakes in command, args and env: unknown names (``unknown=True``) and inputs not ``connected``.

    Example:
        >>> [e.field for e in placeholder_errors({"args": ["{model}", "{output_dir}"]}, connected={"dataset"})]
        ['args[1]', 'model']
    """
    from ..spec.placeholders import unconnected_placeholder_errors, unknown_placeholder_errors

    found = unknown_placeholder_errors(inputs) if unknown else []
    return found + unconnected_placeholder_errors(inputs, connected=connected)


def connected_artifacts(values: Mapping[str, Any]) -> set[str]:
    """The input artifacts (``dataset``, ``model``) a step's values connect (a pipeline stands them in as non-None)."""
    return {name for name in ("dataset", "model") if values.get(name) is not None}


def _unique(errors: list[ValidationError]) -> list[ValidationError]:
    seen: set[tuple[str, str]] = set()
    out = []
    for error in errors:
        if (error.field, error.allowed) not in seen:
            seen.add((error.field, error.allowed))
            out.append(error)
    return out


def _local(values: Mapping[str, Any]) -> bool:
    """Whether the step may run on the local backend (then ``builtin://`` and ``file://`` URIs are fine)."""
    return values.get("backend") != "kubernetes"


def check_train_job(values: Mapping[str, Any]) -> None:
    """The ``train_job`` component's inputs, as :func:`~kfp_trainer.steps.run_train_job` checks them."""
    inputs = train_job_inputs(values)
    _raise(_unique(
        launch_option_errors(values, LAUNCH_OPTIONS) + placeholder_errors(inputs, connected=connected_artifacts(values))
        + trainjob_errors(inputs, local=_local(values))
    ))  # fmt: skip


def check_torchtune_finetune(values: Mapping[str, Any]) -> None:
    """The ``torchtune_finetune`` component's inputs, as :func:`~kfp_trainer.steps.run_torchtune_finetune` checks them."""
    args = torchtune_finetune_arguments(dict(values))
    _raise(launch_option_errors(values, _TORCHTUNE_LAUNCH) + torchtune_errors(args, local=_local(values)))


def check_trl_finetune(values: Mapping[str, Any]) -> None:
    """The ``trl_finetune`` component's inputs, as :func:`~kfp_trainer.steps.run_trl_finetune` checks them."""
    from ..llm.trl_config import trl_settings

    args = trl_arguments(dict(values))
    job = args["inputs"]
    nodes, procs = job.get("num_nodes"), job.get("num_proc_per_node")
    known = isinstance(nodes, int) and (isinstance(procs, int) or (isinstance(procs, str) and procs.isdecimal()))
    world_size = int(nodes) * int(procs) if known else None  # else checked when the step has read the runtime
    errors = errors_of(
        lambda: trl_settings(method=args["method"], extra_args=args["extra_args"], world_size=world_size, **args["settings"])
    )
    for uri in ("dataset_uri", "model_uri"):  # fetched by the step: no credentials in them
        if isinstance(args[uri], str) and find_secret(args[uri]):
            errors.append(ValidationError(uri, args[uri], "a URI without credentials -- give the step HF_TOKEN or "
                                          "AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY from a Secret (kfp.kubernetes.use_secret_as_env)"))
    _raise(errors + launch_option_errors(values, _TORCHTUNE_LAUNCH) + trainjob_errors(args["inputs"], local=_local(values)))


def torchtune_errors(args: Mapping[str, Any], *, local: bool) -> list[ValidationError]:
    """Problems of a fine-tune's settings, sources and TrainJob inputs, before its runtime is known.

    ``args`` are :func:`~kfp_trainer.steps.finetune_inputs.torchtune_finetune_arguments`'; the step
    reads them with the same :func:`~kfp_trainer.steps.finetune_inputs.read_torchtune`, so both give
    the same message.
    """
    read = read_torchtune(args)
    return read.errors + trainjob_errors({**(args.get("inputs") or {}), **read.source_inputs()}, local=local)


def check_function(values: Mapping[str, Any], function: Mapping[str, Any] | None = None) -> None:
    """A ``trainjob_component`` component's inputs, as :func:`~kfp_trainer.steps.run_function_job` checks them.

    ``function`` holds what the factory built into the component (``source``, ``name``, ``file``,
    ``arguments``, ``specials`` and the constant TrainJob inputs ``inputs``); without it (a
    component loaded from YAML) the function itself is left to the step.
    """
    from ..spec import rules
    from ..spec.placeholders import unconnected_error

    function = function or {}
    inputs = {k: values.get(k) for k in ("runtime", "run_id", "task_name", "task_id")}
    inputs.update(image=values.get("image") or None, num_nodes=values.get("num_nodes") or None)  # "" and 0: the runtime's
    errors = launch_option_errors(values, _FUNCTION_LAUNCH)
    errors += trainjob_errors({**inputs, **(function.get("inputs") or {})}, local=_local(values))
    connected = connected_artifacts(values)
    for special in function.get("specials") or ():  # dataset_dir / model_dir: the input artifact's path
        name = SPECIAL[special][1:-1]
        if name in ("dataset", "model") and name not in connected:
            errors.append(unconnected_error(name))
    if function.get("source"):
        from ..llm.inputs import FunctionTrainerSettings, parse

        arguments = {name: values.get(name) for name in function.get("arguments") or ()}
        packages, indexes = values.get("packages_to_install"), values.get("pip_index_urls")
        errors += errors_of(lambda: parse(
            FunctionTrainerSettings, func_source=function["source"], func_name=function["name"], func_file=function["file"],
            func_args={**arguments, **{s: SPECIAL[s] for s in function.get("specials") or ()}},
            packages_to_install=packages or None, **({"pip_index_urls": indexes} if indexes else {}),
        ))  # fmt: skip
        for name, value in arguments.items():  # they travel in the TrainJob's command, as JSON
            errors += rules.check_secret_text(name, json.dumps({name: value}, default=str))
    _raise(errors)


def check_initializer(values: Mapping[str, Any]) -> None:
    """A ``dataset_initializer`` / ``model_initializer`` source: no credentials in the URI.

    Example:
        >>> check_initializer({"uri": "s3://AKIAIOSFODNN7EXAMPLE:wJalrXUtnFEMI@bucket/data"})
        Traceback (most recent call last):
        ...
        kfp_trainer.errors.InvalidSpecErrors: 1 invalid input(s):
          - uri: got 's3://***@bucket/data'; expected a URI without credentials -- ...
    """
    uri = values.get("uri")
    if isinstance(uri, str) and find_secret(uri):
        _raise([ValidationError("uri", uri, "a URI without credentials -- give the step HF_TOKEN or AWS_ACCESS_KEY_ID and "
                                "AWS_SECRET_ACCESS_KEY from a Secret (kfp.kubernetes.use_secret_as_env)")])  # fmt: skip
