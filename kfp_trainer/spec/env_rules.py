"""Checks of environment variables: names, reserved prefixes, references, no literal credentials. Pure.

Like every check in :mod:`kfp_trainer.spec.rules`, each returns a list of
:class:`~kfp_trainer.errors.ValidationError` (empty when fine) and never raises.
"""

from __future__ import annotations

import re
from typing import Any

from ..errors import ValidationError
from ..redaction import HIDDEN, env_item_shape, harmless_literal, is_secret_name
from .rules import DNS_LABEL, ENV_NAME, check_local_path, check_secret_text, check_structure, check_text, ok

_ENV_FILE_KEY = re.compile(r"[!-<>-~]+")  # printable ASCII without space and '='


def check_env(field: str, env: Any, *, reserved: tuple[str, ...] = (), file_refs: bool = True) -> list[ValidationError]:
    """A list of EnvVar dicts: names, reserved prefixes, duplicates, references, no literal credentials.

    ``file_refs=False`` refuses ``valueFrom.fileKeyRef`` (the trainer's and the initializers'
    env: the Trainer controller does not pass it on).

    Example:
        >>> [(e.field, e.value) for e in check_env("env", [{"name": "HF-TOKEN", "value": "abc"}, {"name": "N", "value": "1"}])]
        [('env[0].value', '<hidden>')]
    """
    if not isinstance(env, list):
        return [ValidationError(field, env, "a list of EnvVar objects")]
    errors: list[ValidationError] = []
    seen: set[str] = set()
    for i, item in enumerate(env):
        where = f"{field}[{i}]"
        if not isinstance(item, dict) or set(item) - {"name", "value", "valueFrom"}:
            errors.append(ValidationError(where, env_item_shape(item), "an EnvVar with keys name, value or valueFrom"))
            continue
        name = item.get("name")
        if not isinstance(name, str) or not ok(ENV_NAME, name, 1024):
            errors.append(
                ValidationError(f"{where}.name", name, "an env var name: letters, digits, '_', '-', '.', not starting with a digit")
            )
            continue
        if name in seen:
            errors.append(ValidationError(f"{where}.name", name, "each env var name once"))
        seen.add(name)
        if name.upper().startswith(reserved):
            errors.append(
                ValidationError(
                    f"{where}.name",
                    name,
                    f"a name not starting with {', '.join(reserved)} (the Trainer controller sets those itself; "
                    "use num_nodes / num_proc_per_node)",
                )
            )
        if "value" in item and "valueFrom" in item:
            errors.append(ValidationError(where, env_item_shape(item), "either value or valueFrom, not both"))
        elif "valueFrom" in item:
            errors += _check_value_from(f"{where}.valueFrom", item["valueFrom"], file_refs)
        elif "value" in item:
            errors += _check_env_value(f"{where}.value", name, item["value"])
    return errors


_NO_FILE_REFS = (
    "secretKeyRef, configMapKeyRef, fieldRef or resourceFieldRef: Kubeflow Trainer (v2.3) does not pass fileKeyRef on from "
    "the trainer's or the initializers' env -- the pods could not be created; set it on an init container of the runtime "
    "(init_containers) or read the env file in the trainer"
)


def _check_value_from(where: str, source: Any, file_refs: bool = True) -> list[ValidationError]:
    kinds = ("secretKeyRef", "configMapKeyRef", "fieldRef", "resourceFieldRef", "fileKeyRef")
    if (
        not isinstance(source, dict)
        or len(source) != 1
        or next(iter(source)) not in kinds
        or not isinstance(next(iter(source.values())), dict)
    ):
        return [ValidationError(where, env_item_shape(source), "one of " + ", ".join(kinds))]
    if "fileKeyRef" in source:
        return check_file_key_ref(f"{where}.fileKeyRef", source["fileKeyRef"]) if file_refs else [
            ValidationError(f"{where}.fileKeyRef", source["fileKeyRef"], _NO_FILE_REFS)
        ]
    return check_structure(where, source)


