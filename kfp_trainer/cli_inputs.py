"""TrainJob inputs from command-line flags and ``--inputs-file``, every bad one a clear error.

Flags carry the ``train_job`` component's input names with dashes (``--num-nodes``);
map and list inputs take JSON (or YAML) text; ``--inputs-file`` reads a YAML/JSON map of
inputs that flags override. Whatever is given -- a missing or binary file, non-UTF-8 text,
a ``!!python/...`` tag, broken JSON, a value of the wrong type -- ends in a
:class:`~kfp_trainer.errors.UserError` or an argparse error (exit code 2) that names the
flag or input and never echoes a secret; never a traceback.

Example:
    >>> parser = argparse.ArgumentParser()
    >>> add_input_flags(parser)
    >>> inputs_from_args(parser.parse_args(["--run-id", "r1", "--num-nodes", "2", "--env", "EPOCHS=3"])).env
    {'EPOCHS': '3'}
"""

from __future__ import annotations

import argparse
import json
from typing import Any

import yaml

from .errors import UserError, ValidationError
from .numbers import parse_float, parse_int
from .spec import TrainJobInputs

# Flags that map one-to-one onto TrainJobInputs fields (flag name = field with dashes).
_SIMPLE = (
    "name",
    "name_prefix",
    "namespace",
    "run_id",
    "task_name",
    "pipeline_name",
    "runtime",
    "runtime_kind",
    "image",
    "dataset_uri",
    "dataset_secret",
    "model_uri",
    "model_secret",
    "service_account",
    "queue_name",
    "managed_by",
)
_INT = ("num_nodes", "active_deadline_seconds", "termination_grace_period_seconds")
_JSON = (
    "resources_per_node",
    "labels",
    "annotations",
    "pod_labels",
    "pod_annotations",
    "volumes",
    "volume_mounts",
    "node_selector",
    "tolerations",
    "affinity",
    "patch",
    "dataset_env",
    "model_env",
    "security_context",
    "container_security_context",
    "init_containers",
)


MAX_INPUTS_FILE_BYTES = 8 * 2**20
# Plain YAML only (no !!python/... tags); libyaml's loader when present, it is much faster.
_SAFE_LOADER: Any = getattr(yaml, "CSafeLoader", yaml.SafeLoader)


def json_value(text: str) -> Any:
    """A JSON (or YAML) flag value; a clear argparse error (exit 2) when it is neither."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    except RecursionError:
        raise argparse.ArgumentTypeError("nested too deeply") from None
    try:
        return yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON or YAML: {_yaml_problem(e)}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError("nested too deeply") from None


def _whole_number(text: str) -> int:
    try:
        return parse_int(text, "value")
    except ValidationError as e:  # argparse names the flag
        raise argparse.ArgumentTypeError(str(e)) from None


def seconds(text: str) -> float:
    """A number of seconds on the command line (ASCII digits; the range is checked with the other options)."""
    try:
        return parse_float(text, "value")
    except ValidationError as e:
        raise argparse.ArgumentTypeError(str(e)) from None


def _yaml_problem(error: yaml.YAMLError) -> str:
    """What is wrong and where, without echoing the document (it may hold secrets)."""
    problem = getattr(error, "problem", None) or type(error).__name__
    mark = getattr(error, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else str(problem)


def add_input_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag per TrainJob input (and ``--inputs-file``) to ``parser``."""
    group = parser.add_argument_group("TrainJob inputs (same names as the train_job component's)")
    for field in _SIMPLE:
        group.add_argument("--" + field.replace("_", "-"), dest=field)
    for field in _INT:
        group.add_argument("--" + field.replace("_", "-"), dest=field, type=_whole_number, metavar="N")
    for field in _JSON:
        group.add_argument("--" + field.replace("_", "-"), dest=field, type=json_value, metavar="JSON")
    group.add_argument("--num-proc-per-node", dest="num_proc_per_node")
    group.add_argument("--command", dest="command", help="comma-separated, or a JSON list")
    group.add_argument("--args", dest="args", help="comma-separated, or a JSON list")
    group.add_argument("--env", dest="env", action="append", metavar="NAME=VALUE", help="repeatable")
    group.add_argument("--image-pull-secrets", dest="image_pull_secrets", help="comma-separated")
    group.add_argument("--scheduling-gates", dest="scheduling_gates", help="comma-separated, or a JSON list")
    group.add_argument("--suspend", action="store_true", default=None)
    group.add_argument("--inputs-file", help="YAML/JSON file of inputs; flags override it")


