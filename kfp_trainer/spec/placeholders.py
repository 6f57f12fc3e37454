"""Mistakes with the artifact placeholders of command, args and env. Pure: no I/O.

The ``train_job`` component fills in three placeholders in its command, args and env values:
``{dataset}`` and ``{model}`` (its input artifacts) and ``{output_model}`` (where the trainer
saves the model). Anything else in braces passes through as it is, so a typo -- ``{output_dir}``
-- reaches the trainer literally and the step "succeeds" with an empty model. Two checks:

* :func:`unknown_placeholder_errors`: a ``{name}`` that looks meant as a placeholder (it names
  data, a model or an output, or is spelled close to a placeholder) but is none, with the
  nearest placeholder suggested. Braces holding other names (``{epoch}``, an f-string's
  ``{loss}``), ``${VAR}``, ``{{ ... }}`` and multi-line text (a script) are left alone;
* :func:`unconnected_placeholder_errors`: ``{dataset}`` or ``{model}`` used while that input
  artifact is not connected.

Example:
    >>> print(unknown_placeholder_errors({"args": ["--out", "{output_dir}"]})[0])  # doctest: +NORMALIZE_WHITESPACE
    args[1]: got '{output_dir}'; expected a known placeholder -- did you mean {output_model}? {output_dir} is none,
    so it would reach the trainer as it is. The placeholders: {dataset} (the dataset input artifact), {model} (the model
    input artifact), {output_model} (where the trainer must save the model); to keep other braces, put spaces inside
    them: { output_dir }
    >>> [e.field for e in unconnected_placeholder_errors({"args": ["{dataset}"]}, connected=set())]
    ['dataset']
"""

from __future__ import annotations

import difflib
import re
from collections.abc import Collection, Iterator, Mapping
from typing import Any

from ..errors import ValidationError

#: The placeholders and what each stands for.
PLACEHOLDERS = {
    "dataset": "the dataset input artifact",
    "model": "the model input artifact",
    "output_model": "where the trainer must save the model",
}
#: Placeholders that stand for an input artifact, which must be connected.
ARTIFACT_INPUTS = ("dataset", "model")
_FIELDS = ("command", "args", "env")
_BRACED = re.compile(r"(?<![{$])\{([A-Za-z_][A-Za-z0-9_.-]*)\}(?!\})")
# Words that say a name was meant as a placeholder: data..., model..., out...
_MEANT = ("data", "model", "out")
_KNOWN_TEXT = ", ".join(f"{{{name}}} ({what})" for name, what in PLACEHOLDERS.items())


def texts(inputs: Mapping[str, Any]) -> Iterator[tuple[str, str]]:
    """``(field, text)`` for every string in command, args and env values (env by variable name).

    Example:
        >>> list(texts({"args": ["-v", 3], "env": {"OUT": "{output_model}"}}))
        [('args[0]', '-v'), ('env[OUT]', '{output_model}')]
    """
    for key in ("command", "args"):
        value = inputs.get(key)
        if isinstance(value, list):
            for i, item in enumerate(value):
                if isinstance(item, str):
                    yield f"{key}[{i}]", item
    env = inputs.get("env")
    if isinstance(env, Mapping):
        for name, value in env.items():
            if isinstance(value, str):
                yield f"env[{name}]", value
    elif isinstance(env, list):
        for i, item in enumerate(env):
            if isinstance(item, Mapping) and isinstance(item.get("value"), str):
                name = item.get("name")
                yield (f"env[{name}]" if isinstance(name, str) else f"env[{i}]"), item["value"]


def _words(name: str) -> list[str]:
    return [w for w in re.split(r"[_.-]+", name.lower()) if w]


def meant_as_placeholder(name: str) -> bool:
    """Whether ``{name}`` (not a placeholder) looks like an attempt at one.

    Example:
        >>> [meant_as_placeholder(n) for n in ("output_dir", "datset", "MODEL", "epoch", "loss", "step")]
        [True, True, True, False, False, False]
    """
    normal = "_".join(_words(name))
    if any(word.startswith(_MEANT) for word in _words(name)):
        return True
    return bool(difflib.get_close_matches(normal, PLACEHOLDERS, n=1, cutoff=0.75))


def nearest(name: str) -> str:
    """The placeholder ``{name}`` most likely meant.

    Example:
        >>> [nearest(n) for n in ("output_dir", "model_path", "data_dir", "datset", "outdir")]
        ['output_model', 'model', 'dataset', 'dataset', 'output_model']
    """
    words = _words(name)
    for prefix, placeholder in (("out", "output_model"), ("model", "model"), ("data", "dataset")):
        if any(word.startswith(prefix) for word in words):
            return placeholder
    return difflib.get_close_matches("_".join(words), PLACEHOLDERS, n=1, cutoff=0.0)[0]


def unknown_placeholder_errors(inputs: Mapping[str, Any]) -> list[ValidationError]:
    """``{name}`` in a one-line command, args or env value that looks meant as a placeholder but is none.

    Example:
        >>> print(unknown_placeholder_errors({"env": {"OUT": "{output_dir}/final"}})[0].allowed[:51])
        a known placeholder -- did you mean {output_model}?
    """
    errors = []
    for field, text in texts(inputs):
        if "\n" in text:  # a script: its braces are its own
            continue
        for name in dict.fromkeys(m.group(1) for m in _BRACED.finditer(text)):
            if name in PLACEHOLDERS or not meant_as_placeholder(name):
                continue
            errors.append(
                ValidationError(
                    field,
                    text,
                    f"a known placeholder -- did you mean {{{nearest(name)}}}? {{{name}}} is none, so it would reach the trainer "
                    f"as it is. The placeholders: {_KNOWN_TEXT}; to keep other braces, put spaces inside them: {{ {name} }}",
                )
            )
    return errors


def placeholders_in(inputs: Mapping[str, Any]) -> set[str]:
    """The placeholders that command, args and env values use.

    Example:
        >>> sorted(placeholders_in({"command": ["train", "{model}"], "env": [{"name": "OUT", "value": "{output_model}/x"}]}))
        ['model', 'output_model']
    """
    return {m.group(1) for _, text in texts(inputs) for m in _BRACED.finditer(text) if m.group(1) in PLACEHOLDERS}


def unconnected_error(name: str) -> ValidationError:
    """``{name}`` (``dataset`` or ``model``) is used but its input artifact is not connected."""
    return ValidationError(
        name,
        None,
        f"an artifact connected to the {name} input (e.g. {name}=<task>.outputs['{name}']): {{{name}}} is used in the "
        f"trainer's command, args or env, and without it has no path",
    )


def unconnected_placeholder_errors(inputs: Mapping[str, Any], *, connected: Collection[str]) -> list[ValidationError]:
    """``{dataset}`` / ``{model}`` used while that input artifact is not among ``connected``."""
    used = placeholders_in(inputs)
    return [unconnected_error(name) for name in ARTIFACT_INPUTS if name in used and name not in connected]