def check_file_key_ref(where: str, ref: dict[str, Any]) -> list[ValidationError]:
    """``{volumeName, path, key[, optional]}``: a key of an env file on one of the pod's (emptyDir) volumes.

    Example:
        >>> [e.field for e in check_file_key_ref("env[0].valueFrom.fileKeyRef", {"volumeName": "cfg", "path": "../x", "key": "A"})]
        ['env[0].valueFrom.fileKeyRef.path']
    """
    if set(ref) - {"volumeName", "path", "key", "optional"} or not {"volumeName", "path", "key"} <= set(ref):
        return [ValidationError(where, ref, "{volumeName, path, key} and optionally optional (true or false)")]
    errors = [] if ok(DNS_LABEL, ref["volumeName"], 63) else [ValidationError(f"{where}.volumeName", ref["volumeName"], "a volume name")]
    errors += check_local_path(f"{where}.path", ref["path"], absolute=False)
    if not ok(_ENV_FILE_KEY, ref["key"], 128):
        errors.append(ValidationError(f"{where}.key", ref["key"], "1 to 128 printable ASCII characters, no '='"))
    if not isinstance(ref.get("optional", False), bool):
        errors.append(ValidationError(f"{where}.optional", ref["optional"], "true or false"))
    return errors


def _check_env_value(where: str, name: str, value: Any) -> list[ValidationError]:
    if not isinstance(value, str):
        kind = {bool: "a boolean", int: "a number", float: "a number", list: "a list", dict: "a map"}.get(type(value), "null")
        shown = value if kind in ("a boolean", "a number") and not is_secret_name(name) else HIDDEN
        return [ValidationError(where, shown, f"a string, not {kind}")]
    errors = check_text(where, value)
    if errors:
        if is_secret_name(name):  # what is wrong with it, never the value
            return [ValidationError(where, HIDDEN, e.allowed) for e in errors]
        return errors
    if is_secret_name(name) and not harmless_literal(value):
        return [ValidationError(where, HIDDEN, literal_credential_advice(where, name))]
    return check_secret_text(where, value)


def literal_credential_advice(where: str, name: str) -> str:
    """What to do instead of writing credential-like ``name`` literally into the env at ``where``.

    A pipeline cannot pass ``valueFrom`` through the component's ``env`` (a map of names to
    values: KFP's type check refuses an EnvVar list), so the advice there is
    ``kfp.kubernetes.use_secret_as_env``, whose env reaches the TrainJob through the task's
    config; the library and ``kfp-trainer launch`` do take an EnvVar list.

    Example:
        >>> print(literal_credential_advice("env[0].value", "HF_TOKEN"))  # doctest: +NORMALIZE_WHITESPACE
        no literal value for credential-like HF_TOKEN -- take it from a Secret: in a pipeline,
        kfp.kubernetes.use_secret_as_env(task, secret_name='my-secret', secret_key_to_env={'hf_token': 'HF_TOKEN'});
        with build_trainjob or kfp-trainer launch, env as a list with
        {'name': 'HF_TOKEN', 'valueFrom': {'secretKeyRef': {'name': 'my-secret', 'key': 'hf_token'}}}
    """
    for kind in ("dataset", "model"):
        if where.startswith(f"{kind}_env"):
            return (
                f"no literal value for credential-like {name} -- put it in a Secret and name that Secret in {kind}_secret "
                f"(the {kind} initializer reads its keys as env vars)"
            )
    key = name.lower()
    return (
        f"no literal value for credential-like {name} -- take it from a Secret: in a pipeline, "
        f"kfp.kubernetes.use_secret_as_env(task, secret_name='my-secret', secret_key_to_env={{'{key}': '{name}'}}); "
        f"with build_trainjob or kfp-trainer launch, env as a list with "
        f"{{'name': '{name}', 'valueFrom': {{'secretKeyRef': {{'name': 'my-secret', 'key': '{key}'}}}}}}"
    )