def _split(flag: str, text: str | None) -> list[str] | None:
    if text is None:
        return None
    if not text.startswith("["):
        return [part for part in text.split(",") if part]
    try:
        items = json.loads(text)
    except (ValueError, RecursionError):
        raise UserError(f"--{flag}: not a valid JSON list; give a JSON list of strings or comma-separated values") from None
    if not isinstance(items, list) or not all(isinstance(x, (str, int, float)) and not isinstance(x, bool) for x in items):
        raise UserError(f"--{flag}: expected a JSON list of strings (or numbers)")
    return [x if isinstance(x, str) else json.dumps(x) for x in items]


def load_inputs_file(path: str) -> dict[str, Any]:
    """The inputs in a YAML/JSON file, or a :class:`UserError` saying what is wrong with it.

    Only plain YAML is read (``yaml.safe_load``: no ``!!python/...`` tags); the file must be
    UTF-8 text holding a map of input names.
    """
    try:
        with open(path, "rb") as f:
            data = f.read(MAX_INPUTS_FILE_BYTES + 1)
    except OSError as e:
        raise UserError(f"--inputs-file {path}: cannot read it ({e.strerror or type(e).__name__})") from None
    if len(data) > MAX_INPUTS_FILE_BYTES:
        raise UserError(f"--inputs-file {path}: larger than {MAX_INPUTS_FILE_BYTES // 2**20} MiB")
    if b"\0" in data:
        raise UserError(f"--inputs-file {path}: not a text file (it contains NUL bytes)")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as e:
        raise UserError(f"--inputs-file {path}: not UTF-8 text (byte {e.start})") from None
    try:
        loaded = yaml.load(text, Loader=_SAFE_LOADER)
    except yaml.YAMLError as e:
        raise UserError(f"--inputs-file {path}: not valid YAML or JSON: {_yaml_problem(e)}") from None
    except RecursionError:
        raise UserError(f"--inputs-file {path}: nested too deeply") from None
    if loaded is None:
        return {}
    if not isinstance(loaded, dict):
        raise UserError(f"--inputs-file {path}: expected a map of input names to values, got a {type(loaded).__name__}")
    odd = [k for k in loaded if not isinstance(k, str)]
    if odd:
        raise UserError(f"--inputs-file {path}: keys must be input names (text), got {odd[0]!r}")
    return loaded


def inputs_from_args(ns: argparse.Namespace) -> TrainJobInputs:
    """Collect TrainJobInputs from parsed flags (and ``--inputs-file``)."""
    given: dict[str, Any] = load_inputs_file(ns.inputs_file) if ns.inputs_file else {}
    for field in (*_SIMPLE, *_INT, *_JSON, "num_proc_per_node", "suspend"):
        value = getattr(ns, field)
        if value is not None:
            given[field] = value
    for field in ("command", "args", "image_pull_secrets", "scheduling_gates"):
        if getattr(ns, field) is not None:
            given[field] = _split(field.replace("_", "-"), getattr(ns, field))
    if ns.env:
        env = given.get("env") or {}
        if not isinstance(env, dict):
            raise UserError("--env: cannot be combined with an env list in --inputs-file; give env as a map there")
        env = dict(env)
        for i, item in enumerate(ns.env):
            key, sep, value = item.partition("=")
            if not sep:  # the text is not shown: without a NAME= it may be the value alone
                raise UserError(f"--env (item {i + 1} of {len(ns.env)}, {len(item)} characters without '='): expected NAME=VALUE")
            env[key] = value
        given["env"] = env
    if isinstance(given.get("num_proc_per_node"), str) and given["num_proc_per_node"].isascii() and given["num_proc_per_node"].isdigit():
        given["num_proc_per_node"] = int(given["num_proc_per_node"])
    return TrainJobInputs.parse(**given)
