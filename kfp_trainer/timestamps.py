"""Kubernetes timestamps (RFC 3339, UTC): parsed fast, and written; one home for both.

Example:
    >>> parse_timestamp(rfc3339(86401))
    (86401, 0)
"""

from __future__ import annotations

import calendar
import time

Timestamp = tuple[int, int]  # (seconds since epoch, nanoseconds)
_seconds: dict[bytes, int] = {}  # "YYYY-MM-DDTHH:MM:SS" -> seconds since the epoch


def parse_timestamp(text: str | bytes) -> Timestamp | None:
    """``2026-01-02T03:04:05.123Z`` (UTC) -> (epoch seconds, nanoseconds); None if not a timestamp.

    Runs once per relayed line: the date and time of day are parsed once per second of log.

    Example:
        >>> parse_timestamp("1970-01-02T00:00:01.5Z")
        (86401, 500000000)
    """
    raw = text.encode() if isinstance(text, str) else text
    if len(raw) < 20 or raw[-1:] != b"Z":
        return None
    whole = raw[:19]
    base = _seconds.get(whole)
    if base is None:
        base = _second(whole)
        if base is None:
            return None
    if len(raw) == 20:
        return base, 0
    fraction = raw[20:-1]
    if raw[19:20] != b"." or not (fraction.isdigit() or not fraction):
        return None
    return base, int(fraction[:9].ljust(9, b"0")) if fraction else 0


def _second(whole: bytes) -> int | None:
    """Seconds since the epoch of ``YYYY-MM-DDTHH:MM:SS`` (UTC); None when it is not that."""
    if whole[4:5] != b"-" or whole[7:8] != b"-" or whole[10:11] != b"T" or whole[13:14] != b":" or whole[16:17] != b":":
        return None
    fields = (whole[0:4], whole[5:7], whole[8:10], whole[11:13], whole[14:16], whole[17:19])
    if not all(f.isdigit() for f in fields):
        return None
    year, month, day, hour, minute, second = (int(f) for f in fields)
    if not (1 <= month <= 12 and 1 <= day <= 31 and hour < 24 and minute < 60):
        return None
    value = calendar.timegm((year, month, day, hour, minute, 0, 0, 0, 0)) + second
    if len(_seconds) > 4096:
        _seconds.clear()
    _seconds[whole] = value
    return value


KNOWN_SECONDS: dict[bytes, int] = {}  # filled by exact_second(): look here first, one lookup per line


def exact_second(whole: bytes) -> int | None:
    """Seconds since the epoch of ``YYYY-MM-DDTHH:MM:SS`` (UTC) naming a real instant; None otherwise.

    Stricter than :func:`parse_timestamp`: the day exists in its month and the second is below
    60, so two such times in one fixed-width form compare as bytes as they compare in time.
    The answer is kept in :data:`KNOWN_SECONDS`.

    Example:
        >>> exact_second(b"1970-01-02T00:00:01"), exact_second(b"2026-04-31T00:00:00")
        (86401, None)
    """
    value = _second(whole)
    if value is None or whole[17:19] >= b"60" or time.gmtime(value)[2] != int(whole[8:10]):
        return None
    if len(KNOWN_SECONDS) > 4096:
        KNOWN_SECONDS.clear()
    KNOWN_SECONDS[whole] = value
    return value


def rfc3339(epoch: float | None = None) -> str:
    """``epoch`` (default: now) as RFC 3339 in UTC, second precision (as the API's ``sinceTime`` takes it).

    Example:
        >>> rfc3339(86401.5)
        '1970-01-02T00:00:01Z'
    """
    return time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime(epoch))
