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
from typing import TYPE_CHECKING, Any

from .errors import UserError, ValidationError
from .numbers import parse_float, parse_int
from .redaction import redact_text
from .spec import TrainJobInputs

if TYPE_CHECKING:
    import yaml

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
    "priority_class",
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


def _load_yaml(text: str) -> Any:
    """Plain YAML only (no ``!!python/...`` tags), with libyaml's loader when present (much faster).

    yaml is imported here, on the first YAML value: a launch whose flags are JSON does without it.
    """
    import yaml

    return yaml.load(text, Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader))


def json_value(text: str) -> Any:
    """A JSON (or YAML) flag value; a clear argparse error (exit 2) when it is neither."""
    try:
        return json.loads(text)
    except ValueError:
        pass
    except RecursionError:
        raise argparse.ArgumentTypeError("nested too deeply") from None
    import yaml

    try:
        return _load_yaml(text)
    except yaml.YAMLError as e:
        raise argparse.ArgumentTypeError(f"not valid JSON or YAML: {_yaml_problem(e)}") from None
    except RecursionError:
        raise argparse.ArgumentTypeError("nested too deeply") from None


def _whole_number(text: str) -> int:
    try:
        return parse_int(text, "value")
    except ValidationError as e:  # argparse names the flag
        raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None


def seconds(text: str) -> float:
    """A number of seconds on the command line (ASCII digits; the range is checked with the other options)."""
    try:
        return parse_float(text, "value")
    except ValidationError as e:
        raise argparse.ArgumentTypeError(str(e).removeprefix("value: ")) from None


def _yaml_problem(error: yaml.YAMLError) -> str:
    """What is wrong and where, without echoing the document (it may hold secrets)."""
    problem = getattr(error, "problem", None) or type(error).__name__
    mark = getattr(error, "problem_mark", None)
    return f"{problem} (line {mark.line + 1}, column {mark.column + 1})" if mark is not None else str(problem)


# Help of each input flag: what it sets (the train_job component's input descriptions, shortened).
HELP = {
    "name": "TrainJob name; derived from the run id, task name and inputs when unset",
    "name_prefix": "prefix of the derived TrainJob name",
    "namespace": "namespace of the TrainJob; the kubeconfig context's (or the pod's) when unset",
    "run_id": "run id, for a stable TrainJob name and lineage labels (a KFP run's id in a pipeline)",
    "task_name": "task name, for a stable TrainJob name and lineage labels",
    "pipeline_name": "pipeline run name, for lineage labels",
    "runtime": "name of the ClusterTrainingRuntime or TrainingRuntime to use",
    "runtime_kind": "ClusterTrainingRuntime, or TrainingRuntime (in the job's namespace)",
    "image": "trainer image; the runtime's image when unset",
    "dataset_uri": "dataset for the runtime's dataset initializer (hf://, s3://; with --local also builtin://, file://)",
    "dataset_secret": "Secret (by name) with the dataset initializer's credentials",
    "model_uri": "model for the runtime's model initializer (hf://, s3://; with --local also builtin://, file://)",
    "model_secret": "Secret (by name) with the model initializer's credentials",
    "service_account": "service account of the trainer pods",
    "queue_name": "Kueue LocalQueue to submit to (the kueue.x-k8s.io/queue-name label)",
    "priority_class": "Kueue WorkloadPriorityClass of the job (the kueue.x-k8s.io/priority-class label)",
    "managed_by": "who runs the job: the Trainer when unset, or kueue.x-k8s.io/multikueue (needs --queue-name)",
    "num_nodes": "number of trainer nodes; the runtime's when unset",
    "active_deadline_seconds": "server-side limit on the job's run time in seconds (Trainer v2.2+); none when unset",
    "termination_grace_period_seconds": "seconds the trainer pods get to stop after SIGTERM (Trainer v2.3+); the runtime's when unset",
    "resources_per_node": "resources of each node, e.g. '{\"limits\": {\"nvidia.com/gpu\": 1}}'",
    "labels": "labels of the TrainJob and its JobSet (a map)",
    "annotations": "annotations of the TrainJob's JobSet (a map)",
    "pod_labels": "labels of the trainer pods (a map)",
    "pod_annotations": "annotations of the trainer pods (a map)",
    "volumes": "extra volumes of the trainer pods (a list of Kubernetes volumes)",
    "volume_mounts": "extra volume mounts of the trainer container (a list)",
    "node_selector": "node selector of the trainer pods (a map)",
    "tolerations": "tolerations of the trainer pods (a list)",
    "affinity": "affinity of the trainer pods (a map)",
    "patch": "raw merge patch applied to the rendered TrainJob (expert use; checked again after merging)",
    "dataset_env": "extra environment of the dataset initializer (a map)",
    "model_env": "extra environment of the model initializer (a map)",
    "security_context": "pod security context of the trainer pods (Trainer v2.2+)",
    "container_security_context": "security context of the trainer container (Trainer v2.2+)",
    "init_containers": "env, volumeMounts and securityContext for the runtime's init containers, by name (a list)",
}
LIST_HELP = (
    ": a JSON list, or plain items separated by commas; an item that holds a comma needs the JSON list "
    "(a comma inside brackets or quotes is refused), and a value that starts with a dash needs the = form ({flag}=-x,...)"
)


