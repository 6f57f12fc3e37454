"""Python warnings of ours in a log: a user's log has none.

A warning prints as ``<file>.py:<line>: <Category>Warning: <text>``, naming the file of the
frame it is charged to: a ``torch`` warning that our ``float(tensor)`` triggers names our
file. Ours are those that name a file of the ``kfp_trainer`` package, and the notes of
``kfp.local``'s runner, which ``kfp-trainer run --local`` drives (it silences the ones that
hold for every local run; any other would be new).

Example:
    >>> ours("x/kfp_trainer/trainers/digits.py:186: UserWarning: Converting a tensor ...\\nok\\n")
    ['x/kfp_trainer/trainers/digits.py:186: UserWarning: Converting a tensor ...']
    >>> ours("/venv/lib/torchao/dtypes/__init__.py:25: DeprecationWarning: Importing ...")
    []
"""

from __future__ import annotations

import re

_WARNING = re.compile(r"^.*?(?P<file>[^\s:]+\.py):\d+: (?:[A-Z]\w*)?Warning: .*$", re.MULTILINE)
# PYTHONWARNINGS for the processes a test starts: every warning shown, each time (deprecations too).
SHOW_ALL = "default"


def ours(text: str) -> list[str]:
    """The warning lines in ``text`` that name a file of ``kfp_trainer`` or of ``kfp.local``."""
    return [m.group(0).strip() for m in _WARNING.finditer(text) if "/kfp_trainer/" in m["file"] or "/kfp/local/" in m["file"]]
