"""Kubernetes resource quantities ("500m", "2Gi", "1e3"): parse and compare. Pure.

Only what the API server accepts parses: the whole string must match (no spaces, no
trailing newline, ASCII digits only: not ``'١٢'`` or ``'１２'``), numbers must be finite, and exponents stay small enough that a value
cannot overflow the server's 64-bit representation unnoticed.

Example:
    >>> parse_quantity("1500m") == parse_quantity("1.5")
    True
"""

from __future__ import annotations

import math
import re
from decimal import Decimal, InvalidOperation

# ASCII digits only: Python's \d (and Decimal) also take other scripts' digits, the API server does not.
_QUANTITY = re.compile(r"([+-]?(?:[0-9]+(?:\.[0-9]*)?|\.[0-9]+))((?:[KMGTPE]i)|[numkMGTPE]|[eE][+-]?[0-9]{1,3})?")
_BINARY = {"Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40, "Pi": 2**50, "Ei": 2**60}
_DECIMAL = {
    "n": Decimal("1e-9"),
    "u": Decimal("1e-6"),
    "m": Decimal("1e-3"),
    "": Decimal(1),
    "k": Decimal("1e3"),
    "M": Decimal("1e6"),
    "G": Decimal("1e9"),
    "T": Decimal("1e12"),
    "P": Decimal("1e15"),
    "E": Decimal("1e18"),
}
MAX_DIGITS = 40  # longer numbers are not quantities anyone means


def parse_quantity(value: str | int | float) -> Decimal:
    """Value of a Kubernetes quantity as a Decimal.

    Raises:
        ValueError: ``value`` is not a quantity (also: NaN, infinity, a boolean, text
            around the number, an exponent beyond 999).

    Example:
        >>> parse_quantity("2Gi")
        Decimal('2147483648')
    """
    if isinstance(value, bool):
        raise ValueError(f"not a quantity: {value!r}")
    if isinstance(value, int):
        return Decimal(value)
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError(f"not a finite quantity: {value!r}")
        return Decimal(str(value))
    match = _QUANTITY.fullmatch(value) if isinstance(value, str) and len(value) <= MAX_DIGITS else None
    if not match:
        raise ValueError(f"not a quantity: {value!r}")
    try:
        number, suffix = Decimal(match.group(1)), match.group(2) or ""
        if suffix in _BINARY:
            return number * _BINARY[suffix]
        if suffix in _DECIMAL:
            return number * _DECIMAL[suffix]
        return number.scaleb(int(suffix[1:]))
    except (InvalidOperation, ValueError, OverflowError):
        raise ValueError(f"not a quantity: {value!r}") from None


def number_as_quantity(value: int | float) -> str | None:
    """A quantity given as a JSON number, written as the API server stores it; None when finer than 1n.

    The server reads a number's JSON text as a quantity (the Trainer's webhook stores the
    TrainJob's ``0.1`` as ``"100m"``); Python's shortest ``repr`` is that text.

    Example:
        >>> [number_as_quantity(v) for v in (8, 2.0, 0.1, 1.5, 0.0001, 2.5e-8, 1e-10)]
        ['8', '2', '100m', '1500m', '100u', '25n', None]
    """
    amount = Decimal(value) if isinstance(value, int) else Decimal(repr(value))
    for suffix, exponent in (("", 0), ("m", 3), ("u", 6), ("n", 9)):
        scaled = amount.scaleb(exponent)
        if scaled == scaled.to_integral_value():
            return f"{int(scaled)}{suffix}"
    return None


def is_quantity(value: object) -> bool:
    """True when ``value`` parses as a Kubernetes quantity."""
    try:
        parse_quantity(value)  # type: ignore[arg-type]
    except ValueError:
        return False
    return True
