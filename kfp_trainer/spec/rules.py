"""Checks of single values: texts, names, env lists, label maps, URIs, quantities, arguments. Pure.

Each check returns a list of :class:`~kfp_trainer.errors.ValidationError` (empty when the
value is fine) and never raises, whatever the value's type: the caller collects every
problem and reports them at once. Patterns always match the whole string
(``re.fullmatch``), so a trailing newline is never let through.
"""

from __future__ import annotations

import math
import re
from collections.abc import Callable
from typing import Any
from urllib.parse import unquote

from ..errors import ValidationError
from ..quantity import number_as_quantity, parse_quantity
from ..redaction import HIDDEN, find_secret, harmless_literal, is_secret_name
from .inputs import INT64_MAX, MAX_DEPTH, MAX_NODES_IN_VALUE, MAX_VALUE_BYTES
from .resources import whole_devices_text

CONTROL = re.compile(r"[\x00-\x08\x0b\x0c\x0e-\x1f\x7f-\x9f\u2028\u2029]")  # tab, newline, CR allowed in free text
ENV_NAME = re.compile(r"[-._a-zA-Z][-._a-zA-Z0-9]*")
DNS_SUBDOMAIN = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?(\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*")
DNS_LABEL = re.compile(r"[a-z0-9]([-a-z0-9]*[a-z0-9])?")
QUALIFIED_NAME = re.compile(r"([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9]")
IMAGE = re.compile(
    r"(?:[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?(?:\.[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?)*(?::[0-9]{1,5})?/)?"
    r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*(?:/[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*)*"
    r"(?::[A-Za-z0-9_][A-Za-z0-9_.-]{0,127})?(?:@[A-Za-z][A-Za-z0-9]*(?:[-_+.][A-Za-z][A-Za-z0-9]*)*:[0-9a-fA-F]{32,})?"
)
_URI = re.compile(r"([A-Za-z][A-Za-z0-9+.-]*)://(\S+)")
_S3_BUCKET = re.compile(r"[A-Za-z0-9]([A-Za-z0-9._-]{0,253}[A-Za-z0-9])?")
_HF_PART = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,95}")
_FLAG = re.compile(r"-{1,2}([A-Za-z][A-Za-z0-9_.-]*)")
_ASSIGN = re.compile(r"(?<![A-Za-z0-9_.-])-{0,2}([A-Za-z_][A-Za-z0-9_.-]*)[\"']?(?:=|:[ \t]*)[\"']?([^\s'\",;&}]+)")
_MAX_ERRORS_PER_VALUE = 5


def ok(pattern: re.Pattern[str], value: Any, max_len: int | None = None) -> bool:
    """True when ``value`` is a string that ``pattern`` matches in full (and fits ``max_len``)."""
    return isinstance(value, str) and (max_len is None or len(value) <= max_len) and pattern.fullmatch(value) is not None


def size_text(n: int) -> str:
    """A byte count for people: ``2.0 MiB``."""
    for unit, scale in (("MiB", 2**20), ("KiB", 2**10)):
        if n >= scale:
            return f"{n / scale:.1f} {unit}"
    return f"{n} bytes"


def key_path(base: str, key: Any) -> str:
    """``base.key`` for identifier-like keys, ``base['key']`` otherwise."""
    if isinstance(key, int):
        return f"{base}[{key}]"
    if isinstance(key, str) and re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", key):
        return f"{base}.{key}" if base else key
    return f"{base}[{key!r}]"


def check_text(field: str, value: Any, *, max_bytes: int = MAX_VALUE_BYTES) -> list[ValidationError]:
    """Free text: a string without control characters (tab and newlines allowed), not too large.

    Example:
        >>> check_text("env[0].value", "newline" + chr(10) + "is fine"), [e.field for e in check_text("args[0]", chr(0))]
        ([], ['args[0]'])
    """
    if not isinstance(value, str):
        return [ValidationError(field, value, "a string")]
    if CONTROL.search(value):
        return [ValidationError(field, value, "text without control characters (NUL, escape, ...; tab and newline are fine)")]
    size = len(value.encode("utf-8", "surrogatepass"))
    if size > max_bytes:
        return [ValidationError(field, size_text(size), f"at most {size_text(max_bytes + 1)} (larger values cannot reach a process)")]
    return []


def check_structure(field: str, value: Any, *, path: Callable[[str, Any], str] = key_path) -> list[ValidationError]:
    """Any JSON-like value: only JSON types, text keys, finite numbers within int64, free text, bounded nesting and size.

    Example:
        >>> [str(e) for e in check_structure("patch", {"spec": {"trainer": {"numNodes": float("nan")}}})]
        ['patch.spec.trainer.numNodes: got nan; expected a finite number']
    """
    errors: list[ValidationError] = []
    budget = [MAX_NODES_IN_VALUE]

    def walk(where: str, item: Any, depth: int, hidden: bool = False) -> None:
        if len(errors) >= _MAX_ERRORS_PER_VALUE:
            return
        budget[0] -= 1
        if budget[0] < 0:
            if budget[0] == -1:
                errors.append(ValidationError(field, "...", f"at most {MAX_NODES_IN_VALUE} values in all"))
            return
        if depth > MAX_DEPTH:
            errors.append(ValidationError(where, "...", f"values nested at most {MAX_DEPTH} levels deep"))
            return
        if isinstance(item, dict):
            secret_env = is_secret_name(item.get("name"))  # an EnvVar of a credential: its value is never shown
            for key, sub in item.items():
                if not isinstance(key, str):
                    errors.append(ValidationError(where, key, "text keys only"))
                elif CONTROL.search(key) or len(key) > 253:
                    errors.append(ValidationError(where, key, "keys of at most 253 characters without control characters"))
                else:
                    walk(path(where, key), sub, depth + 1, hidden or (secret_env and key == "value"))
        elif isinstance(item, list):
            for i, sub in enumerate(item):
                walk(path(where, i), sub, depth + 1, hidden)
        elif isinstance(item, str):
            found = check_text(where, item)
            errors.extend([ValidationError(where, HIDDEN, e.allowed) for e in found] if hidden else found)
        elif isinstance(item, bool) or item is None:
            return
        elif isinstance(item, int):
            if abs(item) > INT64_MAX:
                errors.append(ValidationError(where, item, "a number within 64 bits"))
        elif isinstance(item, float):
            if not math.isfinite(item):
                errors.append(ValidationError(where, item, "a finite number"))
        else:
            errors.append(ValidationError(where, type(item).__name__, "a JSON value: map, list, string, number, boolean or null"))

    walk(field, value, 0)
    return errors


def check_secret_text(field: str, value: Any) -> list[ValidationError]:
    """No credential in free text: no token formats, no URI credentials, no ``HF_TOKEN=...``."""
    if not isinstance(value, str):
        return []
    what = find_secret(value)
    if what is None:
        for match in _ASSIGN.finditer(value):
            if is_secret_name(match.group(1)) and not harmless_literal(match.group(2)):
                what = f"a literal value for {match.group(1)}"
                break
    if what is None:
        return []
    return [ValidationError(field, HIDDEN, f"no credential in a literal value (this looks like {what}): {_BY_REFERENCE}")]


_BY_REFERENCE = (
    "take secrets from a Secret -- in a pipeline kfp.kubernetes.use_secret_as_env on the task (then $(VAR) in args), "
    "dataset_secret/model_secret for the initializers; with build_trainjob or kfp-trainer launch an env var with "
    "valueFrom.secretKeyRef"
)


def check_args(field: str, items: list[Any]) -> list[ValidationError]:
    """Command or args items: free text, no credentials, no literal value after a secret-like flag.

    Example:
        >>> [e.field for e in check_args("args", ["--hf-token", "abc123", "--token-file", "/run/t", "--key=$(KEY)"])]
        ['args[1]']
    """
    errors: list[ValidationError] = []
    for i, item in enumerate(items):
        where = f"{field}[{i}]"
        found = check_text(where, item) or check_secret_text(where, item)
        if not found and i > 0 and isinstance(item, str) and isinstance(items[i - 1], str):
            flag = _FLAG.fullmatch(items[i - 1])
            if flag and is_secret_name(flag.group(1)) and not item.startswith("-") and not harmless_literal(item):
                found = [ValidationError(where, HIDDEN, f"no literal value after {items[i - 1]} -- {_BY_REFERENCE}")]
        errors += found
    return errors


def check_map(field: str, values: Any, *, label_values: bool) -> list[ValidationError]:
    """Labels (``label_values=True``) or annotations: key syntax, value syntax or free text, no credentials."""
    if not isinstance(values, dict):
        return [ValidationError(field, values, "a map of string keys to string values")]
    errors: list[ValidationError] = []
    for key, value in values.items():
        where = f"{field}[{key!r}]"
        prefix, _, name = key.rpartition("/") if isinstance(key, str) else ("", "", key)
        if not ok(QUALIFIED_NAME, name, 63) or (prefix and not ok(DNS_SUBDOMAIN, prefix, 253)):
            errors.append(
                ValidationError(
                    where,
                    key,
                    "a key [prefix/]name: name <= 63 characters of alphanumerics, '-', '_', '.', "
                    "starting and ending alphanumeric; prefix a DNS subdomain",
                )
            )
        if label_values:
            if not (value == "" or ok(QUALIFIED_NAME, value, 63)):
                errors.append(
                    ValidationError(
                        where,
                        value,
                        "a label value: empty or <= 63 characters of alphanumerics, '-', '_', '.', starting and ending alphanumeric",
                    )
                )
        else:
            found = check_text(where, value) or check_secret_text(where, value)
            if not found and is_secret_name(name) and not harmless_literal(value):
                found = [ValidationError(where, HIDDEN, f"no credential under a secret-like key: {_BY_REFERENCE}")]
            errors += found
    return errors


def check_dns_name(field: str, value: Any, what: str, *, label: bool = False) -> list[ValidationError]:
    """An optional object name: lower-case DNS subdomain (or label, ``label=True``)."""
    if value == "":
        return []
    if label:
        return [] if ok(DNS_LABEL, value, 63) else [ValidationError(field, value, f"a {what} name: RFC-1123 label, <= 63 characters")]
    return [] if ok(DNS_SUBDOMAIN, value, 253) else [ValidationError(field, value, f"a {what} name: lower-case DNS subdomain (RFC 1123)")]


def check_uri(field: str, uri: Any, schemes: tuple[str, ...]) -> list[ValidationError]:
    """An initializer URI: allowed scheme, no credentials, no ``..`` segments, well-formed per scheme.

    Example:
        >>> [e.allowed[:30] for e in check_uri("dataset_uri", "s3://bucket/../../etc", ("s3",))]
        ["a URI without '.' or '..' path"]
        >>> [str(e) for e in check_uri("model_uri", "s3://key:secret@bucket/m", ("s3",))]
        ["model_uri: got 's3://***@bucket/m'; expected a URI without credentials -- name a Secret holding them in model_secret"]
    """
    if uri == "":
        return []
    allowed = ", ".join(f"{s}://" for s in schemes)
    match = _URI.fullmatch(uri) if isinstance(uri, str) and len(uri) <= 2048 and not CONTROL.search(uri) else None
    if not match or match.group(1).lower() not in schemes:
        return [ValidationError(field, uri, f"a URI of at most 2048 characters without spaces, starting with {allowed}")]
    scheme, rest = match.group(1).lower(), match.group(2)
    authority = rest.split("/", 1)[0]
    if "@" in authority and (scheme != "hf" or ":" in authority.split("@", 1)[0]) or find_secret(uri):
        where = "dataset_secret" if field.startswith("dataset") else "model_secret" if field.startswith("model") else "a Secret"
        return [ValidationError(field, uri, f"a URI without credentials -- name a Secret holding them in {where}")]
    path = unquote(rest.split("?", 1)[0].split("#", 1)[0])
    if CONTROL.search(path) or any(part in ("..", ".") for part in re.split(r"[/\\]", path)):
        return [ValidationError(field, uri, "a URI without '.' or '..' path segments (they would leave the bucket, repository or folder)")]
    if scheme == "s3" and not ok(_S3_BUCKET, authority):
        return [ValidationError(field, uri, "s3://<bucket>/<prefix> with a valid bucket name")]
    if scheme == "hf":
        repo, _, revision = rest.partition("@")
        parts = repo.strip("/").split("/")
        if (
            not all(ok(_HF_PART, p) for p in parts[:2])
            or not all(ok(_HF_PART, p, 255) for p in parts[2:])  # a folder or file in the repository (the SDK's form)
            or (revision and not ok(re.compile(r"[A-Za-z0-9._/-]+"), revision, 255))
        ):
            return [ValidationError(field, uri, "hf://<org>/<name>[/<path>][@<revision>]: letters, digits, '.', '_', '-'")]
    if scheme == "file" and not rest.startswith("/"):
        return [ValidationError(field, uri, "file:///<absolute path>")]
    return []


_BYTE_RESOURCES = ("memory", "ephemeral-storage", "storage")


def whole_units_only(resource: Any) -> str:
    """What a resource counts in whole units (bytes; devices of an extended resource), or ``""`` (cpu: fractions are fine).

    Example:
        >>> whole_units_only("memory"), whole_units_only("nvidia.com/gpu"), whole_units_only("cpu")
        ('bytes', 'nvidia.com/gpu', '')
    """
    if not isinstance(resource, str):
        return ""
    if resource in _BYTE_RESOURCES or resource.startswith("hugepages-"):
        return "bytes"
    if "/" in resource and not resource.startswith(("kubernetes.io/", "requests.")):
        return resource  # an extended resource: the API server refuses fractions of one
    return ""


def check_quantity(field: str, value: Any, resource: str = "") -> list[ValidationError]:
    """A Kubernetes quantity (``'2'``, ``'500m'``, ``'16Gi'``, ``4``): finite, >= 0, within 64 bits.

    A number is read as the API server reads it (``0.1`` is ``100m``), down to ``1n``. Of
    ``resource`` (when given) no fraction of a byte or of an extended resource's device: the
    server would store 1.5 bytes of memory, and pods cannot request half a GPU.

    Example:
        >>> check_quantity("cpu", "500m"), len(check_quantity("cpu", "NaN")), len(check_quantity("memory", "9Ei"))
        ([], 1, 1)
        >>> check_quantity("cpu", 0.1, "cpu"), [e.allowed for e in check_quantity("memory", 1.5, "memory")]
        ([], ["a whole number of bytes (this is 1.5 bytes): write the unit, e.g. '1.5Gi'"])
    """
    try:
        amount = parse_quantity(value)
    except (ValueError, TypeError):
        return [ValidationError(field, value, "a Kubernetes quantity such as '2', '500m', '16Gi' (ASCII digits)")]
    if amount < 0:
        return [ValidationError(field, value, "a quantity >= 0")]
    if amount > INT64_MAX:
        return [ValidationError(field, value, f"a quantity of at most {INT64_MAX} (the API server keeps 64 bits)")]
    unit, plain = whole_units_only(resource), format(amount.normalize(), "f")
    if amount == amount.to_integral_value():
        return []
    if unit == "bytes":
        return [ValidationError(field, value, f"a whole number of bytes (this is {plain} bytes): write the unit, e.g. '{plain}Gi'")]
    if unit:
        return [ValidationError(field, value, whole_devices_text(unit))]
    if isinstance(value, float) and number_as_quantity(value) is None:
        return [ValidationError(field, value, "a multiple of 1n (0.000000001), the finest the API server keeps")]
    return []


def check_resources(field: str, resources: Any) -> list[ValidationError]:
    """A ResourceRequirements dict: limits/requests of quantities (requests <= limits), claims."""
    if not isinstance(resources, dict) or set(resources) - {"limits", "requests", "claims"}:
        return [ValidationError(field, resources, "a ResourceRequirements dict with limits and/or requests")]
    errors: list[ValidationError] = []
    for kind in ("limits", "requests"):
        amounts = resources.get(kind) or {}
        if not isinstance(amounts, dict):
            errors.append(ValidationError(f"{field}.{kind}", amounts, "a map of resource name to quantity"))
            continue
        for res, qty in amounts.items():
            prefix, _, name = res.rpartition("/") if isinstance(res, str) else ("", "", res)
            if not ok(QUALIFIED_NAME, name, 63) or (prefix and not ok(DNS_SUBDOMAIN, prefix, 253)):
                errors.append(ValidationError(f"{field}.{kind}", res, "resource names such as cpu, memory, nvidia.com/gpu"))
            elif kind == "requests" and (limits_seen := resources.get("limits")) and isinstance(limits_seen, dict) \
                    and limits_seen.get(res) == qty and whole_units_only(res) not in ("", "bytes"):
                continue  # a device fraction asked for in both sections is named once, in limits
            else:
                errors += check_quantity(f"{field}.{kind}[{res!r}]", qty, res)
    if errors:
        return errors
    limits, requests = resources.get("limits") or {}, resources.get("requests") or {}
    for res, qty in requests.items():
        if res in limits and parse_quantity(qty) > parse_quantity(limits[res]):
            errors.append(ValidationError(f"{field}.requests[{res!r}]", qty, f"at most the limit {limits[res]!r}"))
    claims = resources.get("claims")
    if claims is not None and not (
        isinstance(claims, list) and all(isinstance(c, dict) and ok(DNS_LABEL, c.get("name"), 63) for c in claims)
    ):
        errors.append(ValidationError(f"{field}.claims", claims, "a list of {name: <resource claim>}"))
    return errors


def check_local_path(field: str, value: Any, *, absolute: bool) -> list[ValidationError]:
    """A path inside a container or volume: no ``..``, absolute or relative as asked, no control characters."""
    if not isinstance(value, str) or not value or CONTROL.search(value) or len(value) > 4096:
        return [ValidationError(field, value, "an absolute path" if absolute else "a relative path")]
    if absolute != value.startswith("/") or ".." in value.split("/"):
        return [ValidationError(field, value, ("an absolute path" if absolute else "a relative path") + " without '..' segments")]
    return []
