"""Numbers people type (flags, env values, text inputs): ASCII digits only. Pure.

Python's ``int()`` and ``float()`` also read the digits of other scripts (``'١٢'``,
fullwidth ``'１２'``, ...), digit groups (``'1_000'``) and surrounding spaces; the Kubernetes
API server, ``kubectl`` and most programs read none of them. A number written so is refused
here, naming where it came from and the value, instead of meaning something the user did
not see.

Example:
    >>> parse_int("12", "--num-nodes"), parse_float("1.5e3", "--start-timeout")
    (12, 1500.0)
    >>> parse_int("１２", "--num-nodes")
    Traceback (most recent call last):
    ...
    kfp_trainer.errors.ValidationError: --num-nodes: got '１２'; expected a whole number written with ASCII digits 0-9
"""

from __future__ import annotations

import re

from .errors import ValidationError

_INT = re.compile(r"[+-]?[0-9]+")
# nan and inf are numbers too: the caller's range check names them
_FLOAT = re.compile(r"[+-]?(?:(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+)(?:[eE][+-]?[0-9]+)?|nan|inf|infinity)", re.IGNORECASE)


def parse_int(text: str, what: str) -> int:
    """``text`` as a whole number, or a :class:`ValidationError` naming ``what`` and the text."""
    if not isinstance(text, str) or not _INT.fullmatch(text):
        raise ValidationError(what, text, "a whole number written with ASCII digits 0-9")
    return int(text)


def parse_float(text: str, what: str) -> float:
    """``text`` as a number (``5``, ``0.5``, ``1e3``), or a :class:`ValidationError` naming ``what`` and the text."""
    if not isinstance(text, str) or not _FLOAT.fullmatch(text):
        raise ValidationError(what, text, "a number written with ASCII digits 0-9 (e.g. 600 or 1.5)")
    return float(text)


def int_in(value: object, low: int, high: int) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) from ``low`` to ``high``.

    Example:
        >>> int_in(3, 1, 5), int_in(True, 0, 1), int_in(2.0, 1, 5)
        (True, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool) and low <= value <= high
