"""A Griffe extension for the API reference: components keep their functions; doctest examples stay code.

Each launcher component is defined as ``@dsl.component def train_job(...)`` and then re-bound as
``train_job = with_run_context(train_job)`` (the run context is filled in on each task). Read
statically, the re-binding turns the documented function into a plain attribute, which loses its
signature, the types of its inputs and the defaults. This extension puts the function back in its
place, so the reference shows what a pipeline author calls.

The docstrings' ``Example:`` sections hold doctests; read as Google style they are an admonition
of prose, in which ``m["spec"]["trainer"]`` reads as a Markdown link. As ``Examples:`` they are
code.
"""

from __future__ import annotations

import re
from typing import Any

import griffe

WRAPPERS = {"with_run_context"}
_ITEM = re.compile(r"^(\s+)(\w+):(\s)")
_EXAMPLE = re.compile(r"^(\s*)Example:\n(\s+>>>)", re.MULTILINE)


def doctest_examples(obj: griffe.Object) -> None:
    """An ``Example:`` section that opens with a doctest becomes ``Examples:``, which renders it as code."""
    if obj.docstring is not None and "Example:" in obj.docstring.value:
        obj.docstring.value = _EXAMPLE.sub(r"\1Examples:\n\2", obj.docstring.value)


def typed_outputs(func: griffe.Function) -> None:
    """Give each output named in a component's ``Returns:`` the type of its ``Output[...]`` parameter.

    A KFP component's outputs are parameters (``output_model: Output[Model]``) that its
    docstring lists under ``Returns:``; the reference shows them with those types.
    """
    if func.docstring is None:
        return
    lines, out, indent = func.docstring.value.splitlines(), [], None
    for line in lines:
        if line.strip() == "Returns:":
            indent = len(line) - len(line.lstrip()) + 4
        elif indent is not None and line.strip() and len(line) - len(line.lstrip()) < indent:
            indent = None
        match = _ITEM.match(line) if indent is not None else None
        if match and len(match.group(1)) == indent and match.group(2) in func.parameters:
            annotation = func.parameters[match.group(2)].annotation
            if annotation is not None:
                line = f"{match.group(1)}{match.group(2)} ({annotation}):{line[match.end(2) + 1:]}"
        out.append(line)
    func.docstring.value = "\n".join(out)


class ApiReference(griffe.Extension):
    """``name = with_run_context(name)`` keeps the function ``name``; doctest examples render as code."""

    def __init__(self) -> None:
        super().__init__()
        self._functions: dict[str, griffe.Function] = {}

    def on_instance(self, *, obj: griffe.Object, **kwargs: Any) -> None:
        """Doctest examples as code, in every object's docstring."""
        doctest_examples(obj)

    def on_function_instance(self, *, func: griffe.Function, **kwargs: Any) -> None:
        """Remember each function, to restore it if it is re-bound."""
        self._functions[func.path] = func

    def on_attribute_instance(self, *, attr: griffe.Attribute, **kwargs: Any) -> None:
        """Replace ``name = wrapper(name)`` with the function ``name``."""
        value = attr.value
        if not isinstance(value, griffe.ExprCall) or str(value.function) not in WRAPPERS:
            return
        if [str(a) for a in value.arguments] != [attr.name]:
            return
        func = self._functions.get(attr.path)
        if func is not None and attr.parent is not None:
            if func.docstring is not None:
                func.docstring.parent = func  # the attribute took it over; its parameters are the function's
            typed_outputs(func)
            func.labels.add("component")
            attr.parent.set_member(attr.name, func)