def _with_default(field: str) -> str:
    """The help of an input flag, with the input's own default when it has one (the flag's is None: "not given")."""
    default = TrainJobInputs.model_fields[field].get_default(call_default_factory=True)
    return HELP[field] + (f" (default: {default})" if default not in ("", None) else "")


def add_input_flags(parser: argparse.ArgumentParser) -> None:
    """Add a flag per TrainJob input (and ``--inputs-file``) to ``parser``, each with its help."""
    group = parser.add_argument_group("TrainJob inputs (same names as the train_job component's)")
    for field in _SIMPLE:
        short = ("-n",) if field == "namespace" else ()  # kubectl's
        group.add_argument(*short, "--" + field.replace("_", "-"), dest=field, help=_with_default(field))
    for field in _INT:
        group.add_argument("--" + field.replace("_", "-"), dest=field, type=_whole_number, metavar="N", help=HELP[field])
    for field in _JSON:
        group.add_argument("--" + field.replace("_", "-"), dest=field, type=json_value, metavar="JSON", help=HELP[field] + ", JSON or YAML")
    group.add_argument(
        "--num-proc-per-node", dest="num_proc_per_node", metavar="N",
        help="processes per node (a whole number; Trainer v2.1 also takes auto, cpu, gpu); the runtime's when unset",
    )  # fmt: skip
    command_help = "trainer command, the runtime's when unset" + LIST_HELP.format(flag="--command")
    group.add_argument("--command", dest="command", metavar="LIST", help=command_help)
    group.add_argument("--args", dest="args", metavar="LIST", help="trainer arguments" + LIST_HELP.format(flag="--args"))
    group.add_argument("--env", dest="env", action="append", metavar="NAME=VALUE",
                       help="trainer environment variable, repeatable (credentials: by Secret, never a value)")  # fmt: skip
    group.add_argument("--image-pull-secrets", dest="image_pull_secrets", metavar="NAMES",
                       help="names of the trainer pods' image pull secrets, comma-separated")  # fmt: skip
    group.add_argument("--scheduling-gates", dest="scheduling_gates", metavar="NAMES",
                       help="scheduling gate names of the trainer pods, comma-separated or a JSON list")  # fmt: skip
    group.add_argument("--suspend", action="store_true", default=None, help="create the TrainJob suspended (for a queue to admit)")
    group.add_argument("--inputs-file", metavar="PATH", help="YAML/JSON file of inputs (a map of input names); flags override it")


# A comma inside one of these belongs to one item (code, a list value): splitting there would cut the item.
_PAIRS = {"(": ")", "[": "]", "{": "}"}
_QUOTES = ("'", '"')


def cuts_a_pair(part: str) -> bool:
    """Whether ``part`` holds an unbalanced bracket or quote: the sign that a comma split one item.

    Example:
        >>> [cuts_a_pair(p) for p in "python,-c,print(1,2)".split(",")]
        [False, False, True, True]
    """
    if any(part.count(quote) % 2 for quote in _QUOTES):
        return True
    closing = {v: k for k, v in _PAIRS.items()}
    depth = dict.fromkeys(_PAIRS, 0)
    for char in part:
        if char in _PAIRS:
            depth[char] += 1
        elif char in closing:
            depth[closing[char]] -= 1
            if depth[closing[char]] < 0:
                return True
    return any(depth.values())


def _split(flag: str, text: str | None) -> list[str] | None:
    if text is None:
        return None
    if not text.startswith("["):
        parts = [part for part in text.split(",") if part]
        if len(parts) > 1 and any(cuts_a_pair(part) for part in parts):
            raise UserError(
                f"--{flag} {redact_text(text)!r}: a comma stands inside brackets or quotes, so splitting at commas would cut an "
                f"item in two; give a JSON list instead, e.g. --{flag} '[\"python\", \"-c\", \"print(1, 2)\"]'"
            )
        return parts
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
    import yaml

    try:
        loaded = _load_yaml(text)
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
    refuse_component_placeholders(given)
    return TrainJobInputs.parse(**given)


def refuse_component_placeholders(given: dict[str, Any]) -> None:
    """``{dataset}``, ``{model}`` and ``{output_model}``: the train_job component fills them in; the CLI has no artifacts to.

    Copied from a pipeline into ``render`` or ``launch``, they would reach the trainer as they
    are: refused (exit 2), naming the value and what to give instead.
    """
    from .errors import InvalidSpecErrors, ValidationError
    from .spec.placeholders import PLACEHOLDERS, placeholders_in, texts

    errors = [
        ValidationError(
            field, text,
            f"a path, not {{{name}}}: the train_job component fills in {{{name}}} ({PLACEHOLDERS[name]}) in a pipeline; "
            "the command line has no artifacts to fill it with",
        )
        for field, text in texts(given)
        for name in sorted(placeholders_in({"args": [text]}))
    ]  # fmt: skip
    if errors:
        raise InvalidSpecErrors(errors)
